// ddp::Init (environment parsing, then ConnectBackend of group_factory.h)
// and the public ProcessGroup/Work wrappers that turn the backends'
// absl::Status into ddp::Error.
#include "ddp/process_group.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "backend.h"
#include "ddprun/rendezvous/client.h"
#include "ddprun/rendezvous/common/debug_log.h"
#include "ddprun/rendezvous/common/errors.h"
#include "ddprun/rendezvous/common/host_port.h"
#include "ddprun/rendezvous/common/inplace_layout.h"
#include "ddprun/rendezvous/common/worker_env_names.h"
#include "ddprun/rendezvous/store/c10d_store_client.h"
#include "ddprun/rendezvous/store/sdk_store_scope.h"
#include "group_factory.h"
#include "inplace_block.h"
#include "sdk_env.h"
#include "status.h"

namespace ddp {
namespace detail {

std::string OpDesc::Text() const {
  if (!payload) return op;
  std::string s = absl::StrCat(op, "(", count, " x ", DTypeName(dtype));
  if (extra && *extra) absl::StrAppend(&s, ", ", extra);
  return s + ")";
}

absl::Status CheckBuffer(const Backend& b, const char* op, const void* p, std::size_t count,
                         DType dtype, const char* name) {
  if (b.aborted()) return b.AbortedStatus(op);
  if (!IsValidDType(static_cast<int>(dtype))) {
    return absl::InvalidArgumentError(absl::StrCat(b.Fence(), op, ": invalid dtype ",
                                                   static_cast<int>(dtype),
                                                   " (f32, f16, bf16, f64, i32, i64)"));
  }
  if (p == nullptr && count > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(b.Fence(), op, ": ", name, " is a null pointer (", count, " elements)"));
  }
  return absl::OkStatus();
}

absl::Status CheckReduceOp(const Backend& b, const char* op, ReduceOp r) {
  if (!IsValidReduceOp(static_cast<int>(r))) {
    return absl::InvalidArgumentError(absl::StrCat(b.Fence(), op, ": invalid reduce op ",
                                                   static_cast<int>(r), " (sum, avg, max, min)"));
  }
  return absl::OkStatus();
}

namespace {

namespace rdzv = ddprun::rendezvous;

// How long ddp::Init waits for the store's connection before it looks for a
// refused TLS handshake (a store that is up connects in milliseconds).
constexpr auto kTlsCheckTimeout = std::chrono::seconds(2);
// How long ddp::Init tries to connect to the round's TCPStore (at most the
// group timeout): it listens before the workers start, so a refusal means
// that the launcher has gone or moved to another round.
constexpr auto kTcpStoreConnectTimeout = std::chrono::seconds(5);

constexpr const char* kHowToRun =
    "Start the trainer under the launcher, for example:\n"
    "  ddprun --nproc_per_node=2 ./trainer";

absl::Status EnvError(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("ddp::Init: ", what, "\n", kHowToRun));
}

absl::StatusOr<std::string> Required(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    return EnvError(absl::StrCat(
        name,
        " is not set: this process was not started by ddprun (it sets RANK, WORLD_SIZE and "
        "the DDPRUN_* variables for every worker)."));
  }
  return std::string(v);
}

absl::StatusOr<std::int64_t> Integer(const char* name, bool required, std::int64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    if (!required) return fallback;
    return Required(name).status();
  }
  std::int64_t out = 0;
  if (!absl::SimpleAtoi(v, &out) || out < 0) {
    return EnvError(absl::StrCat(name, "='", v, "' is not a non-negative integer."));
  }
  return out;
}

// DDPRUN_STORE_ADDR (or `name`) as host and port (a port is required, 0 is not one).
absl::StatusOr<rdzv::HostPort> StoreAddress(const std::string& text,
                                            const char* name = ddprun::kEnvStoreAddr) {
  auto hp = rdzv::ParseHostPort(text);
  if (!hp.ok()) {
    return EnvError(
        absl::StrCat(name, "='", text, "' is not host:port (", hp.status().message(), ")."));
  }
  return *hp;
}

// Gloo writes to its sockets with writev, which raises SIGPIPE when a peer
// has died: the default action would kill the worker instead of failing the
// collective with an error naming it. Ignored only if nobody chose an action
// (Python already ignores it).
void IgnoreSigpipeIfDefault() {
  struct sigaction old {};
  if (::sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL &&
      !(old.sa_flags & SA_SIGINFO)) {
    ::signal(SIGPIPE, SIG_IGN);
  }
}

// The DDP_* overrides (sdk_env.h) of options the trainer left at their
// defaults. A bad value is one line after the job's fence.
absl::StatusOr<InitOptions> ApplyEnvironmentOptions(const InitOptions& in,
                                                    const std::string& fence) {
  absl::StatusOr<ddp::detail::SdkEnv> env = ddp::detail::ReadSdkEnv();
  if (!env.ok()) return absl::InvalidArgumentError(absl::StrCat(fence, env.status().message()));
  InitOptions options = in;
  if (env->timeout && in.timeout == kDefaultTimeout) options.timeout = *env->timeout;
  if (env->backend && in.backend == ddp::Backend::kAuto) options.backend = *env->backend;
  if (env->shared_memory == false) options.shared_memory = false;  // 1 keeps the trainer's
  return options;
}

// The first store call checks the address, the job and the token; its error
// says which of them is wrong.
absl::Status Hello(rdzv::Store& store, const WorkerInfo& info, const std::string& prefix) {
  absl::Status hello = store.Set(absl::StrCat(prefix, "hello/", info.rank), info.host);
  if (hello.ok()) return hello;
  const std::string fence = FenceOf(info);
  if (hello.code() == absl::StatusCode::kPermissionDenied ||
      hello.code() == absl::StatusCode::kUnauthenticated) {
    return absl::PermissionDeniedError(absl::StrCat(
        fence, "the store at ", info.store_addr, " refused job '", info.job_id, "' with this ",
        ddprun::kEnvToken, " (wrong token or job id): ", hello.message()));
  }
  if (hello.code() == absl::StatusCode::kFailedPrecondition) {
    return absl::FailedPreconditionError(absl::StrCat(
        fence, "the store refused round ", info.round,
        " (a stale round: the job was restarted without this worker): ", hello.message()));
  }
  return absl::Status(hello.code(), absl::StrCat(fence, "cannot use the store at ", info.store_addr,
                                                 ": ", hello.message()));
}

// The job's store when the launcher hosts the rendezvous of a single-node job
// (DDPRUN_TCPSTORE_ADDR): the round's TCPStore, every key under the job's
// scope (sdk_store_scope.h), which must hold the job key the agent wrote
// before it spawned this worker. The TCPStore has no token check of its own:
// a wrong token only finds an empty scope, so that is where it is refused.
absl::StatusOr<std::shared_ptr<rdzv::Store>> ConnectTcpStore(const WorkerInfo& info,
                                                             const std::string& text,
                                                             const std::string& token,
                                                             Duration timeout) {
  DDPRUN_ASSIGN_OR_RETURN(const rdzv::HostPort addr, StoreAddress(text, ddprun::kEnvTcpStoreAddr));
  const std::string fence = FenceOf(info);
  auto client = rdzv::C10dStoreClient::Connect(
      addr.host, addr.port, std::min<rdzv::Duration>(timeout, kTcpStoreConnectTimeout),
      "the launcher that started this worker has exited or ended the round; start the worker "
      "under ddprun, which starts every round's workers itself");
  if (!client.ok()) {
    return absl::UnavailableError(absl::StrCat(fence, "cannot reach the job's store (",
                                               ddprun::kEnvTcpStoreAddr, "=", text,
                                               "): ", client.status().message()));
  }
  auto store = std::make_shared<rdzv::PrefixStore>(
      rdzv::SdkStoreScope(token, info.round), std::shared_ptr<rdzv::Store>(*std::move(client)));
  // The key is there before the worker starts: no wait.
  absl::StatusOr<std::string> job = store->Get(rdzv::kSdkStoreJobKey, Duration::zero());
  if (job.ok() && *job == info.job_id) return store;
  if (job.ok() || absl::IsDeadlineExceeded(job.status())) {
    return absl::PermissionDeniedError(absl::StrCat(
        fence, "the store at ", text, " holds no job '", info.job_id, "' round ", info.round,
        " for this ", ddprun::kEnvToken,
        " (a wrong token or job id, or a round that has "
        "ended): run the worker under ddprun and leave its DDPRUN_* variables as they are"));
  }
  return absl::Status(job.status().code(), absl::StrCat(fence, "cannot use the store at ", text,
                                                        ": ", job.status().message()));
}

}  // namespace

std::string FenceOf(const WorkerInfo& info) {
  return ddprun::rendezvous::Fence(info.job_id, info.round, info.rank);
}

absl::StatusOr<WorkerInfo> ParseEnvironment() {
  WorkerInfo info;
  // The DDPRUN_* variables first: a missing one means "not under ddprun"
  // even when torchrun's RANK/WORLD_SIZE are there.
  DDPRUN_ASSIGN_OR_RETURN(info.store_addr, Required(ddprun::kEnvStoreAddr));
  DDPRUN_ASSIGN_OR_RETURN(info.job_id, Required(ddprun::kEnvJobId));
  DDPRUN_RETURN_IF_ERROR(Required(ddprun::kEnvToken));
  DDPRUN_ASSIGN_OR_RETURN(info.round, Integer(ddprun::kEnvRound, true, 0));
  DDPRUN_ASSIGN_OR_RETURN(const std::int64_t rank, Integer("RANK", true, 0));
  DDPRUN_ASSIGN_OR_RETURN(const std::int64_t world, Integer("WORLD_SIZE", true, 1));
  DDPRUN_ASSIGN_OR_RETURN(const std::int64_t local_rank, Integer("LOCAL_RANK", false, rank));
  DDPRUN_ASSIGN_OR_RETURN(const std::int64_t local_world,
                          Integer("LOCAL_WORLD_SIZE", false, world));
  if (world < 1 || rank >= world) {
    return EnvError(absl::StrCat("RANK=", rank, " is not below WORLD_SIZE=", world, "."));
  }
  info.rank = static_cast<int>(rank);
  info.world_size = static_cast<int>(world);
  info.local_rank = static_cast<int>(local_rank);
  info.local_world_size = static_cast<int>(local_world);
  const char* host = std::getenv(ddprun::kEnvHost);
  info.host = (host && *host) ? host : "127.0.0.1";
  DDPRUN_RETURN_IF_ERROR(StoreAddress(info.store_addr));
  return info;
}

WorkerInfo LocalWorkerInfo(int rank, int world_size) {
  WorkerInfo info;
  info.rank = rank;
  info.world_size = world_size;
  info.local_rank = rank;
  info.local_world_size = world_size;
  info.job_id = "local";
  info.round = 0;
  info.host = "127.0.0.1";
  info.store_addr = "(in-process store)";
  return info;
}

absl::StatusOr<std::shared_ptr<Backend>> ConnectBackend(const WorkerInfo& info,
                                                        const InitOptions& options,
                                                        std::shared_ptr<rdzv::Store> store,
                                                        const std::string& key_prefix) {
  const std::string fence = FenceOf(info);
  ddp::Backend chosen = options.backend;
  if (chosen == ddp::Backend::kAuto) {
    chosen =
        (NcclCompiledIn() && CudaDeviceCount() > 0) ? ddp::Backend::kNccl : ddp::Backend::kGloo;
  }
  DDPRUN_DEBUG_LOG(kSdk) << fence << "group " << key_prefix << ": bootstrapping "
                         << BackendName(chosen) << " over " << info.world_size
                         << " rank(s), shared memory " << (options.shared_memory ? "on" : "off")
                         << ", timeout " << options.timeout.count() << " ms";
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<std::shared_ptr<Backend>> backend;
  if (chosen == ddp::Backend::kNccl) {
    if (!NcclCompiledIn()) {
      return absl::UnimplementedError(
          absl::StrCat(fence,
                       "backend nccl requested, but this build has no CUDA/NCCL "
                       "(configure with -DDDPRUN_WITH_CUDA=ON)"));
    }
    backend = CreateNcclBackend(info, options, std::move(store), key_prefix);
  } else {
    backend = CreateGlooBackend(info, options, std::move(store), key_prefix);
  }
  DDPRUN_DEBUG_LOG(kSdk)
      << fence << "group " << key_prefix << ": "
      << (backend.ok() ? "connected" : "bootstrap failed") << " after "
      << std::chrono::duration_cast<Duration>(std::chrono::steady_clock::now() - t0).count()
      << " ms" << (backend.ok() ? "" : ": ") << backend.status().message();
  return backend;
}

absl::StatusOr<std::chrono::duration<double>> ReadyTimeout() {
  namespace layout = ddprun::inplace_layout;
  const char* v = std::getenv(layout::kEnvReadyTimeout);
  if (v == nullptr || *v == '\0') {
    return std::chrono::duration<double>(layout::kDefaultReadyTimeoutSeconds);
  }
  double s = 0;
  if (!absl::SimpleAtod(v, &s) || !(s > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        layout::kEnvReadyTimeout, "='", v, "' is not a number of seconds > 0; write seconds, or ",
        "unset it for the default, ", layout::kDefaultReadyTimeoutSeconds));
  }
  return std::chrono::duration<double>(s);
}

absl::StatusOr<std::shared_ptr<Backend>> InitBackend(const InitOptions& in) {
  DDPRUN_ASSIGN_OR_RETURN(const WorkerInfo info, ParseEnvironment());
  IgnoreSigpipeIfDefault();
  const std::string fence = FenceOf(info);
  DDPRUN_ASSIGN_OR_RETURN(const InitOptions options, ApplyEnvironmentOptions(in, fence));
  DDPRUN_DEBUG_LOG(kSdk) << fence << "init: rank " << info.rank << " of " << info.world_size
                         << " (local " << info.local_rank << " of " << info.local_world_size
                         << "), store " << info.store_addr << ", host " << info.host << ", backend "
                         << BackendName(options.backend);

  DDPRUN_ASSIGN_OR_RETURN(const rdzv::HostPort addr, StoreAddress(info.store_addr));
  const char* token = std::getenv(ddprun::kEnvToken);
  // Every group of this process gets its own key space within the round;
  // every rank creates its groups in the same order. Counted per round: a
  // survivor re-forming in place (Reconfigure) and a replacement process
  // starting fresh both name the new round's first group pg0.
  static std::mutex group_mu;
  static std::int64_t counted_round = -1;
  static int groups_in_round = 0;
  auto next_prefix = [&info] {
    std::lock_guard<std::mutex> lock(group_mu);
    if (info.round != counted_round) {
      counted_round = info.round;
      groups_in_round = 0;
    }
    return absl::StrCat("ddp/pg", groups_in_round++, "/");
  };

  // Which store: the launcher says (docs/sdk.md, "Which store").
  if (const char* tcp = std::getenv(ddprun::kEnvTcpStoreAddr); tcp != nullptr && *tcp) {
    DDPRUN_ASSIGN_OR_RETURN(std::shared_ptr<rdzv::Store> store,
                            ConnectTcpStore(info, tcp, token ? token : "", options.timeout));
    const std::string prefix = next_prefix();
    DDPRUN_RETURN_IF_ERROR(Hello(*store, info, prefix));
    return ConnectBackend(info, options, std::move(store), prefix);
  }
  // TLS as the agent talks it: the files it passed in DDPRUN_TLS_*.
  rdzv::TlsOptions tls_files;
  auto env_or_empty = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v ? v : "");
  };
  tls_files.ca_file = env_or_empty(ddprun::kEnvTlsCa);
  tls_files.cert_file = env_or_empty(ddprun::kEnvTlsCert);
  tls_files.key_file = env_or_empty(ddprun::kEnvTlsKey);
  tls_files.names = {ddprun::kEnvTlsCa, ddprun::kEnvTlsCert, ddprun::kEnvTlsKey, ""};
  absl::StatusOr<rdzv::TlsConfig> tls = rdzv::LoadClientTls(tls_files);
  if (!tls.ok()) return absl::InvalidArgumentError(absl::StrCat(fence, tls.status().message()));
  // Replicas (docs/ha.md): the replica that served this process's last
  // group (else DDPRUN_STORE_ADDR) first, then the others in the agent's
  // order; the store moves on when one stops serving.
  static std::mutex preferred_mu;
  static std::optional<rdzv::HostPort> preferred;
  std::vector<rdzv::HostPort> replicas{addr};
  {
    std::lock_guard<std::mutex> lock(preferred_mu);
    if (preferred) replicas[0] = *preferred;
  }
  auto listed = [&replicas](const rdzv::HostPort& hp) {
    return std::any_of(replicas.begin(), replicas.end(), [&](const rdzv::HostPort& r) {
      return r.host == hp.host && r.port == hp.port;
    });
  };
  if (!listed(addr)) replicas.push_back(addr);
  if (const char* list = std::getenv(ddprun::kEnvStoreReplicas); list != nullptr && *list) {
    auto parsed = rdzv::ParseHostPortList(list);
    if (!parsed.ok()) {
      return EnvError(absl::StrCat(ddprun::kEnvStoreReplicas, "='", list,
                                   "' is not host:port,host:port (", parsed.status().message(),
                                   ")."));
    }
    for (const rdzv::HostPort& hp : *parsed) {
      if (!listed(hp)) replicas.push_back(hp);
    }
  }
  auto store = std::make_shared<rdzv::GrpcStore>(
      replicas, rdzv::StoreScope{info.job_id, token ? token : "", info.round}, *tls);
  // A refused handshake fails now, naming the fix, instead of at the first
  // call's deadline; a store that is merely slow to answer is waited for.
  if (absl::Status st = store->CheckTls(kTlsCheckTimeout); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat(fence, st.message()));
  }

  const std::string prefix = next_prefix();
  DDPRUN_RETURN_IF_ERROR(Hello(*store, info, prefix));
  if (replicas.size() > 1) {
    std::lock_guard<std::mutex> lock(preferred_mu);
    preferred = store->endpoint();
  }
  return ConnectBackend(info, options, std::move(store), prefix);
}

}  // namespace detail

// ---- Work ----

void Work::Wait() {
  if (!state_) return;
  detail::ThrowIfError(state_->WaitDefault());
}

void Work::Wait(Duration timeout) {
  if (!state_) return;
  detail::ThrowIfError(state_->Wait(timeout));
}

bool Work::IsCompleted() const {
  if (!state_) return true;
  return detail::ValueOrThrow(state_->IsCompleted());
}

void Work::Synchronize(void* stream) {
  if (!state_) return;
  detail::ThrowIfError(state_->Synchronize(stream));
}

// ---- ProcessGroup ----

ProcessGroup::ProcessGroup(std::shared_ptr<detail::Backend> backend)
    : backend_(std::move(backend)) {}
ProcessGroup::~ProcessGroup() = default;

int ProcessGroup::rank() const { return backend_->rank(); }
int ProcessGroup::size() const { return backend_->size(); }
Backend ProcessGroup::backend() const { return backend_->kind(); }
Duration ProcessGroup::timeout() const { return backend_->timeout(); }
const WorkerInfo& ProcessGroup::info() const { return backend_->info(); }
std::string ProcessGroup::Fence() const { return backend_->Fence(); }

namespace {
Work Wrap(absl::StatusOr<detail::WorkPtr> w) { return Work(detail::ValueOrThrow(std::move(w))); }
}  // namespace

Work ProcessGroup::Allreduce(void* data, std::size_t count, DType dtype, ReduceOp op) {
  return Wrap(backend_->Allreduce(data, count, dtype, op));
}
Work ProcessGroup::Broadcast(void* data, std::size_t count, DType dtype, int root) {
  return Wrap(backend_->Broadcast(data, count, dtype, root));
}
Work ProcessGroup::Allgather(const void* in, void* out, std::size_t count, DType dtype) {
  return Wrap(backend_->Allgather(in, out, count, dtype));
}
Work ProcessGroup::ReduceScatter(const void* in, void* out, std::size_t count, DType dtype,
                                 ReduceOp op) {
  return Wrap(backend_->ReduceScatter(in, out, count, dtype, op));
}
Work ProcessGroup::Barrier() { return Wrap(backend_->Barrier()); }
void ProcessGroup::SetStream(void* stream) { backend_->SetStream(stream); }
void* ProcessGroup::AllocMemory(std::size_t bytes) {
  return detail::ValueOrThrow(backend_->Alloc(bytes));
}
void ProcessGroup::FreeMemory(void* p) {
  if (p != nullptr) backend_->Free(p);
}
void ProcessGroup::Abort(const std::string& reason) {
  backend_->Fail(reason.empty() ? "aborted by the trainer" : reason);
}
bool ProcessGroup::aborted() const { return backend_->aborted(); }

std::shared_ptr<ProcessGroup> Init(const InitOptions& options) {
  // Under --restart_policy=inplace: the group belongs to the generation the
  // process was started in; the process tells the agent it can re-form.
  detail::InplaceBlock* block = detail::ValueOrThrow(detail::InplaceBlock::Get());
  const std::uint64_t formed = block ? block->generation() : 0;
  auto backend = detail::ValueOrThrow(detail::InitBackend(options));
  if (block) {
    backend->WatchBreaks(block->generation_word(), formed);
    block->Register();
  }
  return std::make_shared<ProcessGroup>(std::move(backend));
}

std::shared_ptr<ProcessGroup> Reconfigure(std::shared_ptr<ProcessGroup> broken,
                                          const InitOptions& options) {
  const std::string fence = broken ? broken->Fence() : std::string();
  detail::InplaceBlock* block = detail::ValueOrThrow(detail::InplaceBlock::Get());
  if (block == nullptr) {
    throw StateError(fence + "ddp::Reconfigure: this worker has no in-place control block (" +
                     ddprun::inplace_layout::kEnvFd +
                     " is unset): run the job with --restart_policy=inplace to re-form in "
                     "this process; otherwise exit, and ddprun restarts the job's workers");
  }
  // Tear the old group down first: its collectives fail, its connections,
  // segments and communicator go (what a Reducer still holds goes with it).
  if (broken) {
    detail::Backend& old = broken->backend_impl();
    old.Fail("the group is being re-formed (ddp::Reconfigure)");
    old.Teardown();
    broken.reset();
  }
  const std::chrono::duration<double> ready_timeout = detail::ValueOrThrow(detail::ReadyTimeout());
  const auto wait_start = std::chrono::steady_clock::now();
  auto round = block->WaitReady(
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(ready_timeout));
  if (!round.ok()) {
    detail::ThrowIfError(detail::WithMessage(
        round.status(), fence + "ddp::Reconfigure: " + std::string(round.status().message())));
  }
  // The new round's worker environment, then the path of ddp::Init.
  const auto ready = std::chrono::steady_clock::now();
  for (const auto& [key, value] : round->env) ::setenv(key.c_str(), value.c_str(), 1);
  auto backend = detail::ValueOrThrow(detail::InitBackend(options));
  backend->WatchBreaks(block->generation_word(), round->generation);
  block->Ack(round->generation);
  // bench/sdk_recovery.sh reads this line: the wait for the agent's round,
  // and the group's forming once the round (and so the replacement) is ready.
  auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
  DDPRUN_DEBUG_LOG(kSdk) << backend->Fence() << "re-formed in place into generation "
                         << round->generation << " (round " << round->round
                         << "): waited_ms=" << ms(ready - wait_start)
                         << " formed_ms=" << ms(std::chrono::steady_clock::now() - ready);
  return std::make_shared<ProcessGroup>(std::move(backend));
}

WorkerInfo ReadWorkerEnvironment() { return detail::ValueOrThrow(detail::ParseEnvironment()); }

bool CudaAvailable() { return detail::NcclCompiledIn() && detail::CudaDeviceCount() > 0; }

}  // namespace ddp
