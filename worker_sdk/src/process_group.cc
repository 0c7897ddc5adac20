// ddp::Init, environment parsing, and the public ProcessGroup/Work wrappers
// that turn the backends' absl::Status into ddp::Error.
#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "backend.h"
#include "ddp/process_group.h"
#include "ddprun/rendezvous/client.h"
#include "status.h"

namespace ddp {
namespace detail {

std::string DescribeOp(const char* op, std::size_t count, DType dtype, const char* extra) {
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
                                                   static_cast<int>(r),
                                                   " (sum, avg, max, min)"));
  }
  return absl::OkStatus();
}

namespace {

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
        name, " is not set: this process was not started by ddprun (it sets RANK, WORLD_SIZE and "
              "the DDPRUN_* variables for every worker)."));
  }
  return std::string(v);
}

absl::StatusOr<std::int64_t> Integer(const char* name, bool required, std::int64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    if (!required) return fallback;
    auto s = Required(name);
    return s.status();
  }
  std::int64_t out = 0;
  if (!absl::SimpleAtoi(v, &out) || out < 0) {
    return EnvError(absl::StrCat(name, "='", v, "' is not a non-negative integer."));
  }
  return out;
}

}  // namespace

absl::StatusOr<WorkerInfo> ParseEnvironment() {
  WorkerInfo info;
  // The DDPRUN_* variables first: a missing one means "not under ddprun"
  // even when torchrun's RANK/WORLD_SIZE are there.
  auto addr = Required("DDPRUN_STORE_ADDR");
  if (!addr.ok()) return addr.status();
  info.store_addr = *addr;
  auto job = Required("DDPRUN_JOB_ID");
  if (!job.ok()) return job.status();
  info.job_id = *job;
  auto token = Required("DDPRUN_TOKEN");
  if (!token.ok()) return token.status();
  auto round = Integer("DDPRUN_ROUND", true, 0);
  if (!round.ok()) return round.status();
  info.round = *round;
  auto rank = Integer("RANK", true, 0);
  if (!rank.ok()) return rank.status();
  auto world = Integer("WORLD_SIZE", true, 1);
  if (!world.ok()) return world.status();
  auto local_rank = Integer("LOCAL_RANK", false, *rank);
  if (!local_rank.ok()) return local_rank.status();
  auto local_world = Integer("LOCAL_WORLD_SIZE", false, *world);
  if (!local_world.ok()) return local_world.status();
  if (*world < 1 || *rank >= *world) {
    return EnvError(absl::StrCat("RANK=", *rank, " is not below WORLD_SIZE=", *world, "."));
  }
  info.rank = static_cast<int>(*rank);
  info.world_size = static_cast<int>(*world);
  info.local_rank = static_cast<int>(*local_rank);
  info.local_world_size = static_cast<int>(*local_world);
  const char* host = std::getenv("DDPRUN_HOST");
  info.host = (host && *host) ? host : "127.0.0.1";
  std::string h;
  int port = 0;
  if (!ddprun::rendezvous::ParseEndpoint(info.store_addr, 0, &h, &port).ok() || port <= 0) {
    return EnvError(absl::StrCat("DDPRUN_STORE_ADDR='", info.store_addr,
                                 "' is not host:port."));
  }
  return info;
}

// Gloo writes to its sockets with writev, which raises SIGPIPE when a peer
// has died: the default action would kill the worker instead of failing the
// collective with an error naming it. Ignored only if nobody chose an action
// (Python already ignores it).
static void IgnoreSigpipeIfDefault() {
  struct sigaction old {};
  if (::sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL &&
      !(old.sa_flags & SA_SIGINFO)) {
    ::signal(SIGPIPE, SIG_IGN);
  }
}

absl::StatusOr<std::shared_ptr<Backend>> InitBackend(const InitOptions& in) {
  auto info_or = ParseEnvironment();
  if (!info_or.ok()) return info_or.status();
  IgnoreSigpipeIfDefault();
  WorkerInfo info = *info_or;
  InitOptions options = in;
  const std::string fence = absl::StrCat("[job ", info.job_id, " round ", info.round, " rank ",
                                         info.rank, "] ");
  if (const char* t = std::getenv("DDP_TIMEOUT_SEC"); t && *t && in.timeout == kDefaultTimeout) {
    double sec = 0;
    if (!absl::SimpleAtod(t, &sec) || sec <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(fence, "DDP_TIMEOUT_SEC='", t, "' is not a positive number of seconds"));
    }
    options.timeout = Duration(static_cast<std::int64_t>(sec * 1000));
  }
  if (const char* b = std::getenv("DDP_BACKEND"); b && *b && in.backend == ddp::Backend::kAuto) {
    const std::string s = b;
    if (s == "gloo") options.backend = ddp::Backend::kGloo;
    else if (s == "nccl") options.backend = ddp::Backend::kNccl;
    else if (s != "auto") {
      return absl::InvalidArgumentError(
          absl::StrCat(fence, "DDP_BACKEND='", s, "' is not one of auto, gloo, nccl"));
    }
  }

  if (const char* m = std::getenv("DDP_SHM"); m && *m) {
    const std::string s = m;
    if (s == "0") options.shared_memory = false;
    else if (s != "1") {
      return absl::InvalidArgumentError(
          absl::StrCat(fence, "DDP_SHM='", s, "' is not 0 (TCP only) or 1 (shared memory)"));
    }
  }

  std::string host;
  int port = 0;
  DDP_RETURN_IF_ERROR(ddprun::rendezvous::ParseEndpoint(info.store_addr, 0, &host, &port));
  const char* token = std::getenv("DDPRUN_TOKEN");
  auto store = std::make_shared<ddprun::rendezvous::GrpcStore>(
      host, port, ddprun::rendezvous::StoreScope{info.job_id, token ? token : "", info.round});

  // Every group of this process gets its own key space within the round;
  // every rank creates its groups in the same order.
  static std::atomic<int> next_group{0};
  const std::string prefix = absl::StrCat("ddp/pg", next_group++, "/");

  // The first store call checks the address, the job and the token.
  absl::Status hello = store->Set(absl::StrCat(prefix, "hello/", info.rank), info.host);
  if (!hello.ok()) {
    if (hello.code() == absl::StatusCode::kPermissionDenied ||
        hello.code() == absl::StatusCode::kUnauthenticated) {
      return absl::PermissionDeniedError(absl::StrCat(
          fence, "the store at ", info.store_addr, " refused job '", info.job_id,
          "' with this DDPRUN_TOKEN (wrong token or job id): ", hello.message()));
    }
    if (hello.code() == absl::StatusCode::kFailedPrecondition) {
      return absl::FailedPreconditionError(absl::StrCat(
          fence, "the store refused round ", info.round,
          " (a stale round: the job was restarted without this worker): ", hello.message()));
    }
    return absl::Status(hello.code(), absl::StrCat(fence, "cannot use the store at ",
                                                   info.store_addr, ": ", hello.message()));
  }

  ddp::Backend chosen = options.backend;
  if (chosen == ddp::Backend::kAuto) {
    chosen = (NcclCompiledIn() && CudaDeviceCount() > 0) ? ddp::Backend::kNccl
                                                         : ddp::Backend::kGloo;
  }
  if (chosen == ddp::Backend::kNccl) {
    if (!NcclCompiledIn()) {
      return absl::UnimplementedError(
          absl::StrCat(fence, "backend nccl requested, but this build has no CUDA/NCCL "
                              "(configure with -DDDPRUN_WITH_CUDA=ON)"));
    }
    return CreateNcclBackend(info, options, store, prefix);
  }
  return CreateGlooBackend(info, options, store, prefix);
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
void ProcessGroup::Abort(const std::string& reason) {
  backend_->Fail(reason.empty() ? "aborted by the trainer" : reason);
}
bool ProcessGroup::aborted() const { return backend_->aborted(); }

std::shared_ptr<ProcessGroup> Init(const InitOptions& options) {
  auto backend = detail::ValueOrThrow(detail::InitBackend(options));
  return std::make_shared<ProcessGroup>(std::move(backend));
}

WorkerInfo ReadWorkerEnvironment() { return detail::ValueOrThrow(detail::ParseEnvironment()); }

bool CudaAvailable() { return detail::NcclCompiledIn() && detail::CudaDeviceCount() > 0; }

}  // namespace ddp
