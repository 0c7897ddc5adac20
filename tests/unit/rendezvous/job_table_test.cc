// The daemon's job table with a fake clock, recording sinks and an in-memory
// journal: job creation and limits, deadlines, store waits, retention of
// closed jobs, status listing. No sockets, no threads, no sleeping.
#include "ddprun/rendezvous/job_table.h"

#include <catch2/catch.hpp>
#include <map>

#include "ddprun/rendezvous/common/errors.h"

namespace ddprun::rendezvous {
namespace {

using namespace std::chrono_literals;

// Records what the table sends to one agent's stream.
class RecordingSink final : public EventSink {
 public:
  void Bind(const std::string& job_id, const std::string& node_id) override {
    bound_job = job_id;
    bound_node = node_id;
  }
  void Deliver(RoundEvent event) override {
    if (on_deliver) on_deliver();
    events.push_back(std::move(event));
  }

  template <typename T>
  const T* Last() const {
    return events.empty() ? nullptr : std::get_if<T>(&events.back());
  }

  std::string bound_job, bound_node;
  std::vector<RoundEvent> events;
  std::function<void()> on_deliver;
};

// Keeps what a StateLog would write, in memory.
class MemoryJournal final : public JobJournal {
 public:
  absl::StatusOr<std::vector<RecoveredJob>> Recover() override {
    std::vector<RecoveredJob> out;
    for (const auto& [id, job] : jobs) out.push_back(job);
    return out;
  }
  absl::Status WriteSnapshot(const JobSnapshot& snap, std::int64_t store_round,
                             const KvEngine& store) override {
    if (!refuse.ok()) return refuse;
    ++snapshots;
    RecoveredJob& job = jobs[snap.job_id];
    job.snapshot = snap;
    job.store_round = store_round;
    job.store = store.Dump();
    return absl::OkStatus();
  }
  absl::Status AppendKey(const std::string& job_id, std::int64_t round, const std::string& key,
                         const KvEngine& store) override {
    auto& keys = jobs[job_id].store;
    std::erase_if(keys, [&](const auto& kv) { return kv.first == key; });
    if (auto v = store.Get(key)) keys.emplace_back(key, *v);
    return absl::OkStatus();
  }
  void Forget(const std::string& job_id) override {
    jobs.erase(job_id);
    forgotten.push_back(job_id);
  }

  absl::Status CheckStoreValue(const std::string&, std::int64_t, const std::string&,
                               std::size_t value_bytes) const override {
    return value_bytes <= max_value ? absl::OkStatus()
                                    : absl::InvalidArgumentError("over the journal's limit");
  }

  std::map<std::string, RecoveredJob> jobs;
  int snapshots = 0;
  absl::Status refuse;  // WriteSnapshot's answer when not OK
  std::size_t max_value = 1 << 20;
  std::vector<std::string> forgotten;
};

JoinSpec Spec(const std::string& job, const std::string& host, int min_nodes = 2,
              int max_nodes = 2) {
  JoinSpec s;
  s.job_id = job;
  s.host = host;
  s.pid = 100;
  s.nproc = 2;
  s.min_nodes = min_nodes;
  s.max_nodes = max_nodes;
  s.policy.join_timeout_s = 10;
  s.policy.last_call_timeout_s = 1;
  s.master_port = 4000;
  s.command = "train";
  return s;
}

struct Fixture {
  explicit Fixture(JobTableOptions extra = {}) {
    extra.clock = &clock;
    extra.journal = &journal;
    extra.on_deadline = [this](TimePoint t) { notified.push_back(t); };
    table = std::make_unique<JobTable>(std::move(extra));
  }

  // Joins and returns the sink; REQUIREs success.
  std::shared_ptr<RecordingSink> Join(const JoinSpec& spec) {
    auto sink = std::make_shared<RecordingSink>();
    auto id = table->Join(spec, sink);
    REQUIRE(id.ok());
    CHECK(sink->bound_job == spec.job_id);
    CHECK(sink->bound_node == *id);
    return sink;
  }

  absl::Status Refused(const JoinSpec& spec) {
    auto id = table->Join(spec, std::make_shared<RecordingSink>());
    REQUIRE_FALSE(id.ok());
    return id.status();
  }

  FakeClock clock;
  MemoryJournal journal;
  std::vector<TimePoint> notified;
  std::unique_ptr<JobTable> table;
};

const Assignment& AssignmentOf(const RecordingSink& sink) {
  const auto* a = sink.Last<Assignment>();
  REQUIRE(a != nullptr);
  return *a;
}

TEST_CASE("JobTable: the first join creates the job; a full round assigns every node", "[unit]") {
  Fixture f;
  auto a = f.Join(Spec("j", "10.0.0.1"));
  CHECK(a->events.empty());
  CHECK(f.table->NumJobs() == 1);
  CHECK(f.table->Status("j").at(0).state == "gathering");
  auto b = f.Join(Spec("j", "10.0.0.2"));
  CHECK(AssignmentOf(*a).group_rank == 0);
  CHECK(AssignmentOf(*b).group_rank == 1);
  CHECK(AssignmentOf(*a).world_size == 4);
  CHECK(f.table->Status("j").at(0).state == "running");
  // The assignment was durable before it was sent.
  CHECK(f.journal.jobs.at("j").snapshot.state == "running");
}

TEST_CASE("JobTable: the snapshot is written before any agent hears of the change", "[unit]") {
  Fixture f;
  auto a = f.Join(Spec("j", "10.0.0.1"));
  int snapshots_at_delivery = -1;
  a->on_deliver = [&] { snapshots_at_delivery = f.journal.snapshots; };
  const int before = f.journal.snapshots;
  f.Join(Spec("j", "10.0.0.2"));
  CHECK(snapshots_at_delivery > before);
}

TEST_CASE(
    "JobTable: a gathering round writes a snapshot on its first join (the job) and its "
    "forming, none per join",
    "[unit]") {
  // A snapshot holds every member: one per join would be O(N^2) bytes for N.
  Fixture f;
  constexpr int kNodes = 64;
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (int i = 0; i + 1 < kNodes; ++i)
    sinks.push_back(f.Join(Spec("j", "10.0.1." + std::to_string(i), kNodes, kNodes)));
  CHECK(f.journal.snapshots == 1);
  CHECK(f.journal.jobs.at("j").snapshot.state == "gathering");
  int snapshots_at_delivery = -1;
  sinks[0]->on_deliver = [&] { snapshots_at_delivery = f.journal.snapshots; };
  sinks.push_back(f.Join(Spec("j", "10.0.1.99", kNodes, kNodes)));
  CHECK(f.journal.snapshots == 2);
  CHECK(snapshots_at_delivery == 2);  // still durable before anyone heard
  CHECK(f.journal.jobs.at("j").snapshot.state == "running");
  CHECK(f.journal.jobs.at("j").snapshot.members.size() == static_cast<std::size_t>(kNodes));
}

TEST_CASE("JobTable: a change the journal refuses is not delivered; its members get the error",
          "[unit]") {
  // An undurable decision could be decided differently by a replica leading
  // after a fail-over: nobody may act on it.
  Fixture f;
  auto a = f.Join(Spec("j", "10.0.0.1"));
  f.journal.refuse = absl::InvalidArgumentError("etcd refused a request (too large)");
  auto b = f.Join(Spec("j", "10.0.0.2"));
  for (const auto& sink : {a, b}) {
    REQUIRE(sink->events.size() == 1);
    const auto* st = std::get_if<absl::Status>(&sink->events.back());
    REQUIRE(st != nullptr);
    CHECK(KindOf(*st) == ErrorKind::kBadInput);
    CHECK_THAT(std::string(st->message()),
               Catch::Contains("[job j round 0] not delivered") && Catch::Contains("too large"));
  }
  CHECK(f.journal.snapshots == 1);  // the job's first join; the refused forming is not written
  // Their streams ended: nothing more reaches them.
  f.table->StreamLost("j", a->bound_node, a.get());
  CHECK(a->events.size() == 1);
  // The job is dropped from memory at the next Tick (due now), not forgotten in the journal;
  // a later run of the same id starts afresh and is persisted once the journal takes it.
  REQUIRE(f.table->NextDeadline().has_value());
  CHECK(*f.table->NextDeadline() <= f.clock.Now());
  f.table->Tick();
  CHECK(f.table->NumJobs() == 0);
  CHECK(f.journal.forgotten.empty());
  f.journal.refuse = absl::OkStatus();
  auto c = f.Join(Spec("j", "10.0.0.1"));
  auto d = f.Join(Spec("j", "10.0.0.2"));
  CHECK(AssignmentOf(*c).round == 0);
  CHECK(f.journal.jobs.at("j").snapshot.state == "running");
}

TEST_CASE("JobTable: a stream lost with a hold keeps the seat; the timer learns the hold's end",
          "[unit]") {
  Fixture f;
  auto a = f.Join(Spec("j", "10.0.0.1"));
  auto b = f.Join(Spec("j", "10.0.0.2"));
  const std::size_t a_events = a->events.size();
  f.notified.clear();
  f.table->StreamLost("j", b->bound_node, b.get(), 3s);
  CHECK(a->events.size() == a_events);  // the survivor is told nothing
  REQUIRE(f.notified.size() == 1);
  CHECK(f.notified[0] == f.clock.Now() + 3s);
  // b's agent re-attaches into round 0 on a new stream: its assignment again.
  JoinSpec resume = Spec("j", "10.0.0.2");
  resume.resume_round = 0;
  resume.resume_node_id = b->bound_node;
  auto again = f.Join(resume);
  CHECK(AssignmentOf(*again).round == 0);
  f.clock.Advance(4s);
  f.table->Tick();
  CHECK(a->events.size() == a_events);
  CHECK(f.table->Status("j").at(0).round == 0);
}

TEST_CASE("JobTable: CheckStoreValue asks the journal; without one every value fits", "[unit]") {
  Fixture f;
  f.journal.max_value = 10;
  const StoreScope scope{"j", "t", 0};
  CHECK(f.table->CheckStoreValue(scope, "k", 10).ok());
  CHECK(KindOf(f.table->CheckStoreValue(scope, "k", 11)) == ErrorKind::kBadInput);
  FakeClock clock;
  JobTableOptions none;
  none.clock = &clock;
  JobTable plain(std::move(none));
  CHECK(plain.CheckStoreValue(scope, "k", 1u << 30).ok());
}

TEST_CASE("JobTable: refused joins, a refused first join leaves no job", "[unit]") {
  Fixture f;
  JoinSpec bad = Spec("j", "10.0.0.1");
  bad.nproc = 0;
  CHECK(absl::IsInvalidArgument(f.Refused(bad)));
  CHECK(f.table->NumJobs() == 0);

  // The one job id rule (job_id.h), fenced, on one line.
  absl::Status space = f.Refused(Spec("a b", "10.0.0.1"));
  CHECK(absl::IsInvalidArgument(space));
  const std::string msg(space.message());
  CHECK(msg.rfind("[job a b round -1] the job id 'a b' contains a space; ", 0) == 0);
  CHECK(msg.find('\n') == std::string::npos);
  // An unprintable id is not echoed in the fence.
  absl::Status ctrl = f.Refused(Spec(std::string("a\x01"), "10.0.0.1"));
  CHECK(std::string(ctrl.message()).rfind("the job id '", 0) == 0);
  CHECK(absl::IsInvalidArgument(f.Refused(Spec("", "10.0.0.1"))));
  CHECK(absl::IsInvalidArgument(f.Refused(Spec(std::string(300, 'x'), "10.0.0.1"))));

  JoinSpec forever = Spec("j", "10.0.0.1");
  forever.policy.join_timeout_s = 1e9;
  CHECK(absl::IsInvalidArgument(f.Refused(forever)));
  JoinSpec nan = Spec("j", "10.0.0.1");
  nan.policy.last_call_timeout_s = std::numeric_limits<double>::quiet_NaN();
  CHECK(absl::IsInvalidArgument(f.Refused(nan)));
  CHECK(f.table->NumJobs() == 0);
}

TEST_CASE("JobTable: at most max_jobs jobs; jobs that exist still take joins", "[unit]") {
  JobTableOptions o;
  o.max_jobs = 2;
  Fixture f(o);
  f.Join(Spec("a", "10.0.0.1"));
  f.Join(Spec("b", "10.0.0.1"));
  absl::Status third = f.Refused(Spec("c", "10.0.0.1"));
  CHECK(absl::IsResourceExhausted(third));
  CHECK(KindOf(third) == ErrorKind::kBadInput);
  CHECK(f.table->NumJobs() == 2);
  f.Join(Spec("a", "10.0.0.2"));  // completes job a
}

TEST_CASE("JobTable: a join timeout expires on Tick at its deadline, not before", "[unit]") {
  Fixture f;
  const TimePoint t0 = f.clock.Now();
  auto a = f.Join(Spec("j", "10.0.0.1"));
  // The timer learnt the join deadline.
  REQUIRE_FALSE(f.notified.empty());
  CHECK(f.notified.back() == t0 + 10s);
  CHECK(f.table->NextDeadline() == t0 + 10s);
  f.clock.Advance(9s);
  f.table->Tick();
  CHECK(a->events.empty());
  f.clock.Advance(1s);
  f.table->Tick();
  const auto* st = a->Last<absl::Status>();
  REQUIRE(st != nullptr);
  CHECK(KindOf(*st) == ErrorKind::kTimeout);
  CHECK_THAT(std::string(st->message()), Catch::Contains("1 of 2 required nodes"));
  CHECK(f.table->NextDeadline() == std::nullopt);
}

TEST_CASE("JobTable: a join that completes its round notifies no deadline", "[unit]") {
  // The joiner's join timeout is gone by the time the call returns: a timer
  // told of it would wake (or, in ddprun's one-node table, start) for nothing.
  Fixture f;
  auto solo = f.Join(Spec("one", "10.0.0.1", 1, 1));
  CHECK(AssignmentOf(*solo).world_size == 2);  // 1 node x 2 workers
  CHECK(f.notified.empty());
  const TimePoint t0 = f.clock.Now();
  f.Join(Spec("two", "10.0.0.1"));
  REQUIRE(f.notified.size() == 1);  // the first joiner's timeout is pending
  CHECK(f.notified.back() == t0 + 10s);
  auto last = f.Join(Spec("two", "10.0.0.2"));
  CHECK(AssignmentOf(*last).world_size == 4);
  CHECK(f.notified.size() == 1);
  CHECK(f.table->NextDeadline() == std::nullopt);
}

TEST_CASE("JobTable: the last call completes a round of MIN nodes", "[unit]") {
  Fixture f;
  const TimePoint t0 = f.clock.Now();
  auto a = f.Join(Spec("j", "10.0.0.1", 1, 2));
  CHECK(f.notified.back() == t0 + 1s);  // the armed last call, not the later join timeout
  CHECK(f.table->NextDeadline() == t0 + 1s);
  f.clock.Advance(1s);
  f.table->Tick();
  CHECK(AssignmentOf(*a).world_size == 2);
  CHECK(f.table->NextDeadline() == std::nullopt);
}

TEST_CASE("JobTable: no deadline stays pending after Tick (last call without enough nodes)",
          "[unit]") {
  Fixture f;
  JoinSpec early = Spec("j", "10.0.0.1", 2, 3);
  early.policy.last_call_timeout_s = 5;
  auto a = f.Join(early);
  f.clock.Advance(9s);
  JoinSpec late = early;
  late.host = "10.0.0.2";
  auto b = f.Join(late);    // 2 of MIN 2: the last call is armed for t0+14s
  f.clock.Advance(1500ms);  // a's join timeout (t0+10s) passes first
  f.table->Tick();
  REQUIRE(a->Last<absl::Status>() != nullptr);
  f.clock.Advance(5s);  // past the old last call
  f.table->Tick();
  auto next = f.table->NextDeadline();
  REQUIRE(next.has_value());
  CHECK(*next > f.clock.Now());  // b's own join timeout, not a stale last call
  CHECK(b->events.empty());
}

TEST_CASE("JobTable: store scope checks, and a store wait that times out on Tick", "[unit]") {
  Fixture f;
  auto a = f.Join(Spec("j", "10.0.0.1"));
  f.Join(Spec("j", "10.0.0.2"));
  const Assignment& as = AssignmentOf(*a);
  const StoreScope scope{"j", as.store_token, as.round};

  CHECK(absl::IsUnauthenticated(f.table->StoreFor({"j", "", as.round}).status()));
  CHECK(absl::IsPermissionDenied(f.table->StoreFor({"j", "nope", as.round}).status()));
  CHECK(absl::IsPermissionDenied(f.table->StoreFor({"other", as.store_token, 0}).status()));
  CHECK(KindOf(f.table->StoreFor({"j", as.store_token, as.round + 1}).status()) ==
        ErrorKind::kState);
  CHECK(absl::IsInvalidArgument(f.table->StoreFor({"a b", as.store_token, 0}).status()));

  auto engine = f.table->StoreFor(scope);
  REQUIRE(engine.ok());
  REQUIRE((*engine)->Set("k", "v").ok());
  REQUIRE(f.table->PersistKey(scope, "k", **engine).ok());
  CHECK(f.journal.jobs.at("j").store.size() == 1);

  std::optional<absl::Status> got;
  const TimePoint deadline = f.clock.Now() + 5s;
  f.table->WaitAsync(**engine, {"missing"}, deadline, [&](absl::Status st) { got = st; });
  CHECK(f.notified.back() == deadline);
  CHECK(f.table->NextDeadline() == deadline);
  f.clock.Advance(4s);
  f.table->Tick();
  CHECK_FALSE(got.has_value());
  f.clock.Advance(1s);
  f.table->Tick();
  REQUIRE(got.has_value());
  CHECK(KindOf(*got) == ErrorKind::kTimeout);
  CHECK(f.table->NextDeadline() == std::nullopt);
}

TEST_CASE("JobTable: a closed job is kept for the retention, then forgotten", "[unit]") {
  JobTableOptions o;
  o.closed_job_retention = 60s;
  Fixture f(o);
  auto a = f.Join(Spec("j", "10.0.0.1"));
  auto b = f.Join(Spec("j", "10.0.0.2"));
  const Assignment x = AssignmentOf(*a);
  const Assignment y = AssignmentOf(*b);
  REQUIRE(f.table->Report("j", x.node_id, x.round, Outcome::kSucceeded, {}).ok());
  REQUIRE(f.table->Report("j", y.node_id, y.round, Outcome::kSucceeded, {}).ok());
  REQUIRE(a->Last<JobClosed>() != nullptr);
  CHECK(a->Last<JobClosed>()->success);
  const TimePoint closed_at = f.clock.Now();
  CHECK(f.table->Status("j").at(0).state == "succeeded");
  CHECK(f.table->NextDeadline() == closed_at + 60s);

  // A join to the closed job is refused as Closed, across any transport.
  absl::Status late = f.Refused(Spec("j", "10.0.0.3"));
  CHECK(KindOf(late) == ErrorKind::kClosed);
  CHECK_THAT(std::string(late.message()), Catch::StartsWith("[job j round 0] the job is closed"));

  f.clock.Advance(59s);
  f.table->Tick();
  CHECK(f.table->NumJobs() == 1);
  f.clock.Advance(1s);
  f.table->Tick();
  CHECK(f.table->NumJobs() == 0);
  CHECK(f.journal.forgotten == std::vector<std::string>{"j"});
  CHECK(absl::IsNotFound(f.table->Report("j", x.node_id, x.round, Outcome::kSucceeded, {})));
}

TEST_CASE("JobTable: a retention of Duration::max() keeps a closed job without a deadline",
          "[unit]") {
  // ddprun's in-process table of a one-node job: nothing for a timer to do
  // once the job is over, so no timer thread is started at exit.
  JobTableOptions o;
  o.closed_job_retention = Duration::max();
  Fixture f(o);
  auto a = f.Join(Spec("j", "10.0.0.1", 1, 1));  // a one-node round: formed at once
  const Assignment x = AssignmentOf(*a);
  REQUIRE(f.table->Report("j", x.node_id, x.round, Outcome::kSucceeded, {}).ok());
  REQUIRE(a->Last<JobClosed>() != nullptr);
  const std::size_t notified = f.notified.size();
  CHECK(f.table->NextDeadline() == std::nullopt);
  f.clock.Advance(std::chrono::hours(24 * 365));
  f.table->Tick();
  CHECK(f.table->NumJobs() == 1);
  CHECK(f.table->Status("j").at(0).state == "succeeded");
  CHECK(f.notified.size() == notified);
  CHECK(KindOf(f.Refused(Spec("j", "10.0.0.2", 1, 1))) == ErrorKind::kClosed);
}

TEST_CASE("JobTable: a lost stream restarts the others; a stale stream is ignored", "[unit]") {
  Fixture f;
  auto a = f.Join(Spec("j", "10.0.0.1"));
  auto b = f.Join(Spec("j", "10.0.0.2"));
  const Assignment y = AssignmentOf(*b);
  RecordingSink stranger;
  f.table->StreamLost("j", y.node_id, &stranger);  // not b's current stream
  CHECK(a->events.size() == 1);
  f.table->StreamLost("j", y.node_id, b.get());
  const auto* restart = a->Last<RestartRound>();
  REQUIRE(restart != nullptr);
  CHECK(restart->next_round == 1);
  CHECK_FALSE(restart->counts_as_failure);
  CHECK(f.table->Status("j").at(0).round == 1);
}

TEST_CASE("JobTable: a job whose only node left before it ran is forgotten at once", "[unit]") {
  // Issue 33 item 8: it used to stay listed, gathering, until its join timeout.
  Fixture f;
  auto a = f.Join(Spec("j", "10.0.0.1"));
  CHECK(f.table->NumJobs() == 1);
  f.table->StreamLost("j", a->bound_node, a.get());
  CHECK(f.table->NumJobs() == 0);
  CHECK(f.table->Status("").empty());
  CHECK(f.journal.forgotten == std::vector<std::string>{"j"});
  // The same id later starts afresh.
  auto b = f.Join(Spec("j", "10.0.0.1"));
  auto c = f.Join(Spec("j", "10.0.0.2"));
  CHECK(AssignmentOf(*c).round == 0);

  // A node still waiting keeps the job; so does a job that has run (its round
  // 1 gathers after a loss).
  auto d = f.Join(Spec("k", "10.0.0.1", 3, 3));
  auto e = f.Join(Spec("k", "10.0.0.2", 3, 3));
  f.table->StreamLost("k", d->bound_node, d.get());
  CHECK(f.table->Status("k").size() == 1);
  f.table->StreamLost("j", b->bound_node, b.get());
  REQUIRE(f.table->Status("j").size() == 1);
  CHECK(f.table->Status("j").at(0).round == 1);
  f.table->StreamLost("j", c->bound_node, c.get());
  CHECK(f.table->Status("j").size() == 1);
}

TEST_CASE("JobTable: Status lists one job or every job in id order", "[unit]") {
  Fixture f;
  f.Join(Spec("zeta", "10.0.0.1"));
  f.Join(Spec("alpha", "10.0.0.1"));
  f.Join(Spec("alpha", "10.0.0.2"));
  auto all = f.table->Status();
  REQUIRE(all.size() == 2);
  CHECK(all[0].job_id == "alpha");
  CHECK(all[0].state == "running");
  CHECK(all[0].world_size == 4);
  CHECK(all[1].job_id == "zeta");
  CHECK(all[1].state == "gathering");
  CHECK(f.table->Status("zeta").size() == 1);
  CHECK(f.table->Status("nope").empty());
}

TEST_CASE("JobTable: Shutdown ends every stream and refuses changes", "[unit]") {
  Fixture f;
  auto a = f.Join(Spec("j", "10.0.0.1"));
  f.Join(Spec("j", "10.0.0.2"));  // running: the journal holds it
  f.table->Shutdown();
  const auto* st = a->Last<absl::Status>();
  REQUIRE(st != nullptr);
  CHECK(KindOf(*st) == ErrorKind::kConnection);
  CHECK(KindOf(f.Refused(Spec("j", "10.0.0.3"))) == ErrorKind::kConnection);
  CHECK(f.table->NextDeadline() == std::nullopt);
  // The job stays in the journal for a restarted server.
  CHECK(f.journal.jobs.count("j") == 1);
}

TEST_CASE("JobTable: Recover brings a running job back from the journal", "[unit]") {
  MemoryJournal journal;
  FakeClock clock;
  std::string token;
  {
    JobTableOptions o;
    o.clock = &clock;
    o.journal = &journal;
    JobTable first(o);
    auto a = std::make_shared<RecordingSink>();
    REQUIRE(first.Join(Spec("j", "10.0.0.1"), a).ok());
    REQUIRE(first.Join(Spec("j", "10.0.0.2"), std::make_shared<RecordingSink>()).ok());
    token = AssignmentOf(*a).store_token;
    auto engine = first.StoreFor({"j", token, 0});
    REQUIRE(engine.ok());
    REQUIRE((*engine)->Set("k", "v").ok());
    REQUIRE(first.PersistKey({"j", token, 0}, "k", **engine).ok());
  }
  JobTableOptions o;
  o.clock = &clock;
  o.reattach_timeout = 3s;
  o.journal = &journal;
  JobTable second(o);
  REQUIRE(second.Recover().ok());
  REQUIRE(second.Status("j").size() == 1);
  CHECK(second.Status("j")[0].state == "running");
  auto engine = second.StoreFor({"j", token, 0});
  REQUIRE(engine.ok());
  CHECK((*engine)->Get("k") == "v");
  // The members are detached until they re-attach: their deadline is pending.
  CHECK(second.NextDeadline() == clock.Now() + 3s);
}

// Issue 33 item 00: ddprund restarted (--state_dir) while a job gathers keeps
// the job, its shape and the policy its first joiner fixed; its agents join
// again, in any order, and the round forms.
TEST_CASE("JobTable: Recover brings a gathering job back; its agents join it again", "[unit]") {
  MemoryJournal journal;
  FakeClock clock;
  JoinSpec a_spec = Spec("g", "10.0.0.1");
  a_spec.policy.last_call_timeout_s = 7;
  {
    JobTableOptions o;
    o.clock = &clock;
    o.journal = &journal;
    JobTable first(o);
    REQUIRE(first.Join(a_spec, std::make_shared<RecordingSink>()).ok());
  }
  JobTableOptions o;
  o.clock = &clock;
  o.journal = &journal;
  JobTable second(o);
  REQUIRE(second.Recover().ok());
  REQUIRE(second.Status("g").size() == 1);
  CHECK(second.Status("g")[0].state == "gathering");
  CHECK(second.Status("g")[0].max_nodes == 2);
  // B first: no seat is held for A at round 0, and B's join is checked
  // against the restored shape.
  auto b = std::make_shared<RecordingSink>();
  REQUIRE(second.Join(Spec("g", "10.0.0.2"), b).ok());
  auto a = std::make_shared<RecordingSink>();
  REQUIRE(second.Join(a_spec, a).ok());
  CHECK(AssignmentOf(*a).world_size == 4);
  CHECK(AssignmentOf(*b).world_size == 4);
  REQUIRE(AssignmentOf(*b).policy.has_value());
  CHECK(AssignmentOf(*b).policy->last_call_timeout_s == 7);  // the first joiner's, kept
}

}  // namespace
}  // namespace ddprun::rendezvous
