// The per-node agent loop (see agent.h for the lifecycle).
//
// Threads:
//  - the main thread (Run) owns every piece of state, spawns and stops the
//    workers (PR_SET_PDEATHSIG is tied to the spawning thread) and waits on
//    the event queue, always with a deadline;
//  - a signal watcher turns the blocked signals into events (sigtimedwait);
//  - one reader per Join stream turns RoundEvents into events.
// Only the EventQueue is shared between them.
#include "ddprun/agent/agent.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ddprun/agent/host.h"
#include "ddprun/agent/worker_env.h"
#include "ddprun/agent/worker_logs.h"
#include "ddprun/rendezvous/c10d_store_server.h"
#include "ddprun/rendezvous/client.h"
#include "ddprun/rendezvous/errors.h"
#include "ddprun/rendezvous/kv_engine.h"
#include "ddprun/rendezvous/server.h"

namespace ddprun::agent {
namespace {

namespace rdzv = ::ddprun::rendezvous;
using SteadyClock = std::chrono::steady_clock;
using TimePoint = SteadyClock::time_point;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr int kAgentSignals[] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
// How often the signal watcher checks its stop flag.
constexpr auto kSignalWaitSlice = milliseconds(100);
// Workers are polled at least this often even without SIGCHLD (a safety net;
// the loop sleeps on the queue in between, it never spins).
constexpr auto kWorkerPollInterval = seconds(1);
// After SIGKILL, how long to wait for the kernel to reap a worker before
// giving up on it (a process in uninterruptible sleep cannot die).
constexpr auto kReapTimeout = seconds(5);
constexpr auto kReportTimeout = seconds(10);
// A node whose workers succeeded waits this long for the job to end (like
// torchrun's exit barrier) before it exits anyway.
constexpr auto kExitBarrier = seconds(300);
// Beyond the join timeout, how long the agent itself waits for the server's
// verdict on a join before it gives up.
constexpr auto kJoinSlack = seconds(15);
// How long to wait for the daemon's decision after reporting a failure.
constexpr auto kDecisionTimeout = seconds(120);
// A reader's wait for the next RoundEvent; Cancel() ends it sooner.
constexpr auto kStreamWait = std::chrono::hours(24 * 365);
// After losing the rendezvous mid-round (ddprund restarting), how long the
// agent keeps its workers running while it tries to re-attach.
constexpr auto kReattachWindow = seconds(30);
// Key under which a static node rank 0 publishes its rendezvous endpoint.
constexpr const char* kRdzvEndpointKey = "ddprun/rdzv_endpoint";

// ----------------------------------------------------------------- events

struct SignalEvent {
  int signo = 0;
};
struct ChildrenChanged {};
struct StreamEvent {
  std::uint64_t stream_id = 0;
  rdzv::RoundEvent event;
};
using Event = std::variant<SignalEvent, ChildrenChanged, StreamEvent>;

// A multi-producer queue the main thread waits on with a deadline.
class EventQueue {
 public:
  void Push(Event e) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      events_.push_back(std::move(e));
    }
    cv_.notify_one();
  }
  // The next event, or nullopt once `deadline` passes.
  std::optional<Event> PopUntil(TimePoint deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_until(lock, deadline, [&] { return !events_.empty(); })) return std::nullopt;
    Event e = std::move(events_.front());
    events_.pop_front();
    return e;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> events_;
};

bool IsTerminatingSignal(int sig) {
  return sig == SIGINT || sig == SIGTERM || sig == SIGHUP || sig == SIGQUIT;
}

std::string SignalName(int sig) {
  ExitStatus s;
  s.signal = sig;
  std::string d = s.Describe();  // "signal SIGTERM (15)"
  std::size_t sp = d.find(' ');
  std::size_t paren = d.find(" (");
  return sp == std::string::npos ? d : d.substr(sp + 1, paren == std::string::npos ? paren : paren - sp - 1);
}

double EpochSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string FormatTime(double epoch) {
  std::time_t t = static_cast<std::time_t>(epoch);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d_%H:%M:%S", &tm);
  return buf;
}

std::string Hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

bool IsLoopbackHost(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

bool IsAnyAddress(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]";
}

// Whether `host` names this machine: a loopback or wildcard address, our
// hostname, or an address of one of our interfaces.
bool IsLocalHost(const std::string& host) {
  if (IsAnyAddress(host) || IsLoopbackHost(host) || host == Hostname()) return true;
  const std::vector<std::string> local = LocalAddresses();
  if (std::find(local.begin(), local.end(), host) != local.end()) return true;
  struct addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return false;
  bool found = false;
  for (struct addrinfo* r = res; r != nullptr && !found; r = r->ai_next) {
    char buf[INET6_ADDRSTRLEN] = {};
    if (r->ai_family == AF_INET) {
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(r->ai_addr)->sin_addr, buf,
                  sizeof(buf));
    } else if (r->ai_family == AF_INET6) {
      ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(r->ai_addr)->sin6_addr, buf,
                  sizeof(buf));
    }
    found = IsLoopbackHost(buf) || std::find(local.begin(), local.end(), buf) != local.end();
  }
  ::freeaddrinfo(res);
  return found;
}

std::string Endpoint(const std::string& host, int port) {
  if (host.find(':') != std::string::npos && host.front() != '[') {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

struct Worker {
  int local_rank = 0;
  int global_rank = 0;
  std::unique_ptr<ChildProcess> child;  // null when the spawn failed
  std::optional<ExitStatus> exit;
  double exited_at = 0;        // epoch seconds when the exit was seen
  bool stopped_by_agent = false;
  std::string error_file;
  std::string spawn_error;     // why Spawn failed
};

}  // namespace

void BlockAgentSignals() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : kAgentSignals) sigaddset(&set, s);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

// ------------------------------------------------------------------ Impl

class Agent::Impl {
 public:
  Impl(AgentOptions options, std::unique_ptr<ProcessLauncher> launcher)
      : options_(std::move(options)), launcher_(std::move(launcher)) {}

  ~Impl() { Shutdown(); }

  int Run() {
    BlockAgentSignals();  // in case the caller forgot; threads started below inherit it
    base_env_ = CurrentEnvironment();
    if (absl::Status st = InitLogs(); !st.ok()) {
      Error(std::string(st.message()));
      return kExitUsage;
    }
    watcher_ = std::thread([this] { WatchSignals(); });
    int rc = RunRounds();
    Shutdown();
    return rc;
  }

 private:
  // ------------------------------------------------------------ plumbing

  void Log(const std::string& msg) const {
    std::string line = absl::StrCat("ddprun: ", rdzv::Fence(options_.job_id, round_), msg, "\n");
    std::fputs(line.c_str(), stderr);
    std::fflush(stderr);
  }
  // A one-line error; messages from the rendezvous already carry the fence.
  void Error(const std::string& msg) const {
    if (msg.rfind("[job ", 0) == 0) {
      std::string line = absl::StrCat("ddprun: ", msg, "\n");
      std::fputs(line.c_str(), stderr);
      std::fflush(stderr);
    } else {
      Log(msg);
    }
  }

  void WatchSignals() {
    sigset_t set;
    sigemptyset(&set);
    for (int s : kAgentSignals) sigaddset(&set, s);
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(kSignalWaitSlice);
    struct timespec slice{0, static_cast<long>(ns.count())};
    while (!stop_watcher_.load()) {
      siginfo_t info;
      int sig = ::sigtimedwait(&set, &info, &slice);
      if (sig < 0) continue;  // EAGAIN (slice over) or EINTR
      if (sig == SIGCHLD) {
        queue_.Push(ChildrenChanged{});
      } else {
        queue_.Push(SignalEvent{sig});
      }
    }
  }

  // Events deferred while stopping workers come first.
  std::optional<Event> NextEvent(TimePoint deadline) {
    if (!deferred_.empty()) {
      Event e = std::move(deferred_.front());
      deferred_.pop_front();
      return e;
    }
    return queue_.PopUntil(deadline);
  }

  void Shutdown() {
    if (logs_) logs_->Finish();  // the workers' last output reaches the console and files
    EndStream();
    if (watcher_.joinable()) {
      stop_watcher_ = true;
      // Wake the watcher now rather than at the end of its slice.
      ::pthread_kill(watcher_.native_handle(), SIGCHLD);
      watcher_.join();
    }
    client_.reset();
    if (server_) server_->Shutdown();
    server_.reset();
    store_server_.reset();
  }

  // SIGUSR1/SIGUSR2: forwarded to every worker group when --signals_to_handle
  // lists them (the job goes on), otherwise ignored.
  void ForwardNonTerminating(int sig) {
    const bool forward = (sig == SIGUSR1 && options_.forward_sigusr1) ||
                         (sig == SIGUSR2 && options_.forward_sigusr2);
    if (!forward) {
      Log(absl::StrCat("ignoring ", SignalName(sig), "; add it to --signals_to_handle to forward it "
                       "to the workers"));
      return;
    }
    Log(absl::StrCat("forwarding ", SignalName(sig), " to the workers"));
    SignalAlive(sig, false);
  }

  // ---------------------------------------------------------- rendezvous

  // Pending terminating signal, without blocking (used between the slices of
  // blocking setup calls, so that Ctrl-C is honoured during a long connect).
  std::optional<int> TakeSignal() {
    while (auto e = queue_.PopUntil(SteadyClock::now())) {
      if (auto* s = std::get_if<SignalEvent>(&*e)) {
        if (IsTerminatingSignal(s->signo)) return s->signo;
      } else if (std::holds_alternative<StreamEvent>(*e)) {
        deferred_.push_back(std::move(*e));
      }
    }
    return std::nullopt;
  }

  TimePoint JoinDeadline() const { return SteadyClock::now() + rdzv::Seconds(options_.join_timeout_s); }

  // Waits, in slices, until client_ connects. Sets *signo on a signal.
  absl::Status ConnectClient(const std::string& host, int port, TimePoint deadline, int* signo) {
    connect_host_ = host;
    connect_port_ = port;
    client_ = rdzv::RendezvousClient::Create(host, port);
    absl::Status st;
    do {
      if (auto s = TakeSignal()) {
        *signo = *s;
        return absl::CancelledError("interrupted");
      }
      auto slice = std::min<rdzv::Duration>(seconds(1), deadline - SteadyClock::now());
      st = client_->WaitForConnected(std::max<rdzv::Duration>(slice, milliseconds(1)));
    } while (!st.ok() && SteadyClock::now() < deadline);
    if (!st.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "cannot reach the rendezvous at ", Endpoint(host, port), " within ",
          options_.join_timeout_s, " s; start ddprund (or the host node) there, or fix "
          "--rdzv_endpoint"));
    }
    return absl::OkStatus();
  }

  absl::Status HostRendezvous(const std::string& bind_host, int port) {
    rdzv::ServerOptions so;
    so.host = bind_host;
    so.port = port;
    auto server = rdzv::RendezvousServer::Start(so);
    if (!server.ok()) return server.status();
    server_ = std::move(*server);
    return absl::OkStatus();
  }

  // (Re)binds this agent's TCPStore for the workers on port 0. Every round
  // gets a fresh one, so that keys of an earlier round (same
  // /worker/attempt_<n> prefix after a scale-up) cannot leak into the next.
  absl::Status StartWorkerStore() {
    if (options_.mode == RendezvousMode::kStatic) return absl::OkStatus();
    store_server_.reset();
    rdzv::C10dStoreServerOptions so;
    so.host = "0.0.0.0";
    so.port = 0;
    auto store = rdzv::C10dStoreServer::Start(so);
    if (!store.ok()) {
      return absl::UnavailableError(absl::StrCat("cannot start the workers' TCPStore: ",
                                                 store.status().message()));
    }
    store_server_ = std::move(*store);
    master_port_ = store_server_->port();
    return absl::OkStatus();
  }

  // Brings up (or reaches) the rendezvous according to the mode.
  absl::Status SetupRendezvous(int* signo) {
    const TimePoint deadline = JoinDeadline();
    switch (options_.mode) {
      case RendezvousMode::kEmbedded: {
        const std::string bind = options_.rdzv_host.empty() ? "0.0.0.0" : options_.rdzv_host;
        if (absl::Status st = HostRendezvous(bind, options_.rdzv_port); !st.ok()) {
          return absl::UnavailableError(absl::StrCat(
              "cannot host the rendezvous on ", Endpoint(bind, options_.rdzv_port), ": ",
              st.message(), "; pick a free port or another --rdzv_endpoint"));
        }
        const std::string host = IsAnyAddress(bind) ? "127.0.0.1" : bind;
        return ConnectClient(host, server_->port(), deadline, signo);
      }
      case RendezvousMode::kRemote: {
        const std::string& host = options_.rdzv_host;
        const int port = options_.rdzv_port > 0 ? options_.rdzv_port : rdzv::kDefaultRendezvousPort;
        if (IsLocalHost(host)) {
          // Like torchrun's c10d is_host: the endpoint is ours, so serve it
          // unless somebody (ddprund, another local agent) already does.
          auto probe = rdzv::RendezvousClient::Create(host, port);
          if (!probe->WaitForConnected(milliseconds(300)).ok()) {
            const std::string bind = IsLoopbackHost(host) && host != "localhost" ? host : "0.0.0.0";
            absl::Status st = HostRendezvous(bind, port);
            if (st.ok()) {
              Log(absl::StrCat("hosting the rendezvous at ", Endpoint(host, port)));
            }
            // Otherwise another local agent bound it first: join it as a client.
          }
        }
        return ConnectClient(host, port, deadline, signo);
      }
      case RendezvousMode::kStatic:
        return SetupStatic(deadline, signo);
    }
    return absl::InternalError("unknown rendezvous mode");
  }

  absl::Status SetupStatic(TimePoint deadline, int* signo) {
    int node_rank = options_.node_rank;
    if (node_rank < 0 && options_.max_nodes == 1) node_rank = 0;
    if (node_rank < 0) {
      return absl::InvalidArgumentError(
          "static rendezvous needs this node's rank; pass --node_rank (0 on the master node)");
    }
    const std::string& maddr = options_.master_addr;
    const int mport = options_.master_port;
    master_port_ = mport;
    if (node_rank == 0) {
      rdzv::C10dStoreServerOptions so;
      so.host = "0.0.0.0";
      so.port = mport;
      auto store = rdzv::C10dStoreServer::Start(so);
      if (!store.ok()) {
        return absl::UnavailableError(absl::StrCat("cannot serve the store on master port ", mport,
                                                   ": ", store.status().message(),
                                                   "; pick a free --master_port"));
      }
      store_server_ = std::move(*store);
      if (absl::Status st = HostRendezvous("0.0.0.0", 0); !st.ok()) {
        return absl::UnavailableError(absl::StrCat("cannot host the rendezvous: ", st.message()));
      }
      const std::string host = IsAnyAddress(maddr) ? "127.0.0.1" : maddr;
      DDPRUN_RETURN_IF_ERROR(
          store_server_->engine().Set(kRdzvEndpointKey, Endpoint(host, server_->port())));
      return ConnectClient(host, server_->port(), deadline, signo);
    }
    // Other nodes read node 0's rendezvous endpoint from its store.
    std::string endpoint;
    absl::Status last = absl::DeadlineExceededError("no attempt");
    while (SteadyClock::now() < deadline) {
      if (auto s = TakeSignal()) {
        *signo = *s;
        return absl::CancelledError("interrupted");
      }
      double left = std::chrono::duration<double>(deadline - SteadyClock::now()).count();
      auto client = rdzv::C10dStoreClient::Connect(maddr, mport, std::min(1.0, left));
      if (!client.ok()) {
        last = client.status();
        continue;
      }
      auto value = (*client)->Get(kRdzvEndpointKey, std::min(2.0, std::max(0.01, left)));
      if (value.ok()) {
        endpoint = *value;
        break;
      }
      last = value.status();
    }
    if (endpoint.empty()) {
      return absl::UnavailableError(absl::StrCat(
          "cannot reach the master node's store at ", Endpoint(maddr, mport), " within ",
          options_.join_timeout_s, " s (", last.message(),
          "); start node rank 0, or fix --master_addr/--master_port"));
    }
    std::string host;
    int port = 0;
    DDPRUN_RETURN_IF_ERROR(rdzv::ParseEndpoint(endpoint, 0, &host, &port));
    return ConnectClient(host, port, deadline, signo);
  }

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
    if (options_.mode == RendezvousMode::kStatic) {
      spec.requested_rank = options_.node_rank < 0 ? 0 : options_.node_rank;
      spec.min_nodes = spec.max_nodes = options_.max_nodes;
    }
    spec.last_call_timeout_s = options_.last_call_timeout_s;
    spec.join_timeout_s = options_.join_timeout_s;
    spec.max_restarts = options_.max_restarts;
    spec.master_port = master_port_;
    spec.command = absl::StrJoin(options_.command, " ");
    return spec;
  }

  void StartJoin() {
    EndStream();
    stream_ = client_->Join(MakeJoinSpec());
    const std::uint64_t id = ++stream_id_;
    rdzv::JoinStream* stream = stream_.get();
    reader_ = std::thread([this, stream, id] {
      while (true) {
        rdzv::RoundEvent ev = stream->Next(kStreamWait);
        // Only an Assignment keeps the stream going.
        const bool last = !std::holds_alternative<rdzv::Assignment>(ev);
        queue_.Push(StreamEvent{id, std::move(ev)});
        if (last) return;
      }
    });
  }

  void EndStream() {
    if (stream_) stream_->Cancel();
    if (reader_.joinable()) reader_.join();
    stream_.reset();
    ++stream_id_;  // anything still queued from it is stale
  }

  // The current stream's event, or nullptr for stale/other events.
  rdzv::RoundEvent* CurrentStreamEvent(Event& e) {
    auto* se = std::get_if<StreamEvent>(&e);
    if (se == nullptr || se->stream_id != stream_id_) return nullptr;
    return &se->event;
  }

  void ReportBestEffort(rdzv::Outcome outcome, const std::vector<rdzv::WorkerFailure>& failures,
                        rdzv::Duration timeout) {
    if (!assignment_ || !client_) return;
    absl::Status st = client_->Report(options_.job_id, assignment_->node_id, assignment_->round,
                                      outcome, failures, timeout);
    if (!st.ok()) Error(absl::StrCat("could not report to the rendezvous: ", st.message()));
  }

  // ------------------------------------------------------------- workers

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
    if (lo.host.empty()) {
      lo.host = Hostname();  // "node1", not "node1.cluster.example"
      if (lo.host.find_first_not_of("0123456789.") != std::string::npos)
        lo.host = lo.host.substr(0, lo.host.find('.'));
    }
    logs_ = std::make_unique<WorkerLogs>(std::move(lo));
    return logs_->Init();
  }

  // Spawns every local worker. Returns false if one could not be started.
  bool SpawnWorkers() {
    workers_.clear();
    const rdzv::Assignment& a = *assignment_;
    logs_->BeginRound(a.round);
    WorkerEnvInputs in;
    in.options = &options_;
    in.assignment = &a;
    in.store_endpoint = Endpoint(connect_host_, connect_port_);
    in.host = advertised_host_;
    bool ok = true;
    for (int j = 0; j < a.local_world_size; ++j) {
      Worker w;
      w.local_rank = j;
      w.global_rank = a.base_rank + j;
      SpawnSpec spec;
      absl::Status logs_ok = logs_->Prepare(j, w.global_rank, &spec, &w.error_file);
      in.error_file = w.error_file;
      spec.argv = SubstituteLocalRank(options_.command, j);
      spec.env = BuildWorkerEnv(base_env_, in, j);
      auto child = logs_ok.ok() ? launcher_->Spawn(spec)
                                : absl::StatusOr<std::unique_ptr<ChildProcess>>(logs_ok);
      logs_->AfterSpawn(j);
      if (child.ok()) {
        w.child = std::move(*child);
      } else {
        w.spawn_error = std::string(child.status().message());
        w.exit = ExitStatus{127, 0};
        w.exited_at = EpochSeconds();
        Error(w.spawn_error);
        ok = false;
      }
      workers_.push_back(std::move(w));
      if (!ok) break;
    }
    return ok;
  }

  void PollWorkers() {
    for (Worker& w : workers_) {
      if (w.exit || !w.child) continue;
      if (auto st = w.child->Poll()) {
        w.exit = st;
        w.exited_at = EpochSeconds();
      }
    }
  }

  bool AnyAlive() const {
    for (const Worker& w : workers_)
      if (!w.exit) return true;
    return false;
  }

  void SignalAlive(int sig, bool mark_stopped) {
    for (Worker& w : workers_) {
      if (w.exit || !w.child) continue;
      w.child->SignalGroup(sig);
      if (mark_stopped) w.stopped_by_agent = true;
    }
  }

  // Waits for every worker to exit until `deadline`. Returns early (false)
  // on a terminating signal, which escalates the stop.
  bool WaitWorkersUntil(TimePoint deadline) {
    PollWorkers();
    while (AnyAlive()) {
      TimePoint now = SteadyClock::now();
      if (now >= deadline) return true;
      auto e = queue_.PopUntil(std::min(deadline, now + kWorkerPollInterval));
      if (e) {
        if (auto* s = std::get_if<SignalEvent>(&*e)) {
          if (IsTerminatingSignal(s->signo)) {
            Log(absl::StrCat("received ", SignalName(s->signo),
                             " while stopping workers; killing them now"));
            deferred_.push_back(std::move(*e));  // the caller's loop still acts on it
            return false;
          }
          ForwardNonTerminating(s->signo);
        } else if (std::holds_alternative<StreamEvent>(*e)) {
          deferred_.push_back(std::move(*e));
        }
      }
      PollWorkers();
    }
    return true;
  }

  // Stops every live worker: `sig` to each group, the grace period, SIGKILL,
  // then a bounded reap. Every wait has a deadline.
  void StopWorkers(int sig) {
    PollWorkers();
    if (!AnyAlive()) return;
    SignalAlive(sig, true);
    const bool patient = WaitWorkersUntil(SteadyClock::now() + rdzv::Seconds(options_.grace_period_s));
    if (AnyAlive()) {
      if (patient) {
        Log(absl::StrCat("workers did not exit within ", options_.grace_period_s, " s of ",
                         SignalName(sig), "; sending SIGKILL"));
      }
      SignalAlive(SIGKILL, true);
      WaitWorkersUntil(SteadyClock::now() + kReapTimeout);
    }
    for (const Worker& w : workers_) {
      if (w.exit) continue;
      Log(absl::StrCat("warning: worker rank ", w.global_rank, " (pid ", w.child->pid(),
                       ") is still alive ", std::chrono::duration<double>(kReapTimeout).count(),
                       " s after SIGKILL (uninterruptible sleep?); giving up on it"));
    }
  }

  rdzv::WorkerFailure FailureOf(const Worker& w) const {
    rdzv::WorkerFailure f;
    f.host = advertised_host_;
    f.global_rank = w.global_rank;
    f.local_rank = w.local_rank;
    f.exit_code = w.exit ? w.exit->exit_code : 0;
    f.signal = w.exit ? w.exit->signal : 0;
    f.pid = w.child ? w.child->pid() : 0;
    f.timestamp = w.exited_at;
    f.round = assignment_ ? assignment_->round : round_;
    f.error_message = !w.spawn_error.empty() ? w.spawn_error : ReadErrorMessage(w.error_file);
    f.stderr_tail = logs_->StderrTail(w.local_rank);
    f.log_file = logs_->LogFile(w.local_rank);
    return f;
  }

  // Workers that failed on their own (not those the agent stopped), first first.
  std::vector<rdzv::WorkerFailure> Failures() const {
    std::vector<const Worker*> failed;
    for (const Worker& w : workers_)
      if (w.exit && !w.exit->ok() && !w.stopped_by_agent) failed.push_back(&w);
    std::stable_sort(failed.begin(), failed.end(),
                     [](const Worker* a, const Worker* b) { return a->exited_at < b->exited_at; });
    std::vector<rdzv::WorkerFailure> out;
    for (const Worker* w : failed) out.push_back(FailureOf(*w));
    return out;
  }

  static std::string DescribeFailure(const rdzv::WorkerFailure& f) {
    ExitStatus s;
    s.exit_code = f.exit_code;
    s.signal = f.signal;
    return absl::StrCat("worker rank ", f.global_rank, " (local rank ", f.local_rank, ") on ",
                        f.host, " exited with ", s.Describe());
  }

  // The job's failure report, one block on stderr, first failure first.
  void PrintJobFailure(const std::string& reason, const std::vector<rdzv::WorkerFailure>& failures) {
    if (logs_) logs_->Sync();  // the workers' last output comes before the report
    const std::string head = absl::StrCat("ddprun: job ", options_.job_id, " failed: ");
    std::string block = absl::StrCat(head, reason, "\n");
    for (std::size_t i = 0; i < failures.size(); ++i) {
      const rdzv::WorkerFailure& f = failures[i];
      absl::StrAppend(&block, head, DescribeFailure(f), " (pid ", f.pid, ", round ", f.round,
                      f.timestamp > 0 ? absl::StrCat(", at ", FormatTime(f.timestamp)) : "",
                      i == 0 ? "; first failure" : "", ")\n");
      absl::StrAppend(&block, FormatFailureDetails(f));
    }
    std::fputs(block.c_str(), stderr);
    std::fflush(stderr);
  }

  // ------------------------------------------------------------ the loop

  int RunRounds() {
    if (options_.command.empty()) {
      Error("no worker command; give the program to run after the flags");
      return kExitUsage;
    }
    int signo = 0;
    if (absl::Status st = SetupRendezvous(&signo); !st.ok()) {
      if (signo) return 128 + signo;
      Error(std::string(st.message()));
      return kExitRendezvousError;
    }
    if (!options_.local_addr.empty()) {
      advertised_host_ = options_.local_addr;
    } else if (IsLoopbackHost(connect_host_)) {
      advertised_host_ = "127.0.0.1";
    } else {
      advertised_host_ = Hostname();
    }
    while (true) {
      std::optional<int> rc = RunOneRound();
      if (rc) return *rc;
    }
  }

  // One round: join, run the workers, react. nullopt: join the next round.
  std::optional<int> RunOneRound() {
    assignment_.reset();
    if (absl::Status st = StartWorkerStore(); !st.ok()) {
      Error(std::string(st.message()));
      return kExitRendezvousError;
    }
    StartJoin();
    const TimePoint deadline = JoinDeadline() + rdzv::Seconds(options_.last_call_timeout_s) + kJoinSlack;
    while (!assignment_) {
      auto e = NextEvent(deadline);
      if (!e) {
        Error(absl::StrCat("no assignment from the rendezvous at ",
                           Endpoint(connect_host_, connect_port_), " within ",
                           options_.join_timeout_s, " s; start the other nodes, or raise "
                           "--rdzv_conf join_timeout"));
        return kExitRendezvousError;
      }
      if (auto* s = std::get_if<SignalEvent>(&*e)) {
        if (IsTerminatingSignal(s->signo)) {
          Log(absl::StrCat("received ", SignalName(s->signo), " while joining; leaving"));
          return 128 + s->signo;
        }
        continue;
      }
      rdzv::RoundEvent* ev = CurrentStreamEvent(*e);
      if (ev == nullptr) continue;
      if (auto* a = std::get_if<rdzv::Assignment>(ev)) {
        assignment_ = std::move(*a);
      } else if (auto* r = std::get_if<rdzv::RestartRound>(ev)) {
        round_ = r->next_round;
        return std::nullopt;
      } else if (auto* c = std::get_if<rdzv::JobClosed>(ev)) {
        if (c->success) {
          // A hot spare of a job that succeeded: nothing went wrong here.
          Log(absl::StrCat("the job finished before this node was needed (", c->reason,
                           "); exiting"));
          return kExitSuccess;
        }
        Error(absl::StrCat("the job closed before this node was admitted (", c->reason,
                           "); start a new job with a different --rdzv_id"));
        return kExitRendezvousError;
      } else {
        Error(std::string(std::get<absl::Status>(*ev).message()));
        return kExitRendezvousError;
      }
    }
    round_ = assignment_->round;
    const rdzv::Assignment& a = *assignment_;
    Log(absl::StrCat("starting ", a.local_world_size, " worker(s): ranks ", a.base_rank, "-",
                     a.base_rank + a.local_world_size - 1, " of ", a.world_size, ", node ",
                     a.group_rank, " of ", a.group_world_size, ", master ",
                     Endpoint(a.master_addr, a.master_port), ", restart ", a.restart_count));
    if (!SpawnWorkers()) return OnWorkerFailure();
    return Monitor();
  }

  std::optional<int> Monitor() {
    while (true) {
      auto e = NextEvent(SteadyClock::now() + kWorkerPollInterval);
      if (!e || std::holds_alternative<ChildrenChanged>(*e)) {
        PollWorkers();
        for (const Worker& w : workers_)
          if (w.exit && !w.exit->ok()) return OnWorkerFailure();
        if (!AnyAlive()) return OnSuccess();
        continue;
      }
      if (auto* s = std::get_if<SignalEvent>(&*e)) {
        if (IsTerminatingSignal(s->signo)) return OnSignal(s->signo);
        ForwardNonTerminating(s->signo);  // SIGUSR1/2 when asked; workers keep running
        continue;
      }
      rdzv::RoundEvent* ev = CurrentStreamEvent(*e);
      if (ev == nullptr) continue;
      if (auto* r = std::get_if<rdzv::RestartRound>(ev)) {
        Log(absl::StrCat("restarting the workers: ", r->reason));
        StopWorkers(SIGTERM);
        round_ = r->next_round;
        return std::nullopt;
      }
      if (auto* c = std::get_if<rdzv::JobClosed>(ev)) {
        StopWorkers(SIGTERM);
        if (c->success) return kExitSuccess;
        PrintJobFailure(c->reason, c->failures);
        return kExitWorkerFailed;
      }
      if (auto* st = std::get_if<absl::Status>(ev)) {
        if (absl::IsUnavailable(*st) && !server_) {
          switch (Reattach(*st)) {
            case ReattachResult::kResumed:
              continue;  // same round, workers untouched
            case ReattachResult::kRestart:
              StopWorkers(SIGTERM);
              return std::nullopt;
            case ReattachResult::kSignal:
            case ReattachResult::kFailed:
              break;
          }
          if (!deferred_.empty()) continue;  // a signal or worker exit to act on
        }
        Error(absl::StrCat("lost the rendezvous: ", st->message(), "; stopping the workers"));
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
                     "re-attaching for up to ",
                     std::chrono::duration_cast<seconds>(kReattachWindow).count(), " s"));
    const TimePoint deadline = SteadyClock::now() + kReattachWindow;
    auto backoff = milliseconds(20);
    while (SteadyClock::now() < deadline) {
      // Anything but stream events is for the caller.
      while (auto e = queue_.PopUntil(SteadyClock::now())) {
        if (std::holds_alternative<StreamEvent>(*e)) continue;
        const bool act = std::holds_alternative<SignalEvent>(*e) ||
                         std::holds_alternative<ChildrenChanged>(*e);
        deferred_.push_back(std::move(*e));
        if (act) {
          EndStream();
          return ReattachResult::kSignal;
        }
      }
      if (client_->WaitForConnected(std::min<rdzv::Duration>(seconds(1), deadline - SteadyClock::now()))
              .ok()) {
        resuming_ = true;
        StartJoin();
        resuming_ = false;
        auto e = queue_.PopUntil(std::min(deadline, SteadyClock::now() + seconds(5)));
        while (e && !CurrentStreamEvent(*e)) {
          deferred_.push_back(std::move(*e));
          EndStream();
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
            round_ = r->next_round;
            return ReattachResult::kRestart;
          } else if (auto* st = std::get_if<absl::Status>(ev);
                     st && !absl::IsUnavailable(*st) && !absl::IsCancelled(*st)) {
            Error(absl::StrCat("cannot re-attach: ", st->message()));
            return ReattachResult::kFailed;
          } else if (std::holds_alternative<rdzv::JobClosed>(*ev)) {
            deferred_.push_back(std::move(*e));
            return ReattachResult::kSignal;
          }
        }
      }
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, milliseconds(500));
    }
    return ReattachResult::kFailed;
  }

  std::optional<int> OnWorkerFailure() {
    std::vector<rdzv::WorkerFailure> failures = Failures();
    for (const auto& f : failures) Log(DescribeFailure(f) + "; stopping the node's other workers");
    StopWorkers(SIGTERM);
    ReportBestEffort(rdzv::Outcome::kFailed, failures, kReportTimeout);
    const TimePoint deadline = SteadyClock::now() + kDecisionTimeout;
    while (true) {
      auto e = NextEvent(deadline);
      if (!e) {
        PrintJobFailure(absl::StrCat("no decision from the rendezvous within ",
                                     std::chrono::duration<double>(kDecisionTimeout).count(),
                                     " s of reporting the failure"),
                        failures);
        return kExitWorkerFailed;
      }
      if (auto* s = std::get_if<SignalEvent>(&*e)) {
        if (!IsTerminatingSignal(s->signo)) continue;
        Log(absl::StrCat("received ", SignalName(s->signo), "; leaving"));
        ReportBestEffort(rdzv::Outcome::kLeaving, {}, kReportTimeout);
        return 128 + s->signo;
      }
      rdzv::RoundEvent* ev = CurrentStreamEvent(*e);
      if (ev == nullptr) continue;
      if (auto* r = std::get_if<rdzv::RestartRound>(ev)) {
        Log(absl::StrCat("restarting: ", r->reason));
        round_ = r->next_round;
        return std::nullopt;
      }
      if (auto* c = std::get_if<rdzv::JobClosed>(ev)) {
        PrintJobFailure(c->reason, c->failures.empty() ? failures : c->failures);
        return kExitWorkerFailed;
      }
      if (auto* st = std::get_if<absl::Status>(ev)) {
        PrintJobFailure(absl::StrCat("lost the rendezvous after a worker failure: ",
                                     st->message()),
                        failures);
        return kExitWorkerFailed;
      }
    }
  }

  std::optional<int> OnSuccess() {
    ReportBestEffort(rdzv::Outcome::kSucceeded, {}, kReportTimeout);
    // Wait for the job to end, so that a node hosting the rendezvous or the
    // master store stays up for the others (torchrun's exit barrier). A host
    // waits until the end; the others give up after kExitBarrier.
    const bool host = server_ != nullptr ||
                      (assignment_ && assignment_->group_rank == 0 &&
                       assignment_->group_world_size > 1);
    TimePoint deadline = SteadyClock::now() + kExitBarrier;
    while (true) {
      auto e = NextEvent(deadline);
      if (!e) {
        if (host) {
          deadline = SteadyClock::now() + kExitBarrier;
          Log("workers succeeded; still serving the other nodes until the job ends");
          continue;
        }
        Log("workers succeeded; the other nodes are still running, exiting anyway");
        return kExitSuccess;
      }
      if (auto* s = std::get_if<SignalEvent>(&*e)) {
        if (IsTerminatingSignal(s->signo)) return 128 + s->signo;
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
        round_ = r->next_round;
        return std::nullopt;
      }
      // The end of the stream: this node's part is done.
      return kExitSuccess;
    }
  }

  int OnSignal(int sig) {
    Log(absl::StrCat("received ", SignalName(sig), "; forwarding it to the workers"));
    StopWorkers(sig);
    ReportBestEffort(rdzv::Outcome::kLeaving, {}, kReportTimeout);
    return 128 + sig;
  }

  // ---------------------------------------------------------------- state

  AgentOptions options_;
  std::unique_ptr<ProcessLauncher> launcher_;
  Env base_env_;

  EventQueue queue_;
  std::deque<Event> deferred_;
  bool resuming_ = false;  // MakeJoinSpec asks to re-attach to assignment_
  std::atomic<bool> stop_watcher_{false};
  std::thread watcher_;

  std::unique_ptr<rdzv::RendezvousServer> server_;      // when this agent hosts it
  std::unique_ptr<rdzv::C10dStoreServer> store_server_;  // the workers' TCPStore
  std::unique_ptr<rdzv::RendezvousClient> client_;
  std::string connect_host_;
  int connect_port_ = 0;
  std::string advertised_host_;
  int master_port_ = 0;

  std::unique_ptr<rdzv::JoinStream> stream_;
  std::thread reader_;
  std::uint64_t stream_id_ = 0;

  std::int64_t round_ = 0;
  std::optional<rdzv::Assignment> assignment_;
  std::vector<Worker> workers_;
  std::unique_ptr<WorkerLogs> logs_;  // set by Run()
};

Agent::Agent(AgentOptions options, std::unique_ptr<ProcessLauncher> launcher)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(launcher))) {}

Agent::~Agent() = default;

int Agent::Run() { return impl_->Run(); }

}  // namespace ddprun::agent
