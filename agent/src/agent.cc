// The per-node agent's round loop (see agent.h for the lifecycle). The
// rendezvous, the workers, the failure report and the events are behind
// their own files; this file only decides what happens next.
//
// Threads: the main thread (Run) owns every piece of state, spawns and stops
// the workers (PR_SET_PDEATHSIG is tied to the spawning thread) and waits on
// the event queue, always with a deadline on the injected clock. The signal
// watcher and the session's stream reader only push events.
#include "ddprun/agent/agent.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ddprun/agent/background_priority.h"
#include "ddprun/agent/checkpoint_memory.h"
#include "ddprun/agent/checkpoint_persister.h"
#include "ddprun/agent/checkpoint_replicas.h"
#include "ddprun/agent/failure_report.h"
#include "ddprun/agent/file_timer.h"
#include "ddprun/agent/host.h"
#include "ddprun/agent/inplace_blocks.h"
#include "ddprun/agent/recovery_budget.h"
#include "ddprun/agent/warm_standby.h"
#include "ddprun/agent/worker_env.h"
#include "ddprun/agent/worker_group.h"
#include "ddprun/agent/worker_logs.h"
#include "ddprun/rendezvous/common/checkpoint_layout.h"
#include "ddprun/rendezvous/common/debug_log.h"
#include "ddprun/rendezvous/common/errors.h"
#include "ddprun/rendezvous/common/exit_codes.h"
#include "ddprun/rendezvous/common/host_port.h"
#include "ddprun/rendezvous/common/socket_util.h"
#include "ddprun/rendezvous/common/status_macros.h"
#include "ddprun/rendezvous/common/wait_notice.h"
#include "ddprun/rendezvous/common/worker_env_names.h"
#include "ddprun/rendezvous/monitoring/hang_report.h"
#include "ddprun/rendezvous/store/c10d_store_server.h"
#include "monitoring.h"
#include "replica_exchange.h"

namespace ddprun::agent {
namespace {

namespace rdzv = ::ddprun::rendezvous;
using rdzv::Duration;
using rdzv::TimePoint;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr Duration kReportTimeout = seconds(10);
// A node whose workers succeeded waits this long for the job to end (like
// torchrun's exit barrier) before it exits anyway.
constexpr Duration kExitBarrier = seconds(300);
// How long the job's end waits for its newest step to reach --ckpt_dir.
constexpr std::chrono::seconds kEndPersistTimeout{300};
// Beyond the join timeout, how long the agent itself waits for the server's
// verdict on a join before it gives up.
constexpr Duration kJoinSlack = seconds(15);
// How long to wait for the daemon's decision after reporting a failure.
constexpr Duration kDecisionTimeout = seconds(120);
// After a worker's failure in a round that no restart follows, how long the
// agent waits for the node's other workers before it stops them: those that
// fail in this window are reported as failures of their own (torchrun 2.x
// polls every monitor_interval = 0.1 s and reports whatever failed in it).
// It ends as soon as every worker has exited. Not used while restarts
// remain, so a restart is not delayed (docs/cli.md, "Failure report").
constexpr Duration kFailureSettle = milliseconds(100);
// After losing the rendezvous mid-round (ddprund restarting), how long the
// agent keeps its workers running while it tries to re-attach.
constexpr Duration kReattachWindow = seconds(30);
// A re-attach's wait for the rendezvous' first answer.
constexpr Duration kReattachAnswer = seconds(5);
// A fixed-size job that lost a node: if the next round has not formed this
// long after re-joining (the survivors re-join within milliseconds, a hot
// spare takes the seat at once), the agent says what it waits for.
constexpr Duration kReplacementNotice = seconds(1);
constexpr Duration kStatusTimeout = seconds(2);
// The threads that serve a running job from the side (the session's: the
// dashboard's I/O, the in-process rendezvous' acceptor and its hub's ticker;
// monitoring's reporter) start this long after the first round's workers
// were spawned, not at once: a job whose workers are all gone by then (a
// launch of 8 `true` ends ~10 ms after its last spawn) never starts them, and
// a round's first spawns do not share the cores with them. A client that
// connects earlier waits in the listening socket's backlog (docs/launch.md).
constexpr Duration kServicesDelay = milliseconds(100);
// --restart_policy=inplace: how long a survivor has, from the new round's
// publish, to acknowledge it (inplace_layout.h) before it is restarted as a
// process. A survivor out of its failed collective takes milliseconds; one
// stuck in a call nothing interrupts never acknowledges.
constexpr Duration kInplaceAckTimeout = seconds(10);
// How often the agent looks at the survivors' acknowledgements meanwhile.
constexpr Duration kInplaceAckPoll = milliseconds(10);
// --restart_policy=inplace, a job of several nodes: how long a registered
// worker's exit with an exit code waits for a restart decided elsewhere
// before the agent reports it as this node's failure (AwaitRestartForExits).
// A peer's failure reaches the other agents through the rendezvous within
// milliseconds; a survivor that does not catch its failed collective (an SDK
// program ending on PeerLostError) can exit sooner than that.
constexpr Duration kCasualtyWindow = milliseconds(500);
// How often a re-joining agent with an open recovery record or, under
// --restart_policy=inplace, kept survivors asks whether the job runs without
// it (CheckBecameSpare).
constexpr Duration kSpareCheckInterval = milliseconds(500);
// --restart_policy=inplace, warm start (warm_standby.h): after a replacement
// took the standby, the next one starts once the recovery saw its first step
// (so that its imports do not slow the recovery down), or this long after
// when no step is seen (no monitoring).
constexpr Duration kStandbyRestartDelay = seconds(5);
// A node stops starting standbys after this many exited unused.
constexpr int kStandbyMaxFailures = 3;

double SecondsOf(Duration d) { return std::chrono::duration<double>(d).count(); }

// Whether a rendezvous status message already starts with the job's fence.
// The rendezvous fences its verdicts on a join (errors.h: timeout, state,
// closed, auth, bad input); transport errors (connection, cancelled) come
// from the client library unfenced and get the agent's fence.
bool CarriesFence(const absl::Status& st) {
  switch (rdzv::KindOf(st)) {
    case rdzv::ErrorKind::kTimeout:
    case rdzv::ErrorKind::kState:
    case rdzv::ErrorKind::kClosed:
    case rdzv::ErrorKind::kAuth:
    case rdzv::ErrorKind::kBadInput:
      return true;
    default:
      return false;
  }
}

}  // namespace

class Agent::Impl {
 public:
  Impl(AgentOptions options, AgentDeps deps)
      : options_(std::move(options)),
        clock_(deps.clock != nullptr ? *deps.clock : rdzv::SystemClock::Get()),
        launcher_(deps.launcher ? std::move(deps.launcher) : MakeBoostProcessLauncher()),
        session_(deps.session ? std::move(deps.session) : MakeRendezvousSession(options_, clock_)),
        own_events_(deps.events == nullptr ? MakeEventQueue(clock_) : nullptr),
        events_(deps.events != nullptr ? *deps.events : *own_events_),
        join_timeout_(rdzv::Seconds(options_.policy.join_timeout_s)),
        last_call_timeout_(rdzv::Seconds(options_.policy.last_call_timeout_s)),
        grace_period_(rdzv::Seconds(options_.grace_period_s)),
        workers_(*launcher_, clock_) {
    if (options_.ckpt_shm_limit > 0) {
      checkpoints_ = std::make_unique<CheckpointMemory>(options_.ckpt_shm_limit);
      if (!options_.ckpt_dir.empty()) {
        // Fenced by the round the workers were last spawned in: it logs
        // from its own thread.
        persister_ = std::make_unique<CheckpointPersister>(
            options_.ckpt_dir, checkpoints_.get(),
            [this](const std::string& msg) {
              std::string line = absl::StrCat(
                  "ddprun: ", rdzv::Fence(options_.job_id, persist_round_.load()), msg, "\n");
              std::fputs(line.c_str(), stderr);
              std::fflush(stderr);
            },
            options_.ckpt_bandwidth, &background_);
      }
    }
  }

  ~Impl() { Shutdown(); }

  int Run() {
    BlockAgentSignals();  // in case the caller forgot; threads started below inherit it
    base_env_ = CurrentEnvironment();
    workers_host_store_ = WorkersHostStore(base_env_, options_.mode);
    if (absl::Status st = InitLogs(); !st.ok()) {
      Log(std::string(st.message()));
      return kExitUsage;
    }
    if (own_events_) watcher_.emplace(events_);
    if (absl::Status st = StartFileTimer(); !st.ok()) {
      Log(std::string(st.message()));
      return kExitUsage;
    }
    if (!options_.ckpt_dir.empty() && !persister_) {
      Log("--ckpt_dir needs checkpoint memory; drop --ckpt_shm_limit 0");
      return kExitUsage;
    }
    if (options_.policy.ckpt_replicas > 0 && !checkpoints_) {
      Log("--ckpt_replicas 1 needs checkpoint memory; drop --ckpt_shm_limit 0");
      return kExitUsage;
    }
    if (persister_) {
      if (absl::Status st = persister_->Start(); !st.ok()) {
        Log(std::string(st.message()));
        return kExitUsage;
      }
    }
    int rc = RunRounds();
    // The job's end: its newest committed step to --ckpt_dir (once more
    // after a signal's flush, a no-op unless a later step was committed).
    if (persister_) {
      persister_->Flush(std::chrono::steady_clock::now() + kEndPersistTimeout, "the job's end");
    }
    DDPRUN_DEBUG_LOG(kAgent) << rdzv::Fence(options_.job_id, round_) << "shutting down, exit "
                             << rc;
    if (auto r = recovery_.Finish()) Say(FormatRecovery(options_.job_id, *r));
    Finish();
    return rc;
  }

 private:
  // ------------------------------------------------------------ plumbing

  void Log(const std::string& msg) const {
    std::string line = absl::StrCat("ddprun: ", rdzv::Fence(options_.job_id, round_), msg, "\n");
    std::fputs(line.c_str(), stderr);
    std::fflush(stderr);
  }
  // A line that carries its own fence.
  static void Say(const std::string& fenced) {
    std::string line = absl::StrCat("ddprun: ", fenced, "\n");
    std::fputs(line.c_str(), stderr);
    std::fflush(stderr);
  }
  // A one-line error from the rendezvous, fenced once.
  void RendezvousError(const absl::Status& st) const {
    if (!CarriesFence(st)) return Log(std::string(st.message()));
    std::string line = absl::StrCat("ddprun: ", st.message(), "\n");
    std::fputs(line.c_str(), stderr);
    std::fflush(stderr);
  }

  // Events deferred while stopping workers or re-attaching come first.
  std::optional<Event> NextEvent(TimePoint deadline) {
    if (!deferred_.empty()) {
      Event e = std::move(deferred_.front());
      deferred_.pop_front();
      return e;
    }
    return events_.PopUntil(deadline);
  }

  // Everything of the run that another process or the user sees, in order:
  // the workers' last output on the console and in files (and the temporary
  // error-file directory removed), the reporter stopped (it uses the
  // session), this node's part in the rendezvous ended, the orphan guard
  // dismissed. What Shutdown() adds is joining threads that hold only this
  // process's memory (agent.h).
  void Finish() {
    file_timer_.reset();  // removes the FIFO
    if (logs_) logs_->Finish();
    warm_.reset();  // the standby is killed and reaped: it never outlives the agent
    monitoring_.reset();
    stream_id_ = 0;  // anything still queued from the Join is stale
    session_->Leave();
    launcher_->Close();
  }

  void Shutdown() {
    Finish();
    watcher_.reset();
    session_->Close();
  }

  // Whether `sig` stops the node: the four terminating signals, and SIGUSR1/2
  // when --signals_to_handle lists them and --forward_signals does not.
  bool Terminates(int sig) const {
    if (IsTerminatingSignal(sig)) return true;
    if (sig == SIGUSR1) return options_.stop_on_sigusr1 && !options_.forward_sigusr1;
    if (sig == SIGUSR2) return options_.stop_on_sigusr2 && !options_.forward_sigusr2;
    return false;
  }

  // SIGUSR1/SIGUSR2 that do not stop the node: forwarded to every worker
  // group when --forward_signals lists them (the job goes on), else ignored.
  void ForwardNonTerminating(int sig) {
    const bool forward = (sig == SIGUSR1 && options_.forward_sigusr1) ||
                         (sig == SIGUSR2 && options_.forward_sigusr2);
    if (!forward) {
      Log(absl::StrCat("ignoring ", SignalName(sig),
                       "; add it to --forward_signals to forward it to the workers while the job "
                       "runs, or to --signals_to_handle to stop the job on it"));
      return;
    }
    Log(absl::StrCat("forwarding ", SignalName(sig), " to the workers"));
    workers_.Signal(sig, false);
  }

  // A pending terminating signal, without blocking (polled between the
  // slices of the session's blocking set-up). Stream events are kept.
  bool TakeSignal() {
    while (auto e = events_.PopUntil(clock_.Now())) {
      if (auto* s = std::get_if<SignalEvent>(&*e)) {
        if (Terminates(s->signo)) {
          pending_signal_ = s->signo;
          return true;
        }
      } else if (std::holds_alternative<StreamEvent>(*e)) {
        deferred_.push_back(std::move(*e));
      }
    }
    return false;
  }

  // --------------------------------------------------------- rendezvous

  rdzv::JoinSpec MakeJoinSpec() const {
    rdzv::JoinSpec spec;
    spec.job_id = options_.job_id;
    spec.join_token = options_.join_token;
    spec.host = advertised_host_;
    spec.pid = ::getpid();
    spec.nproc = options_.nproc_per_node;
    spec.min_nodes = options_.min_nodes;
    spec.max_nodes = options_.max_nodes;
    if (resuming_ && assignment_) {
      spec.resume_round = assignment_->round;
      spec.resume_node_id = assignment_->node_id;
    }
    spec.requested_rank = options_.node_rank;
    spec.policy = options_.policy;
    spec.master_port = session_->master_port();
    if (workers_host_store_) {
      // As torchrun's RendezvousStoreInfo.build: a port free now on this
      // node, for worker rank 0 to bind if this node becomes group rank 0.
      // Like torchrun's, it is released before the worker binds it.
      if (int port = FreePortForWorkers(); port > 0) spec.master_port = port;
    }
    spec.command = absl::StrJoin(options_.command, " ");
    return spec;
  }

  // A port that nothing on this node listens on (0 if none could be had;
  // the join then offers the agent's store, which works as well).
  int FreePortForWorkers() const {
    auto fd = rdzv::net::ListenTcp("", 0);
    if (!fd.ok()) {
      Log(absl::StrCat(kEnvDisableSharedStore, "=1: no free port for worker rank 0 (",
                       fd.status().message(), "); the workers use the agent's store"));
      return 0;
    }
    return rdzv::net::LocalPort(fd->get());
  }

  void StartJoin() { stream_id_ = session_->Join(MakeJoinSpec(), events_); }
  void EndJoin() {
    session_->EndJoin();
    stream_id_ = 0;  // anything still queued from it is stale
  }

  // The current stream's event, or nullptr for stale/other events.
  rdzv::RoundEvent* CurrentStreamEvent(Event& e) {
    auto* se = std::get_if<StreamEvent>(&e);
    if (se == nullptr || se->stream_id != stream_id_ || stream_id_ == 0) return nullptr;
    return &se->event;
  }

  void ReportBestEffort(rdzv::Outcome outcome, const std::vector<rdzv::WorkerFailure>& failures) {
    if (!assignment_) return;
    absl::Status st = session_->Report(*assignment_, outcome, failures, kReportTimeout);
    if (!st.ok()) Log(absl::StrCat("could not report to the rendezvous: ", st.message()));
  }

  // ------------------------------------------------------------ workers

  // The log directory, error files and output plumbing (worker_logs.h).
  absl::Status InitLogs() {
    WorkerLogs::Options lo;
    lo.spec = options_.logs;
    if (auto it = base_env_.find("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
        lo.spec.prefix_template.empty() && it != base_env_.end()) {
      lo.spec.prefix_template = it->second;
    }
    lo.log_dir = options_.log_dir;
    lo.job_id = options_.job_id;
    lo.role = options_.role;
    lo.host = options_.local_addr;
    if (lo.host.empty()) lo.host = ShortHostname();
    logs_ = std::make_unique<WorkerLogs>(std::move(lo));
    DDPRUN_RETURN_IF_ERROR(logs_->Init());
    // Killed with SIGKILL, the agent cannot remove it; its guard does.
    if (logs_->holds_only_error_files()) launcher_->RemoveOnDeath(logs_->log_dir());
    return absl::OkStatus();
  }

  // ---------------------------------------------------------- file timer

  // torchrun's: with TORCHELASTIC_ENABLE_FILE_TIMER=1, the agent serves
  // torchelastic's file timer (file_timer.h) at the launcher's
  // TORCHELASTIC_TIMER_FILE, else at a fresh path, for the whole job.
  absl::Status StartFileTimer() {
    auto it = base_env_.find(kEnvEnableFileTimer);
    if (it == base_env_.end() || it->second != "1") return absl::OkStatus();
    FileTimerServer::Options o;
    auto path = base_env_.find(kEnvTimerFile);
    o.path = path != base_env_.end() && !path->second.empty() ? path->second : FreshTimerFilePath();
    o.worker_rank = [this](pid_t pid) -> std::optional<int> {
      std::lock_guard<std::mutex> lock(worker_pids_mu_);
      auto w = worker_pids_.find(pid);
      if (w == worker_pids_.end()) return std::nullopt;
      return w->second;
    };
    o.log = [this](const std::string& m) {
      std::int64_t round = 0;  // round_ belongs to the main thread
      {
        std::lock_guard<std::mutex> lock(worker_pids_mu_);
        round = worker_pids_round_;
      }
      std::string line = absl::StrCat("ddprun: ", rdzv::Fence(options_.job_id, round), m, "\n");
      std::fputs(line.c_str(), stderr);
      std::fflush(stderr);
    };
    auto server = FileTimerServer::Start(std::move(o));
    if (!server.ok()) return server.status();
    file_timer_ = *std::move(server);
    return absl::OkStatus();
  }

  // The pids the file timer may signal: the current round's live workers.
  void UpdateTimerPids() {
    if (!file_timer_) return;
    std::map<pid_t, int> pids;
    for (const auto& w : workers_.workers()) {
      if (w.child && !w.exit) pids.emplace(w.child->pid(), w.global_rank);
    }
    std::lock_guard<std::mutex> lock(worker_pids_mu_);
    worker_pids_ = std::move(pids);
    worker_pids_round_ = round_;
  }

  // ------------------------------------------------------------ replicas

  // --ckpt_replicas 1, the job's (its policy: the first node's), at its
  // first assignment: this node's replica server on its advertised address
  // (replica_exchange.h publishes it each round) and its sender. Replicas
  // travel through the agent's TCPStore, so not when worker rank 0 hosts it.
  // A node without checkpoint memory in a job that replicates is an error.
  absl::Status StartReplicas() {
    if (replicas_checked_) return absl::OkStatus();
    replicas_checked_ = true;
    if (JobPolicyNow().ckpt_replicas == 0) return absl::OkStatus();
    if (!checkpoints_) {
      return absl::FailedPreconditionError(
          "the job runs with --ckpt_replicas 1 (the first node's) and this node has no "
          "checkpoint memory (--ckpt_shm_limit 0); drop --ckpt_shm_limit 0 or run every node "
          "with --ckpt_replicas 0");
    }
    if (workers_host_store_) {
      Log(absl::StrCat("--ckpt_replicas: off, since ", kEnvDisableSharedStore,
                       "=1 leaves the agents no store to find each other through"));
      return absl::OkStatus();
    }
    ReplicaService::Options ro;
    ro.job_id = options_.job_id;
    ro.host = advertised_host_;
    ro.limit_bytes = options_.ckpt_shm_limit;
    ro.bandwidth = options_.ckpt_bandwidth;
    ro.encrypt = JobPolicyNow().ckpt_encrypt != 0;
    ro.background = &background_;
    // Fenced by the round the workers were last spawned in, like the
    // persister: it logs from its own threads.
    replicas_ = std::make_unique<ReplicaService>(
        std::move(ro), checkpoints_.get(), [this](const std::string& msg) {
          std::string line = absl::StrCat(
              "ddprun: ", rdzv::Fence(options_.job_id, persist_round_.load()), msg, "\n");
          std::fputs(line.c_str(), stderr);
          std::fflush(stderr);
        });
    DDPRUN_RETURN_IF_ERROR(replicas_->Start());
    // Three slots per worker: a save waits only for the previous snapshot's
    // replica while the newest travels (docs/checkpoint.md, "Replica lag").
    // Before the first spawn creates the memory (this is the first assignment).
    checkpoints_->set_slots(static_cast<int>(checkpoint_layout::kSlotsWithReplicas));
    Log(
        absl::StrCat("--ckpt_replicas: this node keeps the replica of the previous node's "
                     "checkpoint and listens for it on ",
                     replicas_->endpoint(),
                     replicas_->encrypt() ? "; replicas cross encrypted (AES-256-GCM)"
                                          : "; replicas cross in plaintext (--ckpt_encrypt 0)"));
    return absl::OkStatus();
  }

  // ---------------------------------------------------------- monitoring

  void StartMonitoring() {
    Monitoring::Options mo;
    mo.job_id = options_.job_id;
    mo.host = advertised_host_;
    mo.python_hook = options_.python_hook;
    mo.python_dir = options_.python_hook ? FindPythonHookDir() : "";
    if (checkpoints_) {
      // The newest committed snapshot of each worker, from its records (a
      // pread each), and the memory it holds. checkpoints_ outlives
      // monitoring_ (Finish resets monitoring_ first).
      mo.checkpoints = [memory = checkpoints_.get()](std::vector<rdzv::RankSample>* ranks) {
        for (rdzv::RankSample& r : *ranks) {
          const std::vector<CommittedSnapshot> committed = memory->Committed(r.local_rank);
          r.has_checkpoint = !committed.empty();
          if (r.has_checkpoint) {
            r.checkpoint_step = committed.front().step;
            r.checkpoint_bytes = committed.front().size;
          }
          r.checkpoint_memory_bytes = memory->MemoryBytes(r.local_rank);
        }
      };
    }
    monitoring_ = std::make_unique<Monitoring>(
        std::move(mo), *session_, clock_, [this](const std::string& m) { Log(m); },
        [this](const std::string& block) {
          if (logs_) logs_->Sync();
          std::string text = block;
          if (!text.empty() && text.back() != '\n') text += '\n';
          std::fputs(text.c_str(), stderr);
          std::fflush(stderr);
        });
    exit_seen_.clear();
  }

  // Worker exits for the next report: their state and one event each.
  void UpdateMonitoredWorkers() {
    if (!monitoring_) return;
    const auto& ws = workers_.workers();
    exit_seen_.resize(ws.size(), false);
    for (std::size_t j = 0; j < ws.size(); ++j) {
      if (!ws[j].exit || exit_seen_[j]) continue;
      exit_seen_[j] = true;
      const bool failed = !ws[j].exit->ok() && !ws[j].stopped_by_agent;
      monitoring_->WorkerState(ws[j].local_rank, ws[j].stopped_by_agent ? "stopped"
                                                 : failed               ? "failed"
                                                                        : "exited");
      monitoring_->Event(
          absl::StrCat("worker rank ", ws[j].global_rank, " ", ws[j].exit->Describe()));
    }
  }

  // Spawns every local worker. Returns false if one could not be started.
  // --restart_policy=inplace: the previous round's registered survivors are
  // kept instead, and get the round's environment through their blocks.
  bool SpawnWorkers() {
    const rdzv::Assignment& a = *assignment_;
    workers_.Poll();
    std::vector<std::optional<Worker>> survivors = ChooseSurvivors(workers_.TakeWorkers(), a);
    std::set<int> kept;
    for (int j = 0; j < a.local_world_size; ++j) {
      if (survivors[j]) kept.insert(j);
    }
    logs_->BeginRound(a.restart_count, kept);
    exit_seen_.assign(a.local_world_size, false);
    if (monitoring_) monitoring_->BeginRound(a, kept);
    if (InplacePolicy()) {
      if (!inplace_) inplace_ = std::make_unique<InplaceBlocks>();
      if (absl::Status st = inplace_->Ensure(a.local_world_size); !st.ok()) {
        Log(std::string(st.message()));
        return false;
      }
    }
    WorkerEnvInputs& in = spawn_in_;
    in = WorkerEnvInputs{};
    in.options = &options_;
    in.assignment = &a;
    in.store_endpoint = session_->endpoint();
    absl::StatusOr<std::string> sdk_store = session_->OpenSdkStore(a);
    if (!sdk_store.ok()) {
      Log(absl::StrCat("cannot prepare the workers' store: ", sdk_store.status().message()));
      return false;
    }
    in.tcp_store = *std::move(sdk_store);
    in.host = advertised_host_;
    in.agent_store = !workers_host_store_;
    if (file_timer_) in.timer_file = file_timer_->path();
    // The launcher checked the policy against this node at start; the mask
    // may have changed since, so a plan that fails now fails the spawn.
    // With background checkpoint threads, a core is left for them when
    // there are more than workers (cpu_binding.h).
    const bool spare_core = persister_ != nullptr || replicas_ != nullptr;
    auto plan = PlanCpuBinding(options_.cpu_bind, a.local_world_size, ReadCpuTopology, spare_core);
    if (!plan.ok()) {
      Log(absl::StrCat("--cpu_bind: ", plan.status().message()));
      return false;
    }
    if (options_.numa_binding != NumaBinding::kNone) *plan = PlanNumaBinding(a.local_world_size);
    spawn_plan_ = *std::move(plan);
    // Checkpoint memory: read between rounds, when no worker runs (the
    // survivors of an in-place restart wait for the round's publish).
    std::vector<std::int64_t>& ckpt_steps = spawn_ckpt_steps_;
    ckpt_steps.clear();
    if (checkpoints_) {
      if (absl::Status st = checkpoints_->Ensure(a.local_world_size); !st.ok()) {
        Log(std::string(st.message()));
        return false;
      }
      persist_round_ = round_;
      if (replicas_) {
        ExchangeReplicas(*replicas_, *checkpoints_, a, options_.job_id,
                         [this](const std::string& m) { Log(m); });
      }
      if (persister_) {
        bool empty = true;
        for (int j = 0; j < a.local_world_size; ++j)
          empty = empty && checkpoints_->Committed(j).empty();
        if (empty)
          persister_->Restore(checkpoints_.get(), a.local_world_size, a.base_rank, a.world_size);
      }
      ckpt_steps = checkpoints_->CommonSteps(a.local_world_size, a.base_rank, a.world_size);
      if (!ckpt_steps.empty() && a.restart_count > 0) {
        Log(absl::StrCat(
            "checkpoint: the workers resume from step ", ckpt_steps.back(),
            a.group_world_size > 1
                ? " (this node's newest; load() agrees on the newest step of all nodes)"
                : " (the newest step every worker committed)"));
      }
    }
    worker_env_.resize(static_cast<std::size_t>(a.local_world_size));
    exit_window_.reset();
    ack_due_.reset();
    ack_retry_ = false;
    awaiting_ack_.clear();
    std::vector<int> restarted;
    for (int j = 0; j < a.local_world_size; ++j) {
      if (survivors[j] && KeepInPlace(j, std::move(*survivors[j]))) continue;
      if (!SpawnOne(j)) return false;
      if (!kept.empty() || a.restart_count > 0) restarted.push_back(a.base_rank + j);
    }
    // Every worker runs with the round's binding now (a CPU the kernel
    // refused failed its spawn above).
    ConfineBackgroundThreads();
    if (!awaiting_ack_.empty()) {
      ack_due_ = clock_.Now() + kInplaceAckTimeout;
      std::vector<int> ranks;
      for (int j : awaiting_ack_) ranks.push_back(a.base_rank + j);
      Log(absl::StrCat("in place: rank(s) ", absl::StrJoin(ranks, ","),
                       " keep their processes and re-form into this round",
                       restarted.empty()
                           ? ""
                           : absl::StrCat("; started rank(s) ", absl::StrJoin(restarted, ","))));
    }
    UpdateTimerPids();
    DDPRUN_DEBUG_LOG(kAgent) << rdzv::Fence(options_.job_id, round_) << "spawned "
                             << a.local_world_size - awaiting_ack_.size() << " worker(s), kept "
                             << awaiting_ack_.size();
    return true;
  }

  // The environment of local rank j in this round (the spawn's, without its
  // stdout/stderr and descriptors).
  SpawnSpec RoundSpec(int j, const std::string& error_file) {
    SpawnSpec spec;
    spawn_in_.error_file = error_file;
    spec.argv = SubstituteLocalRank(options_.command, j);
    spec.env = BuildWorkerEnv(base_env_, spawn_in_, j);
    if (monitoring_) monitoring_->AddWorkerEnv(j, &spec.env);
    if (checkpoints_) {
      checkpoints_->AddToSpawn(j, spawn_ckpt_steps_, &spec);
      spec.env[kEnvCkptEvery] = std::to_string(options_.ckpt_every);
    } else {
      RemoveCheckpointEnv(&spec.env);
    }
    RemoveInplaceEnv(&spec.env);
    if (!spawn_plan_.empty()) spec.cpus = spawn_plan_[static_cast<std::size_t>(j)];
    return spec;
  }

  // Starts a fresh process of local rank j in this round (appended to the
  // group). False, said on the console, when it could not be started.
  bool SpawnOne(int j) {
    const rdzv::Assignment& a = *assignment_;
    SpawnSpec prepared_spec;
    std::string error_file;
    absl::Status prepared = logs_->Prepare(j, a.base_rank + j, &prepared_spec, &error_file);
    SpawnSpec spec = RoundSpec(j, error_file);
    spec.stdout_path = prepared_spec.stdout_path;
    spec.stderr_path = prepared_spec.stderr_path;
    spec.stdout_fd = prepared_spec.stdout_fd;
    spec.stderr_fd = prepared_spec.stderr_fd;
    if (inplace_ && InplacePolicy()) inplace_->AddToSpawn(j, &spec);
    if (static_cast<std::size_t>(j) < worker_env_.size()) worker_env_[j] = spec.env;
    worker_fds_.insert(spec.inherit_fds.begin(), spec.inherit_fds.end());
    absl::Status st = absl::OkStatus();
    if (std::unique_ptr<ChildProcess> warm = TakeStandby(j, spec, prepared)) {
      Worker w;
      w.local_rank = j;
      w.child = std::move(warm);
      w.error_file = std::move(error_file);
      workers_.Adopt(std::move(w), a.base_rank + j);
    } else {
      st = workers_.Spawn(j, a.base_rank + j, spec, std::move(error_file), prepared);
    }
    if (monitoring_ && st.ok() && workers_.workers().back().child) {
      monitoring_->WorkerStarted(j, workers_.workers().back().child->pid());
    }
    logs_->AfterSpawn(j);
    if (!st.ok()) {
      Log(std::string(st.message()));
      return false;
    }
    return true;
  }

  // ------------------------------------------------------------ warm start

  // Whether this node keeps a warm standby (warm_standby.h): in-place
  // restarts of a Python entrypoint, --warm_modules not none.
  bool WarmStart() const {
    return !warm_off_ && InplacePolicy() && options_.warm_modules != kWarmModulesOff &&
           WarmStandby::Supports(options_.command);
  }

  // Local rank j's replacement from the standby (the standby's process, now
  // the worker), or null to start it cold: no standby, the job's first
  // start, or a spec the standby cannot run (said in one line).
  std::unique_ptr<ChildProcess> TakeStandby(int j, const SpawnSpec& spec,
                                            const absl::Status& prepared) {
    if (!warm_ || !prepared.ok() || assignment_->restart_count == 0 || !warm_->Alive()) {
      return nullptr;
    }
    const pid_t pid = warm_->pid();
    const bool ready = warm_->Ready();
    const int rank = assignment_->base_rank + j;
    auto child = warm_->Activate(spec);
    if (!child.ok()) {
      Log(absl::StrCat("warm standby (pid ", pid, ") cannot become worker rank ", rank, ": ",
                       child.status().message(), "; starting it cold"));
      return nullptr;
    }
    Log(absl::StrCat("in place: worker rank ", rank, " starts warm, in the standby (pid ", pid,
                     ready ? ", modules imported)" : ", still importing)"));
    standby_due_ = clock_.Now() + kStandbyRestartDelay;
    return *std::move(child);
  }

  // Starts the node's standby when it has none: once the round's workers
  // were spawned, and after a replacement took it, once the recovery saw
  // its first step (or kStandbyRestartDelay). Environment: local rank 0's.
  void MaybeStartStandby() {
    if (!assignment_ || worker_env_.empty() || !WarmStart()) return;
    if (!warm_) {
      warm_ = std::make_unique<WarmStandby>(*launcher_, options_.warm_modules,
                                            [this](const std::string& m) { Log(m); });
    }
    if (warm_->failures() >= kStandbyMaxFailures || warm_->Alive()) return;
    if (recovery_.WaitingForStep() && clock_.Now() < standby_due_) return;
    SpawnSpec like;
    like.argv = SubstituteLocalRank(options_.command, 0);
    like.env = worker_env_[0];
    if (absl::Status st = warm_->Start(like, worker_fds_); !st.ok()) {
      Log(absl::StrCat("cannot start the warm standby: ", st.message(),
                       "; replacements start cold"));
      warm_off_ = true;
    }
  }

  // ------------------------------------------------------------ in place

  // The job's policy (the first node's) once this node has an assignment,
  // else its own.
  const rdzv::JobPolicy& JobPolicyNow() const {
    return assignment_ && assignment_->policy ? *assignment_->policy : options_.policy;
  }

  // Whether the job restarts only failed workers.
  bool InplacePolicy() const {
    return JobPolicyNow().restart_policy == rdzv::RestartPolicy::kInplace;
  }

  // A failure broke the round (this node's worker, or a restart decided by
  // the rendezvous): every live worker's block says so at once
  // (inplace_layout.h, step 3), so that its collectives can fail fast; the
  // processes keep running until the next round is formed.
  void BreakSurvivors() {
    if (monitoring_) monitoring_->EndRound(/*keep_files=*/true);
    if (replicas_) replicas_->ClearSuccessor();
    workers_.Poll();
    ack_due_.reset();
    ack_retry_ = false;
    awaiting_ack_.clear();
    for (const Worker& w : workers_.workers()) {
      if (w.child && !w.exit && inplace_) inplace_->Break(w.local_rank);
    }
    UpdateTimerPids();
  }

  // The previous round's live workers, by local rank, that may go on in
  // their processes: those that registered in their block (inplace_layout.h,
  // step 2). The others are stopped here, each with one line saying why.
  // Under --restart_policy=job none is alive here; every seat is empty.
  std::vector<std::optional<Worker>> ChooseSurvivors(std::vector<Worker> previous,
                                                     const rdzv::Assignment& a) {
    std::vector<std::optional<Worker>> out(static_cast<std::size_t>(a.local_world_size));
    std::vector<Worker> doomed;
    for (Worker& w : previous) {
      if (!w.child || w.exit) continue;
      const pid_t pid = w.child->pid();
      if (!InplacePolicy() || w.local_rank >= a.local_world_size) {
        doomed.push_back(std::move(w));
      } else if (!inplace_ || !inplace_->Registered(w.local_rank, pid)) {
        Log(absl::StrCat("in place: worker rank ", w.global_rank, " (pid ", pid,
                         ") never registered to re-form in its process (ddprun.inprocess.run, "
                         "or the SDK's ddp::Init); restarting it as a process"));
        doomed.push_back(std::move(w));
      } else {
        out[static_cast<std::size_t>(w.local_rank)] = std::move(w);
      }
    }
    StopProcesses(std::move(doomed));
    return out;
  }

  // Of the local ranks `js`, those whose Python stack is not inside a
  // PyTorch collective (hang_report.h's rule), taken now; all of them when
  // no stack is to be had or none is inside one (nobody waits on another).
  std::set<int> StuckInOwnCode(const std::set<int>& js) {
    if (!monitoring_ || js.empty()) return js;
    std::set<int> own;
    for (const Worker& w : workers_.workers()) {
      if (js.count(w.local_rank) == 0 || !w.child || w.exit) continue;
      const rdzv::StackDump d = monitoring_->CaptureLocal(w.local_rank, w.child->pid(), seconds(5));
      if (d.kind != "python" || !rdzv::InPyTorchCollective(d.text)) own.insert(w.local_rank);
    }
    if (own.size() == js.size()) return js;
    return own;
  }

  // Stops these workers (`sig`, the grace period, SIGKILL), the others
  // untouched.
  void StopProcesses(std::vector<Worker> ws, int sig = SIGTERM) {
    if (ws.empty()) return;
    WorkerGroup group(*launcher_, clock_);
    for (Worker& w : ws) {
      const int rank = w.global_rank;
      group.Adopt(std::move(w), rank);
    }
    group.Stop(
        sig, grace_period_, [this](TimePoint d) { return WaitWhileStopping(d); },
        [this](const std::string& msg) { Log(msg); });
  }

  // Keeps survivor `w` as local rank j of this round: the variables that
  // changed go to its block, then kReady (inplace_layout.h, step 4). False
  // when they could not be published (it is stopped, to be started again).
  bool KeepInPlace(int j, Worker w) {
    const rdzv::Assignment& a = *assignment_;
    SpawnSpec spec = RoundSpec(j, w.error_file);
    const Env changed = ChangedVariables(worker_env_[j], spec.env);
    if (absl::Status st = inplace_->Publish(j, changed, round_); !st.ok()) {
      Log(absl::StrCat("in place: worker rank ", w.global_rank, ": ", st.message(),
                       "; restarting it as a process"));
      std::vector<Worker> one;
      one.push_back(std::move(w));
      StopProcesses(std::move(one));
      return false;
    }
    worker_env_[j] = std::move(spec.env);
    const pid_t pid = w.child->pid();
    workers_.Adopt(std::move(w), a.base_rank + j);
    if (monitoring_) monitoring_->WorkerStarted(j, pid);
    awaiting_ack_.insert(j);
    return true;
  }

  // While survivors owe their acknowledgement: those that gave it are done;
  // past kInplaceAckTimeout, the others are restarted as processes into the
  // same round, each with one line.
  void CheckAcks() {
    if (!ack_due_ || !inplace_) return;
    for (auto it = awaiting_ack_.begin(); it != awaiting_ack_.end();) {
      if (inplace_->Acked(*it)) {
        inplace_->SetRunning(*it);
        it = awaiting_ack_.erase(it);
      } else {
        ++it;
      }
    }
    if (awaiting_ack_.empty()) {
      ack_due_.reset();
      return;
    }
    if (clock_.Now() < *ack_due_) return;
    ack_due_.reset();
    // Who to restart now: at the first deadline, the unacknowledged workers
    // whose Python stack is not inside a PyTorch collective (a hung worker,
    // stuck in its own code); those waiting inside one get one more deadline,
    // since their collective fails once the worker they wait for is gone.
    // At the second deadline, or without stacks, every one left.
    const std::set<int> now = ack_retry_ ? awaiting_ack_ : StuckInOwnCode(awaiting_ack_);
    std::set<int> late;  // of `now`, those still running
    for (const Worker& w : workers_.workers()) {
      const int j = w.local_rank;
      if (now.count(j) == 0 || !w.child || w.exit) continue;
      Log(absl::StrCat("in place: worker rank ", w.global_rank, " (pid ", w.child->pid(),
                       ") did not re-form within ", SecondsOf(kInplaceAckTimeout),
                       " s (stuck in a call that cannot be interrupted?); restarting it as a "
                       "process"));
      late.insert(j);
      awaiting_ack_.erase(j);
    }
    if (!awaiting_ack_.empty() && !ack_retry_) {
      ack_retry_ = true;
      ack_due_ = clock_.Now() + kInplaceAckTimeout;
      std::vector<int> ranks;
      for (int j : awaiting_ack_) ranks.push_back(assignment_->base_rank + j);
      Log(absl::StrCat("in place: rank(s) ", absl::StrJoin(ranks, ","),
                       " wait inside a PyTorch collective; giving them another ",
                       SecondsOf(kInplaceAckTimeout), " s to re-form"));
    } else {
      awaiting_ack_.clear();
    }
    // Stuck in a call: SIGTERM's handler would never run, so no grace period.
    RestartAsProcesses(late, SIGKILL);
  }

  // Local ranks `js` of this round start again as fresh processes (the
  // caller said why, one line each): those still running are stopped first
  // (`sig`, the grace period, SIGKILL), the node's other workers are kept as
  // they are. A spawn that fails is a failure the round loop sees.
  void RestartAsProcesses(const std::set<int>& js, int sig) {
    if (js.empty()) return;
    std::vector<Worker> all = workers_.TakeWorkers();
    std::vector<Worker> doomed;
    for (Worker& w : all) {
      if (js.count(w.local_rank) != 0) {
        if (w.child && !w.exit) doomed.push_back(std::move(w));
      } else {
        const int rank = w.global_rank;
        workers_.Adopt(std::move(w), rank);
      }
    }
    StopProcesses(std::move(doomed), sig);
    for (int j : js) {
      if (j >= 0 && static_cast<std::size_t>(j) < exit_seen_.size()) exit_seen_[j] = false;
      (void)SpawnOne(j);
    }
    UpdateTimerPids();
  }

  // --restart_policy=inplace: a survivor kept into this round that exits
  // before acknowledging it (an SDK program that ends on PeerLostError
  // instead of calling ddp::Reconfigure, say) is a casualty of the failure
  // being recovered from, not a new one: it is started again as a process
  // into this round, with one line, and spends no restart.
  void RespawnUnackedExits() {
    if (awaiting_ack_.empty()) return;
    std::set<int> exited;
    for (const Worker& w : workers_.workers()) {
      if (!w.exit || awaiting_ack_.count(w.local_rank) == 0) continue;
      Log(absl::StrCat("in place: worker rank ", w.global_rank, " exited with ", w.exit->Describe(),
                       " before it re-formed into this round (a program that does not call "
                       "ddp::Reconfigure or run under ddprun.inprocess.run); starting it as a "
                       "process, within the same recovery"));
      exited.insert(w.local_rank);
      awaiting_ack_.erase(w.local_rank);
    }
    if (awaiting_ack_.empty()) ack_due_.reset();
    RestartAsProcesses(exited, SIGTERM);
  }

  // --restart_policy=inplace, a job of several nodes: whether the failed
  // exits seen now may wait for a restart decided elsewhere, up to
  // kCasualtyWindow from the first (docs/recovery.md). Only when every one
  // of them is a worker that registered to re-form in its process and
  // exited with an exit code: such a worker may have ended on its failed
  // collective (a peer on another node failed or was lost) before this agent
  // heard of it. If the restart comes, the exit is part of that recovery
  // (Monitor); if not, it is this node's failure. A worker killed by a
  // signal, one that never registered, or the job's last attempt: at once.
  bool AwaitRestartForExits() {
    if (!InplacePolicy() || !inplace_ || !assignment_ || assignment_->group_world_size < 2 ||
        LastAttempt()) {
      return false;
    }
    for (const Worker& w : workers_.workers()) {
      if (!w.exit || w.exit->ok() || w.stopped_by_agent) continue;
      if (w.exit->signal != 0 || !w.child || !inplace_->Registered(w.local_rank, w.child->pid())) {
        return false;
      }
    }
    if (!exit_window_) exit_window_ = clock_.Now() + kCasualtyWindow;
    return clock_.Now() < *exit_window_;
  }

  // The restart `reason` came while AwaitRestartForExits waited: the exits
  // it held belong to this recovery. One line each; the workers start again
  // as processes into the next round (they are not alive to keep).
  void SayFoldedExits(const std::string& reason) {
    if (!exit_window_) return;
    exit_window_.reset();
    for (const Worker& w : workers_.workers()) {
      if (!w.exit || w.exit->ok() || w.stopped_by_agent) continue;
      Log(absl::StrCat("in place: worker rank ", w.global_rank, " exited with ", w.exit->Describe(),
                       " as the job restarts (", reason,
                       "); it is part of that recovery and starts again as a process, spending "
                       "no restart of its own"));
    }
  }

  // The WorkerGroup's wait: the event queue until `deadline`. A terminating
  // signal escalates the stop (and is deferred for the caller's loop).
  bool WaitWhileStopping(TimePoint deadline) {
    auto e = events_.PopUntil(deadline);
    if (!e) return true;
    if (auto* s = std::get_if<SignalEvent>(&*e)) {
      if (Terminates(s->signo)) {
        Log(absl::StrCat("received ", SignalName(s->signo),
                         " while stopping workers; killing them now"));
        deferred_.push_back(std::move(*e));  // the caller's loop still acts on it
        return false;
      }
      ForwardNonTerminating(s->signo);
    } else if (std::holds_alternative<StreamEvent>(*e)) {
      deferred_.push_back(std::move(*e));
    }
    return true;
  }

  // A restart's recovery begins: a new budget record (recovery_budget.h);
  // one it supersedes (a failure during recovery) is said on the console.
  void BeginRecovery(std::string cause, std::optional<TimePoint> detected_at = std::nullopt) {
    if (InplacePolicy()) cause = "in place: " + cause;
    if (auto old = recovery_.Failure(round_, std::move(cause), detected_at)) {
      Say(FormatRecovery(options_.job_id, *old));
    }
  }

  // The first failed worker's exit as the group saw it: the budget's cause
  // and its start; nullopt when none exited on its own (a spawn failed).
  std::optional<std::pair<std::string, TimePoint>> FirstWorkerFailure() const {
    std::optional<std::pair<std::string, TimePoint>> first;
    for (const Worker& w : workers_.workers()) {
      if (!w.exit || w.exit->ok() || w.stopped_by_agent) continue;
      if (!first || w.exit_seen < first->second) {
        first.emplace(
            absl::StrCat("worker rank ", w.global_rank, " exited with ", w.exit->Describe()),
            w.exit_seen);
      }
    }
    return first;
  }

  // While a recovery waits for its first step: a step of any local worker
  // of the new round closes it, with its line on the console and the record
  // in the next metrics reports.
  void CheckFirstStep() {
    if (!recovery_.WaitingForStep() || !monitoring_ || monitoring_->MaxSteps() <= 0) return;
    if (auto r = recovery_.FirstStep()) {
      Say(FormatRecovery(options_.job_id, *r));
      monitoring_->SetRecovery(*r);
    }
  }

  void StopWorkers(int sig) {
    if (monitoring_) monitoring_->EndRound();
    // The round's successor may be gone; the next round names its own.
    if (replicas_) replicas_->ClearSuccessor();
    workers_.Stop(
        sig, grace_period_, [this](TimePoint d) { return WaitWhileStopping(d); },
        [this](const std::string& msg) { Log(msg); });
    UpdateTimerPids();
  }

  std::vector<rdzv::WorkerFailure> Failures() {
    return CollectFailures(workers_, advertised_host_, assignment_ ? assignment_->round : round_,
                           *logs_);
  }

  // The job's failure report, one block on stderr, first failure first.
  void PrintJobFailure(const std::string& reason,
                       const std::vector<rdzv::WorkerFailure>& failures) {
    if (logs_) logs_->Sync();  // the workers' last output comes before the report
    const std::string block =
        FormatJobFailure(options_.job_id, reason, failures) +
        MissingModuleHint(failures, options_.command.empty() ? "" : options_.command[0]) +
        CheckpointResumeLine() + RecoveryLines();
    std::fputs(block.c_str(), stderr);
    std::fflush(stderr);
    WriteLauncherErrorFile(failures);
  }

  // The failure report's lines on this node's restarts: the budget of each
  // (the last RecoveryTracker::kKept), an open one closed as the job ends.
  std::string RecoveryLines() {
    (void)recovery_.Finish();
    std::string out;
    for (const rdzv::RecoveryBudget& r : recovery_.records()) {
      absl::StrAppend(&out, "ddprun:   recovery: ", FormatRecovery(options_.job_id, r), "\n");
    }
    return out;
  }

  // The failure report's line on checkpoints: the step a job started again
  // resumes from (the newest step every local rank committed, which the
  // job's end persists to --ckpt_dir), or that it is lost without
  // --ckpt_dir. Empty when nothing was committed.
  std::string CheckpointResumeLine() const {
    if (!checkpoints_) return "";
    const int n = checkpoints_->size();
    std::optional<std::int64_t> newest;
    std::vector<std::int64_t> common;
    if (n > 0 && assignment_) {
      common = checkpoints_->CommonSteps(n, assignment_->base_rank, assignment_->world_size);
    }
    if (!common.empty()) newest = common.back();
    if (!newest) return "";
    if (persister_) {
      return absl::StrCat("ddprun:   checkpoint: a job started again with --ckpt_dir ",
                          options_.ckpt_dir, " resumes from step ", *newest,
                          " (this node's newest committed step, persisted at the job's end)\n");
    }
    return absl::StrCat("ddprun:   checkpoint: step ", *newest,
                        " was committed in memory and ends with this job; --ckpt_dir DIR keeps "
                        "it for a job started again\n");
  }

  // The background checkpoint threads (background_priority.h) onto the CPUs
  // of this agent's affinity that no worker of the round's binding
  // (spawn_plan_) is bound to; all of them when it binds nothing or every
  // CPU (said once). Main thread, after the round's workers started.
  void ConfineBackgroundThreads() {
    if (persister_ == nullptr && replicas_ == nullptr) return;
    const BackgroundCpuSet set =
        spawn_plan_.empty() ? BackgroundCpuSet{} : BackgroundCpus(ReadAffinity(), spawn_plan_);
    const std::vector<int> before = background_.cpus();
    if (absl::Status st = background_.SetCpus(set.cpus); !st.ok() && !said_background_refused_) {
      Log(absl::StrCat("checkpoint: ", st.message(),
                       "; the background threads run where they were"));
      said_background_refused_ = true;
    }
    if (set.workers_take_all && !said_background_shared_) {
      Log(absl::StrCat(
          "checkpoint: no CPU this node's ddprun may use (", FormatCpuList(ReadAffinity()),
          ") is free of workers, so the background checkpoint threads share the workers' CPUs "
          "and may slow the steps; "
          "run fewer workers than cores (or let ddprun use more CPUs) to keep a core for them"));
      said_background_shared_ = true;
    }
    if (!set.cpus.empty() && set.cpus != before) {
      std::vector<std::string> names;
      if (persister_) names.push_back(kPersistThreadName);
      if (replicas_)
        names.insert(names.end(), {kSendThreadName, kAcceptThreadName, kReceiveThreadName});
      Log(absl::StrCat("checkpoint: the background threads (", absl::StrJoin(names, ", "),
                       ") run on CPU(s) ", FormatCpuList(set.cpus),
                       ", which no worker is bound to"));
    }
  }

  // --numa_binding: each worker on its GPU's NUMA node; without an NVIDIA
  // GPU, one line and nothing is bound (as torchrun, which binds only GPUs).
  std::vector<std::vector<int>> PlanNumaBinding(int nproc) {
    auto cvd = base_env_.find("CUDA_VISIBLE_DEVICES");
    const std::vector<int> nodes =
        GpuNumaNodes(nproc, cvd == base_env_.end() ? std::string() : cvd->second);
    const char* mode = NumaBindingName(options_.numa_binding);
    if (nodes.empty()) {
      if (!warned_numa_) {
        Log(absl::StrCat("--numa_binding=", mode,
                         ": no NVIDIA GPU on this node, so no worker is bound"));
      }
      warned_numa_ = true;
      return {};
    }
    std::vector<std::vector<int>> plan =
        PlanGpuNumaBinding(options_.numa_binding, nodes, ReadCpuTopology());
    if (!warned_numa_) {
      std::vector<std::string> parts;
      for (std::size_t i = 0; i < plan.size(); ++i) {
        parts.push_back(absl::StrCat(
            i, ":",
            nodes[i] < 0 ? "unbound"
                         : "node " + std::to_string(nodes[i]) + " CPUs " +
                               (plan[i].empty() ? std::string("none") : FormatCpuList(plan[i]))));
      }
      Log(absl::StrCat("--numa_binding=", mode, ": local rank ", absl::StrJoin(parts, "; ")));
      warned_numa_ = true;
    }
    return plan;
  }

  // torchrun's reply to a scheduler: the root cause in the launcher's own
  // TORCHELASTIC_ERROR_FILE, when it has one (failure_report.h).
  void WriteLauncherErrorFile(const std::vector<rdzv::WorkerFailure>& failures) {
    auto it = base_env_.find("TORCHELASTIC_ERROR_FILE");
    if (it == base_env_.end() || it->second.empty() || failures.empty()) return;
    const rdzv::WorkerFailure& root = failures.front();
    std::string root_file;
    if (root.host == advertised_host_) {
      for (const Worker& w : workers_.workers()) {
        if (w.local_rank != root.local_rank || w.error_file.empty()) continue;
        std::ifstream in(w.error_file, std::ios::binary);
        root_file.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      }
    }
    std::ofstream out(it->second, std::ios::binary | std::ios::trunc);
    out << LauncherErrorFileJson(root, root_file);
    out.close();
    if (!out) {
      Log(absl::StrCat("could not write the job's error to TORCHELASTIC_ERROR_FILE=", it->second,
                       ": ", std::strerror(errno)));
    }
  }

  // ------------------------------------------------------------ the loop

  int RunRounds() {
    if (options_.command.empty()) {
      Log("no worker command; give the program to run after the flags");
      return kExitUsage;
    }
    absl::Status st = session_->Open(clock_.Now() + join_timeout_, [this] { return TakeSignal(); });
    if (pending_signal_) return ExitForSignal(pending_signal_);
    if (!st.ok()) {
      Log(std::string(st.message()));
      return rdzv::IsUsageMistake(st) ? kExitUsage : kExitRendezvousError;
    }
    advertised_host_ = session_->advertised_host();
    StartMonitoring();
    while (true) {
      std::optional<int> rc = RunOneRound();
      if (!rc) continue;
      // --restart_policy=inplace keeps survivors across the re-join: no
      // path out of the loop leaves one running.
      workers_.Poll();
      if (workers_.AnyAlive()) StopWorkers(SIGTERM);
      return *rc;
    }
  }

  // While this node re-joins after a restart: whether the job runs again
  // without it (it became the hot spare: a spare took the seat of the node
  // whose worker failed). Then its open recovery record ends there, saying
  // so (no first step will come here), and under --restart_policy=inplace
  // the survivors it kept, which have no seat, are stopped with one line
  // instead of waiting until their ready timeout or the job's end. Asks the
  // rendezvous only while there is a record or a survivor to settle.
  void CheckBecameSpare() {
    workers_.Poll();
    const bool kept = InplacePolicy() && workers_.AnyAlive();
    if (!kept && !recovery_.open()) return;
    auto status = session_->JobStatus(kStatusTimeout);
    if (!status.ok() || status->state != "running") return;
    const std::int64_t self = ::getpid();
    for (const rdzv::NodeInfo& n : status->nodes) {
      if (n.pid == self) return;  // still a member: the assignment is on its way
    }
    if (auto r = recovery_.BecameSpare()) {
      Say(FormatRecovery(options_.job_id, *r));
      became_spare_ = true;
    }
    if (!kept) return;
    Log(absl::StrCat("in place: the job runs round ", status->round,
                     " without this node (it is a spare now); stopping the workers it kept, "
                     "which have no seat"));
    StopWorkers(SIGTERM);
  }

  // A fixed-size job re-forming after a member left: say what the round
  // waits for and until when (the join timeout, then exit 3).
  void AnnounceReplacementWait(TimePoint joined_at) {
    const TimePoint until = joined_at + join_timeout_;
    const auto left = std::chrono::duration_cast<seconds>(until - clock_.Now()).count();
    std::string joined;
    if (auto status = session_->JobStatus(kStatusTimeout); status.ok()) {
      joined = absl::StrCat(status->nodes.size(), " of ", options_.max_nodes, " nodes");
    } else {
      joined = absl::StrCat("fewer than ", options_.max_nodes, " nodes");
    }
    Log(absl::StrCat("a node left this fixed-size job (--nnodes=", options_.max_nodes,
                     "): waiting for a replacement, ", joined,
                     " have joined; the job fails "
                     "with exit code ",
                     kExitRendezvousError, " unless ", options_.max_nodes, " nodes join by ",
                     rdzv::WallClockAfter(until - clock_.Now()), " (in ", left,
                     " s, --rdzv_conf join_timeout)"));
  }

  // What this node's join waits for, asked of the rendezvous when the wait's
  // line is due: the other nodes until the join timeout, or, for an elastic
  // job at its minimum, last_call_timeout's end (first seen at `min_reached`).
  rdzv::WaitState DescribeJoinWait(TimePoint joined_at, std::optional<TimePoint>& min_reached) {
    const int min = options_.min_nodes;
    const int max = options_.max_nodes;
    rdzv::WaitState w;
    w.what = absl::StrCat("waiting for the other nodes of this job (--nnodes=",
                          min == max ? absl::StrCat(max) : absl::StrCat(min, ":", max), ")");
    w.until = joined_at + join_timeout_;
    w.then = absl::StrCat("exit ", kExitRendezvousError, " (--rdzv_conf join_timeout)");
    auto status = session_->JobStatus(kStatusTimeout);
    if (!status.ok()) return w;  // how many joined is unknown; the rest holds
    const int joined = static_cast<int>(status->nodes.size());
    if (status->state == "running") {
      w.what = "waiting as a spare for a seat in the running job";
      w.progress = absl::StrCat(joined, " node(s) run it");
      return w;
    }
    w.progress = absl::StrCat(joined, " of ", max, " nodes have joined");
    if (status->join_deadline_in_s > 0) {
      w.until = clock_.Now() + rdzv::Seconds(status->join_deadline_in_s);
    }
    if (min < max && joined >= min) {
      if (!min_reached) min_reached = clock_.Now();
      w.what = absl::StrCat("the job has its minimum of ", min,
                            " nodes; waiting --rdzv_conf last_call_timeout (",
                            options_.policy.last_call_timeout_s, " s) for more, up to ", max);
      w.until = *min_reached + last_call_timeout_;
      w.then = "the round starts with the nodes that joined";
    }
    return w;
  }

  // One round: join, run the workers, react. nullopt: join the next round.
  std::optional<int> RunOneRound() {
    const bool rejoin_after_departure = assignment_.has_value() && membership_changed_ &&
                                        options_.min_nodes == options_.max_nodes &&
                                        options_.max_nodes > 1;
    assignment_.reset();
    if (absl::Status st = session_->PrepareRound(); !st.ok()) {
      Log(std::string(st.message()));
      return kExitRendezvousError;
    }
    StartJoin();
    const TimePoint joined_at = clock_.Now();
    const TimePoint deadline = joined_at + join_timeout_ + last_call_timeout_ + kJoinSlack;
    bool announced = !rejoin_after_departure;
    bool replica_noted = false;
    bool rejoin_noted = false;
    // A wait for the other nodes says so after 5 s and every minute (the
    // replacement of a lost node has its own line first).
    std::optional<TimePoint> min_reached;
    rdzv::WaitNotice notice(
        clock_, [&] { return DescribeJoinWait(joined_at, min_reached); },
        [this](const std::string& line) { Log(line); });
    TimePoint spare_check = joined_at + kSpareCheckInterval;
    while (!assignment_) {
      if (announced) notice.Poll();
      TimePoint wake = std::min(deadline, notice.due());
      if (clock_.Now() >= spare_check) {
        CheckBecameSpare();
        spare_check = clock_.Now() + kSpareCheckInterval;
      }
      if (recovery_.open() || (InplacePolicy() && workers_.AnyAlive())) {
        wake = std::min(wake, spare_check);
      }
      if (!announced) wake = std::min(wake, joined_at + kReplacementNotice);
      auto e = NextEvent(wake);
      if (!e && !announced && clock_.Now() < deadline) {
        announced = true;
        AnnounceReplacementWait(joined_at);
        continue;
      }
      if (!e && clock_.Now() < deadline) continue;  // a notice is due
      if (!e) {
        Log(absl::StrCat("no assignment from the rendezvous at ", session_->endpoint(), " within ",
                         options_.policy.join_timeout_s,
                         " s; start the other nodes, or raise "
                         "--rdzv_conf join_timeout"));
        return kExitRendezvousError;
      }
      if (auto* s = std::get_if<SignalEvent>(&*e)) {
        if (Terminates(s->signo)) {
          Log(absl::StrCat("received ", SignalName(s->signo), " while joining; leaving"));
          return ExitForSignal(s->signo);
        }
        continue;
      }
      rdzv::RoundEvent* ev = CurrentStreamEvent(*e);
      if (ev == nullptr) continue;
      if (auto* a = std::get_if<rdzv::Assignment>(ev)) {
        assignment_ = std::move(*a);
      } else if (auto* r = std::get_if<rdzv::RestartRound>(ev)) {
        // Restarted again while re-forming: a failure during recovery.
        if (recovery_.open()) {
          BeginRecovery(r->reason);
          recovery_.Stopped();
        }
        OnRestart(*r);
        return std::nullopt;
      } else if (auto* c = std::get_if<rdzv::JobClosed>(ev)) {
        if (c->success) {
          // A hot spare of a job that succeeded: nothing went wrong here.
          Log(absl::StrCat("the job finished before this node was needed (", c->reason,
                           "); exiting"));
          return kExitSuccess;
        }
        Log(absl::StrCat("the job closed before this node was admitted (", c->reason,
                         "); start a new job with a different --rdzv_id"));
        return kExitRendezvousError;
      } else if (const absl::Status& st = std::get<absl::Status>(*ev);
                 session_->has_replicas() && rdzv::KindOf(st) == rdzv::ErrorKind::kConnection &&
                 clock_.Now() < deadline) {
        // A replica that stopped or is a standby (docs/ha.md): join the next
        // one, after a pause (during a fail-over no replica leads for ~ the
        // lease TTL). Signals queue meanwhile.
        if (!replica_noted) {
          Log(absl::StrCat("the rendezvous replica at ", session_->endpoint(), " cannot serve (",
                           st.message(), "); trying the other replicas"));
          replica_noted = true;
        }
        EndJoin();
        std::this_thread::sleep_for(milliseconds(100));
        (void)session_->WaitForConnected(
            std::min<Duration>(seconds(1), std::max<Duration>(deadline - clock_.Now(), {})));
        StartJoin();
      } else if (const absl::Status& st = std::get<absl::Status>(*ev);
                 !session_->has_replicas() && !session_->hosts_rendezvous() &&
                 rdzv::KindOf(st) == rdzv::ErrorKind::kConnection && clock_.Now() < deadline) {
        // ddprund went away while the round gathers (a restart with
        // --state_dir keeps the job): join the same endpoint again once it
        // answers, until this round's deadline. Signals queue meanwhile.
        if (!rejoin_noted) {
          Log(absl::StrCat("lost the rendezvous at ", session_->endpoint(), " while joining (",
                           st.message(), "); joining it again until ",
                           rdzv::WallClockAfter(deadline - clock_.Now())));
          rejoin_noted = true;
        }
        EndJoin();
        if (!RejoinAfterLoss(deadline)) continue;  // a signal or the deadline: the loop acts
        StartJoin();
      } else {
        RendezvousError(std::get<absl::Status>(*ev));
        return kExitRendezvousError;
      }
    }
    round_ = assignment_->round;
    if (became_spare_) {
      // Promoted back into a seat: this node's part of that recovery, from
      // its assignment (the failure that freed the seat was another node's).
      became_spare_ = false;
      BeginRecovery(absl::StrCat("this node, a hot spare, took a seat in round ", round_));
    }
    recovery_.RoundFormed(round_);
    membership_changed_ = false;
    const rdzv::Assignment& a = *assignment_;
    DDPRUN_DEBUG_LOG(kAgent) << rdzv::Fence(options_.job_id, round_) << "joined: node "
                             << a.group_rank << " of " << a.group_world_size << ", node id "
                             << a.node_id;
    Log(absl::StrCat("starting ", a.local_world_size, " worker(s): ranks ", a.base_rank, "-",
                     a.base_rank + a.local_world_size - 1, " of ", a.world_size, ", node ",
                     a.group_rank, " of ", a.group_world_size, ", master ",
                     rdzv::FormatHostPort(a.master_addr, a.master_port), ", restart ",
                     a.restart_count));
    if (options_.mode != RendezvousMode::kStatic && options_.node_rank >= 0 &&
        options_.node_rank != a.group_rank && !warned_node_rank_) {
      // c10d: --node_rank is a preference (torchrun ignores it there).
      warned_node_rank_ = true;
      Log(absl::StrCat("--node_rank=", options_.node_rank,
                       " was not this node's to take (another "
                       "node asked first, or ranks are assigned in order); it is node ",
                       a.group_rank,
                       ". With c10d --node_rank is a preference; torchrun ignores it"));
    }
    if (a.policy && !warned_policy_) {
      // The first joiner fixed the job's policy; once per run.
      warned_policy_ = true;
      const std::string warning = rdzv::PolicyWarning("this node", options_.policy, *a.policy);
      if (!warning.empty()) Log(warning);
    }
    if (absl::Status st = StartReplicas(); !st.ok()) {
      Log(std::string(st.message()));
      return kExitUsage;
    }
    if (a.group_rank == 0) {  // this agent's store serves every worker of the job
      const std::string warning =
          rdzv::StoreCapacityWarning(a.world_size, rdzv::RaiseOpenFileLimit());
      if (!warning.empty()) Log(warning);
    }
    if (!SpawnWorkers()) return OnWorkerFailure();
    recovery_.Started();
    if (!services_started_ && !services_due_) services_due_ = clock_.Now() + kServicesDelay;
    return Monitor();
  }

  // kServicesDelay after the first spawns (idempotent).
  void StartServicesIfDue() {
    if (!services_due_ || clock_.Now() < *services_due_) return;
    services_due_.reset();
    services_started_ = true;
    session_->WorkersStarted();
    if (monitoring_) monitoring_->Start();
  }

  // Waits, with backoff and until `deadline`, for the single rendezvous
  // endpoint to answer again. False when a terminating signal arrived first
  // (it is deferred for the caller's loop) or the deadline passed; then the
  // caller's loop acts on the signal or reports the timeout. Other events
  // are dropped, as the joining loop drops them.
  bool RejoinAfterLoss(TimePoint deadline) {
    auto backoff = milliseconds(20);
    while (clock_.Now() < deadline) {
      if (session_->WaitForConnected(std::min<Duration>(seconds(1), deadline - clock_.Now()))
              .ok()) {
        return true;
      }
      const TimePoint next_try = std::min(deadline, clock_.Now() + backoff);
      while (auto e = events_.PopUntil(next_try)) {
        auto* s = std::get_if<SignalEvent>(&*e);
        if (s == nullptr || !Terminates(s->signo)) continue;  // the old stream's, or ignored
        deferred_.push_back(std::move(*e));
        return false;
      }
      backoff = std::min(backoff * 2, milliseconds(500));
    }
    return false;
  }

  void OnRestart(const rdzv::RestartRound& r) {
    DDPRUN_DEBUG_LOG(kAgent) << rdzv::Fence(options_.job_id, round_) << "restart to round "
                             << r.next_round << " (" << r.reason << ")";
    round_ = r.next_round;
    membership_changed_ = !r.counts_as_failure;
  }

  std::optional<int> Monitor() {
    while (true) {
      const TimePoint poll_at = clock_.Now() + WorkerGroup::kPollInterval;
      TimePoint wake = poll_at;
      if (services_due_) wake = std::min(wake, *services_due_);
      const bool step_due = recovery_.WaitingForStep();
      if (step_due) wake = std::min(wake, clock_.Now() + recovery_.StepPollInterval());
      const bool ack_due = ack_due_.has_value();
      if (ack_due) wake = std::min(wake, clock_.Now() + kInplaceAckPoll);
      if (exit_window_) wake = std::min(wake, *exit_window_);
      auto e = NextEvent(wake);
      StartServicesIfDue();
      MaybeStartStandby();
      CheckFirstStep();
      CheckAcks();
      const bool window_over = exit_window_ && clock_.Now() >= *exit_window_;
      if (!e && (step_due || ack_due) && clock_.Now() < poll_at && !window_over) {
        continue;  // only the polls
      }
      if (!e || std::holds_alternative<ChildrenChanged>(*e)) {
        workers_.Poll();
        RespawnUnackedExits();
        UpdateMonitoredWorkers();
        UpdateTimerPids();
        if (workers_.AnyFailed()) {
          if (AwaitRestartForExits()) continue;
          return OnWorkerFailure();
        }
        if (!workers_.AnyAlive()) return OnSuccess();
        continue;
      }
      if (auto* s = std::get_if<SignalEvent>(&*e)) {
        if (Terminates(s->signo)) return OnSignal(s->signo);
        ForwardNonTerminating(s->signo);  // SIGUSR1/2 when asked; workers keep running
        continue;
      }
      rdzv::RoundEvent* ev = CurrentStreamEvent(*e);
      if (ev == nullptr) continue;
      if (auto* r = std::get_if<rdzv::RestartRound>(ev)) {
        if (!options_.replace_lost_nodes && !r->counts_as_failure) {
          Log(absl::StrCat("stopping the workers: ", r->reason,
                           ", and this job cannot take a replacement node"));
          StopWorkers(SIGTERM);
          return kExitRendezvousError;
        }
        BeginRecovery(r->reason);
        if (InplacePolicy()) {
          Log(absl::StrCat("re-forming in place (--restart_policy=inplace): ", r->reason));
          SayFoldedExits(r->reason);
          BreakSurvivors();
        } else {
          Log(absl::StrCat("restarting the workers: ", r->reason));
          StopWorkers(SIGTERM);
        }
        recovery_.Stopped();
        OnRestart(*r);
        return std::nullopt;
      }
      if (auto* c = std::get_if<rdzv::JobClosed>(ev)) {
        StopWorkers(SIGTERM);
        if (c->success) return kExitSuccess;
        PrintJobFailure(c->reason, c->failures);
        return kExitWorkerFailed;
      }
      if (auto* st = std::get_if<absl::Status>(ev)) {
        if (rdzv::KindOf(*st) == rdzv::ErrorKind::kConnection && !session_->hosts_rendezvous()) {
          switch (Reattach(*st)) {
            case ReattachResult::kResumed:
              continue;  // same round, workers untouched
            case ReattachResult::kRestart:
              BeginRecovery("the round restarted while the agent re-attached");
              StopWorkers(SIGTERM);
              recovery_.Stopped();
              return std::nullopt;
            case ReattachResult::kSignal:
            case ReattachResult::kFailed:
              break;
          }
          if (!deferred_.empty()) continue;  // a signal or worker exit to act on
        }
        Log(absl::StrCat("lost the rendezvous: ", st->message(), "; stopping the workers"));
        StopWorkers(SIGTERM);
        return kExitRendezvousError;
      }
    }
  }

  enum class ReattachResult { kResumed, kRestart, kSignal, kFailed };

  // The rendezvous went away mid-round (ddprund restarting, a network blip).
  // The workers keep running while the agent re-joins its own round with
  // backoff, for up to kReattachWindow. Worker exits and signals that arrive
  // meanwhile are deferred for the caller's loop.
  ReattachResult Reattach(const absl::Status& why) {
    Log(absl::StrCat("lost the rendezvous (", why.message(), "); the workers keep running while ",
                     "re-attaching for up to ", SecondsOf(kReattachWindow), " s"));
    const TimePoint deadline = clock_.Now() + kReattachWindow;
    auto backoff = milliseconds(20);
    TimePoint next_try = clock_.Now();
    while (clock_.Now() < deadline) {
      // Until the next try, anything but stream events is for the caller.
      while (auto e = events_.PopUntil(std::min(next_try, deadline))) {
        if (std::holds_alternative<StreamEvent>(*e)) continue;
        deferred_.push_back(std::move(*e));
        EndJoin();
        return ReattachResult::kSignal;
      }
      if (clock_.Now() >= deadline) break;
      if (session_->WaitForConnected(std::min<Duration>(seconds(1), deadline - clock_.Now()))
              .ok()) {
        resuming_ = true;
        StartJoin();
        resuming_ = false;
        std::optional<Event> e;
        while ((e = events_.PopUntil(std::min(deadline, clock_.Now() + kReattachAnswer)))) {
          auto* se = std::get_if<StreamEvent>(&*e);
          if (se == nullptr || se->stream_id == stream_id_) break;  // skip stale stream events
        }
        if (e && !CurrentStreamEvent(*e)) {
          deferred_.push_back(std::move(*e));
          EndJoin();
          return ReattachResult::kSignal;
        }
        if (e) {
          rdzv::RoundEvent* ev = CurrentStreamEvent(*e);
          if (auto* a = std::get_if<rdzv::Assignment>(ev)) {
            if (a->round == assignment_->round) {
              Log("re-attached to the rendezvous; the round goes on");
              return ReattachResult::kResumed;
            }
          } else if (auto* r = std::get_if<rdzv::RestartRound>(ev)) {
            Log(absl::StrCat("re-attached, but ", r->reason, "; restarting the workers"));
            OnRestart(*r);
            return ReattachResult::kRestart;
          } else if (auto* st = std::get_if<absl::Status>(ev);
                     st && rdzv::KindOf(*st) != rdzv::ErrorKind::kConnection &&
                     !absl::IsCancelled(*st)) {
            Log(absl::StrCat("cannot re-attach: ", st->message()));
            return ReattachResult::kFailed;
          } else if (std::holds_alternative<rdzv::JobClosed>(*ev)) {
            deferred_.push_back(std::move(*e));
            return ReattachResult::kSignal;
          }
        }
      }
      next_try = clock_.Now() + backoff;
      // Replicas (docs/ha.md): one of them leads within the lease TTL; look often.
      backoff =
          std::min(backoff * 2, session_->has_replicas() ? milliseconds(100) : milliseconds(500));
    }
    return ReattachResult::kFailed;
  }

  // With ddprund replicas (docs/ha.md): the failure report goes to the replica
  // that leads, trying the others for up to kReattachWindow while a fail-over
  // runs. Reported elsewhere than on the Join stream's replica, the agent
  // re-joins its round there, to hear the decision (RestartRound or JobClosed).
  void ReportToReplicas(rdzv::Outcome outcome, const std::vector<rdzv::WorkerFailure>& failures) {
    if (!assignment_) return;
    const TimePoint deadline = clock_.Now() + kReattachWindow;
    bool moved = false;
    absl::Status st;
    while (true) {
      st = session_->Report(*assignment_, outcome, failures, kReportTimeout);
      if (st.ok() || rdzv::KindOf(st) != rdzv::ErrorKind::kConnection || clock_.Now() >= deadline) {
        break;
      }
      moved = true;
      std::this_thread::sleep_for(milliseconds(100));
      (void)session_->WaitForConnected(seconds(1));
    }
    if (!st.ok()) {
      // A stale round (the job moved on meanwhile) is answered by the re-join.
      Log(absl::StrCat("could not report to the rendezvous: ", st.message()));
      if (rdzv::KindOf(st) == rdzv::ErrorKind::kConnection) return;
    }
    if (moved) {
      resuming_ = true;
      StartJoin();
      resuming_ = false;
    }
  }

  // Whether the rendezvous will end the job on this failure rather than
  // restart it: the round's restart count has reached the job's limit.
  bool LastAttempt() const {
    if (!assignment_) return true;
    const rdzv::JobPolicy& policy = assignment_->policy ? *assignment_->policy : options_.policy;
    return assignment_->restart_count >= policy.max_restarts;
  }

  std::optional<int> OnWorkerFailure() {
    if (LastAttempt()) {
      workers_.WaitUntil(clock_.Now() + kFailureSettle,
                         [this](TimePoint d) { return WaitWhileStopping(d); });
      UpdateMonitoredWorkers();
    } else if (auto first = FirstWorkerFailure()) {
      BeginRecovery(first->first, first->second);
    } else {
      BeginRecovery("a worker could not be started");
    }
    std::vector<rdzv::WorkerFailure> failures = Failures();
    const bool in_place = InplacePolicy() && !LastAttempt();
    for (const auto& f : failures) {
      DDPRUN_DEBUG_LOG(kAgent) << rdzv::Fence(options_.job_id, round_)
                               << "worker exit: " << DescribeFailure(f);
      Log(DescribeFailure(f) + (in_place ? "; the node's other workers keep their processes "
                                           "(--restart_policy=inplace)"
                                         : "; stopping the node's other workers"));
    }
    if (in_place) {
      BreakSurvivors();
    } else {
      StopWorkers(SIGTERM);
    }
    recovery_.Stopped();
    if (session_->has_replicas()) {
      ReportToReplicas(rdzv::Outcome::kFailed, failures);
    } else {
      ReportBestEffort(rdzv::Outcome::kFailed, failures);
    }
    const TimePoint deadline = clock_.Now() + kDecisionTimeout;
    while (true) {
      auto e = NextEvent(deadline);
      if (!e) {
        if (in_place) StopWorkers(SIGTERM);
        PrintJobFailure(absl::StrCat("no decision from the rendezvous within ",
                                     SecondsOf(kDecisionTimeout), " s of reporting the failure"),
                        failures);
        return kExitWorkerFailed;
      }
      if (auto* s = std::get_if<SignalEvent>(&*e)) {
        if (!Terminates(s->signo)) continue;
        Log(absl::StrCat("received ", SignalName(s->signo), "; leaving"));
        if (in_place) StopWorkers(s->signo);
        ReportBestEffort(rdzv::Outcome::kLeaving, {});
        return ExitForSignal(s->signo);
      }
      rdzv::RoundEvent* ev = CurrentStreamEvent(*e);
      if (ev == nullptr) continue;
      if (auto* r = std::get_if<rdzv::RestartRound>(ev)) {
        Log(absl::StrCat(in_place ? "restarting in place: " : "restarting: ", r->reason));
        OnRestart(*r);
        return std::nullopt;
      }
      if (auto* c = std::get_if<rdzv::JobClosed>(ev)) {
        if (in_place) StopWorkers(SIGTERM);
        PrintJobFailure(c->reason, c->failures.empty() ? failures : c->failures);
        return kExitWorkerFailed;
      }
      if (auto* st = std::get_if<absl::Status>(ev)) {
        if (in_place) StopWorkers(SIGTERM);
        PrintJobFailure(absl::StrCat("lost the rendezvous after a worker failure: ", st->message()),
                        failures);
        return kExitWorkerFailed;
      }
    }
  }

  std::optional<int> OnSuccess() {
    if (monitoring_) monitoring_->EndRound();
    DDPRUN_DEBUG_LOG(kAgent) << rdzv::Fence(options_.job_id, round_)
                             << "every worker exited 0; reporting success";
    if (session_->has_replicas()) {
      ReportToReplicas(rdzv::Outcome::kSucceeded, {});
    } else {
      ReportBestEffort(rdzv::Outcome::kSucceeded, {});
    }
    // Wait for the job to end, so that a node hosting the rendezvous or the
    // master store stays up for the others (torchrun's exit barrier). A host
    // waits until the end; the others give up after kExitBarrier.
    const bool host =
        session_->hosts_rendezvous() ||
        (assignment_ && assignment_->group_rank == 0 && assignment_->group_world_size > 1);
    TimePoint deadline = clock_.Now() + kExitBarrier;
    while (true) {
      auto e = NextEvent(deadline);
      if (!e) {
        if (host) {
          deadline = clock_.Now() + kExitBarrier;
          Log("workers succeeded; still serving the other nodes until the job ends");
          continue;
        }
        Log("workers succeeded; the other nodes are still running, exiting anyway");
        return kExitSuccess;
      }
      if (auto* s = std::get_if<SignalEvent>(&*e)) {
        if (Terminates(s->signo)) return ExitForSignal(s->signo);
        continue;
      }
      rdzv::RoundEvent* ev = CurrentStreamEvent(*e);
      if (ev == nullptr) continue;
      if (auto* c = std::get_if<rdzv::JobClosed>(ev)) {
        if (c->success) return kExitSuccess;
        PrintJobFailure(c->reason, c->failures);
        return kExitWorkerFailed;
      }
      // The job restarts as a whole: ranks that finished run again with the
      // others (a DDP job needs every rank), so join the next round.
      if (auto* r = std::get_if<rdzv::RestartRound>(ev)) {
        Log(absl::StrCat("the job restarts (", r->reason, "); running this node's workers again"));
        BeginRecovery(r->reason);
        recovery_.Stopped();  // nothing ran here to stop
        OnRestart(*r);
        return std::nullopt;
      }
      // A re-join after reporting to another replica (ReportToReplicas) gets
      // its round's Assignment back first: wait on for the job's decision.
      if (std::holds_alternative<rdzv::Assignment>(*ev)) continue;
      // The end of the stream: this node's part is done.
      return kExitSuccess;
    }
  }

  int OnSignal(int sig) {
    Log(absl::StrCat("received ", SignalName(sig), "; forwarding it to the workers"));
    // A preemption warning: the newest committed step goes to --ckpt_dir
    // while the workers stop, and whatever they commit meanwhile after,
    // all within the grace period.
    const auto persist_by =
        std::chrono::steady_clock::now() +
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(grace_period_);
    if (persister_) persister_->RequestFlush();
    StopWorkers(sig);
    if (persister_)
      persister_->Flush(persist_by, absl::StrCat(SignalName(sig), ", within the grace period"));
    ReportBestEffort(rdzv::Outcome::kLeaving, {});
    return ExitForSignal(sig);
  }

  // ---------------------------------------------------------------- state

  const AgentOptions options_;
  const rdzv::Clock& clock_;
  std::unique_ptr<ProcessLauncher> launcher_;
  std::unique_ptr<RendezvousSession> session_;
  std::unique_ptr<EventQueue> own_events_;  // when the caller gave none
  EventQueue& events_;
  // The options' durations, converted once.
  const Duration join_timeout_;
  const Duration last_call_timeout_;
  const Duration grace_period_;

  std::optional<SignalWatcher> watcher_;  // with own_events_ only
  bool warned_numa_ = false;
  bool warned_node_rank_ = false;
  bool warned_policy_ = false;
  Env base_env_;
  std::deque<Event> deferred_;
  int pending_signal_ = 0;  // a terminating signal seen during Open()
  bool resuming_ = false;   // MakeJoinSpec asks to re-attach to assignment_
  std::uint64_t stream_id_ = 0;
  std::string advertised_host_;

  std::int64_t round_ = 0;
  std::optional<rdzv::Assignment> assignment_;
  // Each restart's recovery budget on this node (docs/recovery.md).
  RecoveryTracker recovery_{clock_, options_.job_id};
  // The last restart was a membership change (a node left or was lost),
  // not a worker failure.
  bool membership_changed_ = false;
  // This node's last recovery record ended as "spare" (CheckBecameSpare).
  bool became_spare_ = false;
  WorkerGroup workers_;
  std::unique_ptr<WorkerLogs> logs_;        // set by Run()
  std::unique_ptr<Monitoring> monitoring_;  // set once the session is open
  // When the side services start (kServicesDelay), until they have.
  std::optional<TimePoint> services_due_;
  bool services_started_ = false;
  std::vector<bool> exit_seen_;  // by local rank: exit sent to monitoring
  // The file timer's view of the workers (its thread reads it).
  std::mutex worker_pids_mu_;
  std::map<pid_t, int> worker_pids_;  // pid -> global rank
  std::int64_t worker_pids_round_ = 0;
  std::unique_ptr<FileTimerServer> file_timer_;  // TORCHELASTIC_ENABLE_FILE_TIMER=1
  // TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (WorkersHostStore): worker rank 0
  // hosts the TCPStore on a port this node offers at each join.
  bool workers_host_store_ = false;
  // The persister's and the replica service's threads and their CPUs;
  // before them, so it outlives them.
  BackgroundThreads background_;
  bool said_background_shared_ = false;   // ConfineBackgroundThreads' line, once
  bool said_background_refused_ = false;  // the same
  // The workers' checkpoint memory (--ckpt_shm_limit > 0), for the agent's
  // whole life: snapshots outlive the workers' rounds.
  std::unique_ptr<CheckpointMemory> checkpoints_;
  // --ckpt_dir; after checkpoints_, which it reads, so destroyed first.
  std::unique_ptr<CheckpointPersister> persister_;
  // --ckpt_replicas 1; after checkpoints_, which its sender reads.
  std::unique_ptr<ReplicaService> replicas_;
  bool replicas_checked_ = false;               // StartReplicas ran (at the first assignment)
  std::atomic<std::int64_t> persist_round_{0};  // the persister's fence
  // --restart_policy=inplace: the workers' control blocks (inplace_layout.h),
  // for the agent's whole life, like the checkpoint memory.
  std::unique_ptr<InplaceBlocks> inplace_;
  // --restart_policy=inplace: the warm standby (warm_standby.h), started by
  // MaybeStartStandby, not before standby_due_ while a recovery waits for
  // its first step; the descriptor numbers workers inherit, which it holds.
  std::unique_ptr<WarmStandby> warm_;
  TimePoint standby_due_{};
  bool warm_off_ = false;  // a standby could not be started: none again
  std::set<int> worker_fds_;
  // The round's spawn inputs, kept for a worker started later in the round.
  WorkerEnvInputs spawn_in_;
  std::vector<std::vector<int>> spawn_plan_;
  std::vector<std::int64_t> spawn_ckpt_steps_;
  // The environment each local rank's process has now (its spawn's, or the
  // last one published to it): what an in-place publish compares with.
  std::vector<Env> worker_env_;
  // Survivors that have not acknowledged the round yet, and until when.
  std::set<int> awaiting_ack_;
  std::optional<TimePoint> ack_due_;
  bool ack_retry_ = false;  // the second deadline runs (CheckAcks)
  // Until when failed exits wait for a restart decided elsewhere
  // (AwaitRestartForExits); set from the first such exit of the round.
  std::optional<TimePoint> exit_window_;
};

Agent::Agent(AgentOptions options, std::unique_ptr<ProcessLauncher> launcher)
    : Agent(std::move(options), [&] {
        AgentDeps deps;
        deps.launcher = std::move(launcher);
        return deps;
      }()) {}

Agent::Agent(AgentOptions options, AgentDeps deps)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(deps))) {}

Agent::~Agent() = default;

int Agent::Run() { return impl_->Run(); }

}  // namespace ddprun::agent
