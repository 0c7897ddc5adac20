// `ddprun bench --scaling` across nodes: the first job of every node and each
// node's loop over the world sizes (protocol: bench_scaling_nodes.h).
#include "bench_scaling_nodes.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "bench_job.h"
#include "ddprun/launcher/bench/bench_command.h"
#include "ddprun/rendezvous/common/exit_codes.h"
#include "ddprun/rendezvous/common/host_port.h"
#include "ddprun/rendezvous/common/job_id.h"
#include "ddprun/rendezvous/common/worker_env_names.h"
#include "ddprun/rendezvous/store/c10d_store_client.h"

namespace ddprun::launcher {
namespace bench {
namespace {

namespace fs = std::filesystem;
using rendezvous::Duration;
using SteadyClock = std::chrono::steady_clock;

constexpr const char* kKeyRoot = "ddprun-bench-scaling/";
// Deadlines. A node that is not in a world size waits for node 0's verdict at
// most: the join timeout + (1 checked + warm-up + timed steps) x (compute +
// kStepSlack) + the grace period + kSizeSlack. Node 0 waits for the other
// participants' exit codes at most the grace period + kSizeSlack after its own
// part ended (they end together, up to their agents' shutdown).
constexpr double kStepSlackS = 10;
constexpr double kSizeSlackS = 60;
constexpr double kConnectTimeoutS = 30;
// Longer than the agent's re-attach window (30 s) after a lost rendezvous.
constexpr int kAwaitStopS = 60;

// "<prefix>.<id>", cut to the job-id limit.
std::string DerivedJobId(const std::string& prefix, const std::string& id,
                         const std::string& suffix = "") {
  std::string out = absl::StrCat(prefix, id);
  const std::size_t room = rendezvous::kMaxJobIdBytes - suffix.size();
  if (out.size() > room) out.resize(room);
  return out + suffix;
}

std::string SelfExe() {
  std::error_code ec;
  return fs::read_symlink("/proc/self/exe", ec).string();
}

const std::string* Find(const Env& env, const char* key) {
  auto it = env.find(key);
  return it == env.end() ? nullptr : &it->second;
}

// A stop signal the agent sent while this process waits outside an agent
// (signals are blocked: BlockAgentSignals): 0 when none is pending.
int PendingStopSignal() {
  sigset_t pending;
  if (::sigpending(&pending) != 0) return 0;
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGQUIT})
    if (::sigismember(&pending, sig) == 1) return sig;
  return 0;
}

// A TCP port free on every interface now (bound, read, closed), or -1.
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

// Why a wait ended without the key.
enum class WaitEnd { kOk, kTimeout, kSignal, kStoreLost };

struct Waited {
  WaitEnd end = WaitEnd::kOk;
  std::string value;
  int signal = 0;
  std::string error;
};

// Waits for `key` up to `timeout`, in slices, so that a stop signal from the
// agent ends the wait within a second.
Waited WaitKey(rendezvous::Store& store, const std::string& key, double timeout_s) {
  const auto deadline = SteadyClock::now() + std::chrono::duration_cast<SteadyClock::duration>(
                                                 std::chrono::duration<double>(timeout_s));
  Waited w;
  while (true) {
    if (const int sig = PendingStopSignal()) {
      w.end = WaitEnd::kSignal;
      w.signal = sig;
      return w;
    }
    const auto left = deadline - SteadyClock::now();
    if (left <= SteadyClock::duration::zero()) {
      w.end = WaitEnd::kTimeout;
      return w;
    }
    const Duration slice = std::min<Duration>(
        std::chrono::duration_cast<Duration>(left) + Duration(1), std::chrono::seconds(1));
    absl::StatusOr<std::string> v = store.Get(key, slice);
    if (v.ok()) {
      w.value = *std::move(v);
      return w;
    }
    if (!absl::IsDeadlineExceeded(v.status())) {
      w.end = WaitEnd::kStoreLost;
      w.error = std::string(v.status().message());
      return w;
    }
  }
}

// One node's loop over the world sizes.
class NodeRun {
 public:
  NodeRun(const Env& env, std::ostream& out, std::ostream& err) : env_(env), out_(out), err_(err) {}

  int Run(const HostFacts& host) {
    const std::string* spec_text = Find(env_, kEnvBenchScalingSpec);
    const std::string* result = Find(env_, kEnvBenchResult);
    const std::string* master_addr = Find(env_, "MASTER_ADDR");
    const std::string* master_port = Find(env_, "MASTER_PORT");
    const std::string* group_rank = Find(env_, "GROUP_RANK");
    const std::string* group_size = Find(env_, "GROUP_WORLD_SIZE");
    const Json spec = spec_text ? Json::parse(*spec_text, nullptr, false) : Json();
    int port = 0;
    if (!spec_text || !result || !master_addr || !master_port || !group_rank || !group_size ||
        spec.is_discarded() || !spec.is_object() || !absl::SimpleAtoi(*group_rank, &rank_) ||
        !absl::SimpleAtoi(*group_size, &nodes_) || !absl::SimpleAtoi(*master_port, &port)) {
      err_ << "ddprun " << kBenchScalingNodeSubcommand
           << ": not started by `ddprun bench --scaling`; run `ddprun bench --scaling "
              "--nnodes=N ...` on every node instead"
           << std::endl;
      return kExitUsage;
    }
    result_path_ = *result;
    master_addr_ = *master_addr;
    const std::string worker = spec.value("worker", "");
    const auto launcher_args = spec.value("launcher_args", std::vector<std::string>{});
    const auto worker_args = spec.value("worker_args", std::vector<std::string>{});
    job_id_ = spec.value("job_id", "none");
    auto options = ParseBenchArgs(worker_args);
    // The launcher parsed the same flags before the first job: a failure here
    // means the node's environment changed under it.
    std::ostringstream quiet;
    ParsedJob base = ParseJob(launcher_args, worker, worker_args, env_, host, quiet, quiet);
    if (!options.ok() || base.exit_code >= 0) {
      return Finish(
          kExitUsage,
          absl::StrCat("ddprun bench --scaling: node ", rank_,
                       " cannot parse the job's flags again: ",
                       absl::StrReplaceAll(
                           options.ok() ? quiet.str() : std::string(options.status().message()),
                           {{"\n", " "}})));
    }
    bench_ = *std::move(options);
    base_ = std::move(base.options);
    if (!dir_.ok()) {
      return Finish(
          kExitUsage,
          absl::StrCat("ddprun bench: node ", rank_, " cannot create a directory in ",
                       fs::temp_directory_path().string(), "; set TMPDIR to a writable directory"));
    }
    auto store = rendezvous::C10dStoreClient::Connect(master_addr_, port, kConnectTimeoutS);
    if (!store.ok()) {
      return Finish(
          kExitRendezvousError,
          absl::StrCat("ddprun bench --scaling: node ", rank_, " cannot reach node 0's store at ",
                       rendezvous::FormatHostPort(master_addr_, port), " (",
                       store.status().message(), "); open that TCP port from this node to node 0"));
    }
    store_ = *std::move(store);

    const std::vector<int> worlds = ScalingWorldsAcrossNodes(base_.nproc_per_node, nodes_);
    for (std::size_t i = 0; i < worlds.size(); ++i) {
      if (const std::optional<int> end = RunSize(static_cast<int>(i), worlds[i])) return *end;
    }
    if (rank_ == 0 && bench_.json) out_ << FormatScalingJson(backend_, bench_, rows_) << std::flush;
    return Finish(kExitSuccess, "");
  }

 private:
  // Writes this node's verdict for the launcher (one line on stderr when it
  // is not success) and returns the node worker's own exit status: 0, so that
  // the first job ends normally on every node, unless a stop signal came.
  int Finish(int code, const std::string& line) {
    if (!line.empty()) err_ << line << std::endl;
    std::ofstream f(result_path_, std::ios::trunc);
    f << Json{{"exit_code", code}}.dump();
    f.close();
    return f ? kExitSuccess : code;
  }

  // The job of world size `w` as this node's agent runs it.
  agent::AgentOptions SizeJob(int w, int job_nodes, int port) const {
    agent::AgentOptions o = base_;
    o.mode = agent::RendezvousMode::kStatic;
    o.min_nodes = o.max_nodes = job_nodes;
    o.node_rank = rank_;
    o.nproc_per_node = job_nodes == 1 ? w : base_.nproc_per_node;
    o.master_addr = master_addr_;
    o.master_port = port;
    o.rdzv_replicas.clear();
    o.job_id = DerivedJobId("", job_id_, absl::StrCat(".scaling", w));
    o.policy.max_restarts = 0;
    o.dashboard_port = rendezvous::kDashboardOff;  // the first job's rendezvous has one
    return o;
  }

  double SizeDeadlineS() const {
    const double step_s = bench_.compute_ms / 1000.0 + kStepSlackS;
    return base_.policy.join_timeout_s + (1 + bench_.warmup + bench_.iters) * step_s +
           base_.grace_period_s + kSizeSlackS;
  }

  // nullopt: on to the next size; else the node worker's exit status.
  std::optional<int> RunSize(int i, int w) {
    const int per_node = base_.nproc_per_node;
    const int job_nodes = (w + per_node - 1) / per_node;
    const std::string key = absl::StrCat(kKeyRoot, i, "/");
    const bool in_job = rank_ < job_nodes;
    int port = 0;
    int rc = kExitSuccess;
    if (rank_ == 0) {
      port = FreePort();
      if (port <= 0) {
        return Stop(i, kExitRendezvousError,
                    absl::StrCat("ddprun bench --scaling: node 0 found no free TCP port for the "
                                 "job at ",
                                 w, " rank(s); free some ports (ss -tan)"));
      }
      if (absl::Status st = store_->Set(key + "port", std::to_string(port)); !st.ok()) {
        return StoreLost(w, std::string(st.message()));
      }
    }
    if (in_job) {
      if (rank_ != 0) {
        Waited p = WaitKey(*store_, key + "port", base_.policy.join_timeout_s + kSizeSlackS);
        if (p.end != WaitEnd::kOk) return WaitFailed(p, w, "node 0's port for");
        if (!absl::SimpleAtoi(p.value, &port)) port = 0;
      }
      rc = RunAgent(SizeJob(w, job_nodes, port), dir_.Path(i));
      // The first job's agent is stopping this node (the size's agent took
      // the signal): its own line says why.
      if (rc > 128) return rc;
      if (const int sig = PendingStopSignal()) return 128 + sig;
      if (absl::Status st = store_->Set(absl::StrCat(key, "done/", rank_), std::to_string(rc));
          !st.ok()) {
        return StoreLost(w, std::string(st.message()));
      }
    }
    if (rank_ != 0) {
      Waited next = WaitKey(*store_, key + "next", SizeDeadlineS());
      if (next.end != WaitEnd::kOk) return WaitFailed(next, w, "node 0's verdict on");
      int code = kExitWorkerFailed;
      const std::size_t space = next.value.find(' ');
      if (!absl::SimpleAtoi(next.value.substr(0, space), &code)) code = kExitWorkerFailed;
      if (code == kExitSuccess) return std::nullopt;
      return Finish(
          code, absl::StrCat("ddprun bench --scaling: node 0 stopped the run at ", w, " rank(s): ",
                             space == std::string::npos ? "" : next.value.substr(space + 1)));
    }
    return NodeZeroVerdict(i, w, job_nodes, rc);
  }

  // Node 0: its own part, then the others', then the row.
  std::optional<int> NodeZeroVerdict(int i, int w, int job_nodes, int rc) {
    const Json result = ReadResult(dir_.Path(i));
    std::ostringstream why;
    const int v = Verdict(rc, result, env_, why);
    if (v != kExitSuccess) {
      std::string line = why.str();
      if (!line.empty() && line.back() == '\n') line.pop_back();
      if (line.empty()) {
        line = absl::StrCat("ddprun bench --scaling: the job at ", w,
                            " rank(s) failed on node 0 (exit ", v, "); see the lines above");
      }
      return Stop(i, v, line);
    }
    if (!result.is_object() || !result.contains("row")) {
      return Stop(i, kExitWorkerFailed,
                  absl::StrCat("ddprun bench --scaling: the job at ", w,
                               " rank(s) ended without its figures; rerun with DDPRUN_DEBUG=sdk"));
    }
    const std::string key = absl::StrCat(kKeyRoot, i, "/");
    for (int j = 1; j < job_nodes; ++j) {
      const double wait_s = base_.grace_period_s + kSizeSlackS;
      Waited d = WaitKey(*store_, absl::StrCat(key, "done/", j), wait_s);
      if (d.end == WaitEnd::kSignal) return 128 + d.signal;
      if (d.end == WaitEnd::kStoreLost) return StoreLost(w, d.error);
      if (d.end == WaitEnd::kTimeout) {
        return Stop(
            i, kExitWorkerFailed,
            absl::StrCat("ddprun bench --scaling: node ", j,
                         " did not finish its part of "
                         "the job at ",
                         w, " rank(s) within ", wait_s, " s after node 0; see that node's output"));
      }
      if (d.value != "0") {
        int code = kExitWorkerFailed;
        if (!absl::SimpleAtoi(d.value, &code) || code == kExitSuccess) code = kExitWorkerFailed;
        return Stop(i, code,
                    absl::StrCat("ddprun bench --scaling: node ", j, "'s part of the job at ", w,
                                 " rank(s) failed (exit ", d.value, "); see that node's output"));
      }
    }
    if (absl::Status st = store_->Set(key + "next", "0"); !st.ok()) {
      return StoreLost(w, std::string(st.message()));
    }
    rows_.push_back(RowFromResult(result, w));
    const std::string backend = result.value("backend", std::string("?"));
    if (!bench_.json) {
      if (rows_.size() == 1) {
        out_ << FormatScalingHeader(backend, bench_);
      } else if (backend != last_backend_) {  // e.g. TCP between nodes from here on
        out_ << "# from " << w << " ranks: backend " << backend << "\n";
      }
      out_ << FormatScalingRow(rows_.back(), rows_[0].samples_per_s) << std::flush;
    }
    if (rows_.size() == 1) backend_ = backend;
    last_backend_ = backend;
    return std::nullopt;
  }

  // Node 0 ends the run: every other node learns `code` and `line`.
  int Stop(int i, int code, const std::string& line) {
    // Best effort: a node that cannot read it ends at its own deadline.
    (void)store_->Set(absl::StrCat(kKeyRoot, i, "/next"), absl::StrCat(code, " ", line));
    return Finish(code, line);
  }

  // Node 0's store is gone: so is node 0, or its agent. This node's agent
  // notices it too (the rendezvous fails the round, or cannot be re-attached
  // within its window) and stops this worker; exiting 0 before that would
  // read as this node's success. Waits for the stop at most kAwaitStopS.
  int StoreLost(int w, const std::string& error) {
    Finish(
        kExitRendezvousError,
        absl::StrCat("ddprun bench --scaling: node ", rank_, " lost node 0's store at ", w,
                     " rank(s) (", error, "); node 0 stopped or is unreachable: see its output"));
    const auto deadline = SteadyClock::now() + std::chrono::seconds(kAwaitStopS);
    while (SteadyClock::now() < deadline) {
      if (const int sig = PendingStopSignal()) return 128 + sig;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return kExitRendezvousError;
  }

  int WaitFailed(const Waited& waited, int w, const std::string& what) {
    switch (waited.end) {
      case WaitEnd::kSignal:
        return 128 + waited.signal;
      case WaitEnd::kStoreLost:
        return StoreLost(w, waited.error);
      default:
        return Finish(kExitWorkerFailed,
                      absl::StrCat("ddprun bench --scaling: node ", rank_, " got no ", what,
                                   " the job at ", w, " rank(s) in time; see node 0's output"));
    }
  }

  const Env& env_;
  std::ostream& out_;
  std::ostream& err_;
  int rank_ = 0;
  int nodes_ = 1;
  std::string result_path_, master_addr_, job_id_;
  BenchOptions bench_;
  agent::AgentOptions base_;
  ResultDir dir_;
  std::unique_ptr<rendezvous::C10dStoreClient> store_;
  std::vector<ScalingRow> rows_;
  std::string backend_;       // the first row's, for the header and the JSON
  std::string last_backend_;  // the previous row's
};

}  // namespace

int RunScalingAcrossNodes(const std::vector<std::string>& launcher_args, const std::string& worker,
                          const std::vector<std::string>& worker_args, agent::AgentOptions options,
                          std::ostream& err) {
  ResultDir dir;
  if (!dir.ok()) {
    err << "ddprun bench: cannot create a directory in " << fs::temp_directory_path()
        << "; set TMPDIR to a writable directory" << std::endl;
    return kExitUsage;
  }
  const Json spec = {{"launcher_args", launcher_args},
                     {"worker", worker},
                     {"worker_args", worker_args},
                     {"job_id", options.job_id}};
  options.job_id = DerivedJobId("scaling.", options.job_id);
  options.nproc_per_node = 1;
  options.policy.max_restarts = 0;
  options.policy.hang_timeout_s =
      0;  // the node workers make no steps; they have their own deadlines
  options.python_hook = false;
  options.replace_lost_nodes = false;  // a lost node ends the run on every node at once
  options.command = {SelfExe(), kBenchScalingNodeSubcommand};
  options.extra_env[kEnvBenchScalingSpec] = spec.dump();
  const std::string path = dir.Path(0);
  const int rc = RunAgent(std::move(options), path);
  const Json result = ReadResult(path);
  if (!result.is_object() || !result.contains("exit_code")) {
    if (rc != kExitSuccess) return rc;  // the agent printed why
    err << "ddprun bench --scaling: this node's scaling worker wrote no result; rerun with "
           "DDPRUN_DEBUG=agent"
        << std::endl;
    return kExitWorkerFailed;
  }
  const int code = result["exit_code"].get<int>();
  return code != kExitSuccess ? code : rc;
}

}  // namespace bench

int RunBenchScalingNode(const Env& env, const HostFacts& host, std::ostream& out,
                        std::ostream& err) {
  bench::NodeRun run(env, out, err);
  return run.Run(host);
}

}  // namespace ddprun::launcher
