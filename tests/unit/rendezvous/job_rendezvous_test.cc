// The round state machine with a fake clock: no sockets, no sleeping.
#include "ddprun/rendezvous/job_rendezvous.h"

#include <catch2/catch.hpp>
#include <map>
#include <set>

namespace ddprun::rendezvous {
namespace {

JoinSpec Spec(const std::string& host, int pid, int min_nodes = 2, int max_nodes = 2,
              int nproc = 4) {
  JoinSpec s;
  s.job_id = "job42";
  s.host = host;
  s.pid = pid;
  s.nproc = nproc;
  s.min_nodes = min_nodes;
  s.max_nodes = max_nodes;
  s.policy.last_call_timeout_s = 1.0;
  s.policy.join_timeout_s = 10.0;
  s.master_port = 1000 + pid;
  s.command = "train";
  s.policy.max_restarts = 3;
  return s;
}

template <typename T>
std::vector<std::pair<std::string, T>> Of(const std::vector<Delivery>& out) {
  std::vector<std::pair<std::string, T>> r;
  for (const auto& d : out)
    if (auto* e = std::get_if<T>(&d.event)) r.emplace_back(d.node_id, *e);
  return r;
}

struct Fixture {
  FakeClock clock;
  JobRendezvous job{"job42", clock};
  std::vector<Delivery> out;

  std::string Join(const JoinSpec& s) {
    auto id = job.Join(s, &out);
    REQUIRE(id.ok());
    return *id;
  }
};

TEST_CASE("round completes when max nodes joined, ranks contiguous per node", "[unit]") {
  Fixture f;
  auto b = f.Join(Spec("10.0.0.2", 7));
  CHECK(f.out.empty());
  CHECK(f.job.state() == JobRendezvous::State::kGathering);
  auto a = f.Join(Spec("10.0.0.1", 9));
  auto as = Of<Assignment>(f.out);
  REQUIRE(as.size() == 2);
  CHECK(f.job.state() == JobRendezvous::State::kRunning);
  std::map<std::string, Assignment> by;
  for (auto& [id, x] : as) by[id] = x;
  // Group ranks follow (host, pid) order, not join order.
  CHECK(by[a].group_rank == 0);
  CHECK(by[a].base_rank == 0);
  CHECK(by[b].group_rank == 1);
  CHECK(by[b].base_rank == 4);
  for (auto& [id, x] : by) {
    CHECK(x.world_size == 8);
    CHECK(x.group_world_size == 2);
    CHECK(x.local_world_size == 4);
    CHECK(x.master_addr == "10.0.0.1");
    CHECK(x.master_port == 1009);
    CHECK(x.round == 0);
    CHECK(x.store_token == f.job.store_token());
    CHECK(x.store_token.size() == 32);
  }
}

TEST_CASE("requested node ranks win over address order", "[unit]") {
  Fixture f;
  auto s1 = Spec("10.0.0.1", 1);
  s1.requested_rank = 1;
  auto s2 = Spec("10.0.0.2", 2);
  s2.requested_rank = 0;
  auto a = f.Join(s1);
  auto b = f.Join(s2);
  std::map<std::string, Assignment> by;
  for (auto& [id, x] : Of<Assignment>(f.out)) by[id] = x;
  CHECK(by[a].group_rank == 1);
  CHECK(by[b].group_rank == 0);
  CHECK(by[a].master_addr == "10.0.0.2");
}

// torchrun ignores --node_rank under c10d, so a job script that passes the
// same constant on every node runs there: here the rank is a preference and
// a taken one falls back to arrival order (seen with torch 2.11's torchrun).
TEST_CASE("two agents asking for the same node rank: the second gets another", "[unit]") {
  Fixture f;
  auto s1 = Spec("10.0.0.2", 1);
  s1.requested_rank = 0;
  auto s2 = Spec("10.0.0.1", 2);
  s2.requested_rank = 0;
  auto a = f.Join(s1);
  auto b = f.Join(s2);
  auto as = Of<Assignment>(f.out);
  REQUIRE(as.size() == 2);
  std::map<std::string, Assignment> by;
  for (auto& [id, x] : as) by[id] = x;
  CHECK(by[a].group_rank == 0);  // the first to ask keeps it
  CHECK(by[b].group_rank == 1);  // though its address sorts first
  // The same agent twice is still refused.
  auto again = f.job.Join(s1, &f.out);
  CHECK(absl::IsAlreadyExists(again.status()));
  CHECK_THAT(std::string(again.status().message()), Catch::Contains("[job job42 round 0]"));
}

TEST_CASE("mismatched job shape is refused with the field named", "[unit]") {
  Fixture f;
  f.Join(Spec("h1", 1));
  auto bad = Spec("h2", 2, 2, 3);
  auto r = f.job.Join(bad, &f.out);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(std::string(r.status().message()), Catch::Contains("--nnodes"));
  auto cmd = Spec("h2", 2);
  cmd.command = "other";
  CHECK_THAT(std::string(f.job.Join(cmd, &f.out).status().message()), Catch::Contains("command"));
  auto tok = Spec("h2", 2);
  tok.join_token = "secret";
  CHECK(absl::IsPermissionDenied(f.job.Join(tok, &f.out).status()));
  auto rank = Spec("h2", 2);
  rank.requested_rank = 2;
  CHECK(absl::IsInvalidArgument(f.job.Join(rank, &f.out).status()));
}

// Issue 33 item 9b: as torchrun's _assign_worker_ranks: a node's local world
// size is its own, global ranks follow node order, the world size is the sum.
TEST_CASE("nodes with different nproc: own local world size, ranks in node order", "[unit]") {
  Fixture f;
  const std::string a = f.Join(Spec("h1", 1, 3, 3, /*nproc=*/2));
  const std::string b = f.Join(Spec("h2", 2, 3, 3, /*nproc=*/1));
  const std::string c = f.Join(Spec("h3", 3, 3, 3, /*nproc=*/3));
  auto as = Of<Assignment>(f.out);
  REQUIRE(as.size() == 3);
  std::map<std::string, Assignment> by;
  for (auto& [id, x] : as) by[id] = x;
  CHECK(by[a].base_rank == 0);
  CHECK(by[b].base_rank == 2);
  CHECK(by[c].base_rank == 3);
  CHECK(by[a].local_world_size == 2);
  CHECK(by[b].local_world_size == 1);
  CHECK(by[c].local_world_size == 3);
  for (const auto& id : {a, b, c}) {
    CHECK(by[id].world_size == 6);
    CHECK(by[id].group_world_size == 3);
  }
  CHECK(f.job.Status().world_size == 6);
}

TEST_CASE("elastic: last call completes the round after min nodes", "[unit]") {
  Fixture f;
  f.Join(Spec("h1", 1, 2, 4));
  f.Join(Spec("h2", 2, 2, 4));
  CHECK(f.out.empty());
  REQUIRE(f.job.NextDeadline().has_value());
  f.clock.Advance(std::chrono::milliseconds(999));
  f.job.Tick(&f.out);
  CHECK(f.out.empty());
  f.clock.Advance(std::chrono::milliseconds(2));
  f.job.Tick(&f.out);
  auto as = Of<Assignment>(f.out);
  REQUIRE(as.size() == 2);
  CHECK(as[0].second.world_size == 8);
}

TEST_CASE("uneven joins: a late third node makes a spare or a scale-up", "[unit]") {
  Fixture f;
  f.Join(Spec("h1", 1, 1, 2));
  f.clock.Advance(std::chrono::seconds(2));
  f.job.Tick(&f.out);
  REQUIRE(Of<Assignment>(f.out).size() == 1);
  f.out.clear();
  // Scale-up: the running member is told to re-join; it is not a failure.
  auto b = f.Join(Spec("h2", 2, 1, 2));
  auto rs = Of<RestartRound>(f.out);
  REQUIRE(rs.size() == 1);
  CHECK(rs[0].first == "h1:1");
  CHECK_FALSE(rs[0].second.counts_as_failure);
  CHECK(f.job.round() == 1);
  f.out.clear();
  f.Join(Spec("h1", 1, 1, 2));
  auto as = Of<Assignment>(f.out);
  REQUIRE(as.size() == 2);
  CHECK(as[0].second.round == 1);
  CHECK(as[0].second.restart_count == 0);
  f.out.clear();
  // The round is full: a third node waits as a spare.
  auto c = f.Join(Spec("h3", 3, 1, 2));
  CHECK(f.out.empty());
  CHECK(f.job.Status().waiting == 1);
  // A member fails: the spare is promoted into the next round.
  REQUIRE(f.job.Report(b, 1, Outcome::kFailed, {}, &f.out).ok());
  CHECK(Of<RestartRound>(f.out).size() == 2);
  f.out.clear();
  f.Join(Spec("h1", 1, 1, 2));
  f.Join(Spec("h2", 2, 1, 2));  // back, but the round is full with h1 and h3
  auto as2 = Of<Assignment>(f.out);
  REQUIRE(as2.size() == 2);
  std::set<std::string> ids;
  for (auto& [id, a] : as2) ids.insert(id);
  CHECK(ids.count(c) == 1);
  CHECK(ids.count("h1:1") == 1);
}

TEST_CASE("worker failure: job-wide restart count, then the job closes", "[unit]") {
  Fixture f;
  auto base = [](const std::string& h, int p) {
    auto s = Spec(h, p);
    s.policy.max_restarts = 1;
    return s;
  };
  auto a = f.Join(base("h1", 1));
  auto b = f.Join(base("h2", 2));
  f.out.clear();
  WorkerFailure wf;
  wf.host = "h2";
  wf.global_rank = 5;
  wf.local_rank = 1;
  wf.exit_code = 3;
  REQUIRE(f.job.Report(b, 0, Outcome::kFailed, {wf}, &f.out).ok());
  auto rs = Of<RestartRound>(f.out);
  REQUIRE(rs.size() == 2);  // both agents, the reporter too
  CHECK(rs[0].second.counts_as_failure);
  f.out.clear();
  f.Join(base("h1", 1));
  f.Join(base("h2", 2));
  auto as = Of<Assignment>(f.out);
  REQUIRE(as.size() == 2);  // completes without waiting for a last call
  for (auto& [id, x] : as) CHECK(x.restart_count == 1);
  f.out.clear();
  // A stale report (round 0) is refused.
  CHECK(absl::IsFailedPrecondition(f.job.Report(a, 0, Outcome::kFailed, {}, &f.out)));
  // Second failure: budget spent, everyone gets JobClosed with both failures.
  wf.exit_code = 4;
  REQUIRE(f.job.Report(a, 1, Outcome::kFailed, {wf}, &f.out).ok());
  auto cs = Of<JobClosed>(f.out);
  REQUIRE(cs.size() == 2);
  CHECK_FALSE(cs[0].second.success);
  REQUIRE(cs[0].second.failures.size() == 2);
  CHECK(cs[0].second.failures[0].exit_code == 3);  // first failure first
  CHECK(cs[0].second.failures[0].round == 0);
  CHECK(cs[0].second.failures[1].round == 1);
  CHECK(f.job.state() == JobRendezvous::State::kClosed);
  CHECK_FALSE(f.job.Join(base("h9", 9), &f.out).ok());
}

TEST_CASE("success closes the job once every member reported", "[unit]") {
  Fixture f;
  auto a = f.Join(Spec("h1", 1));
  auto b = f.Join(Spec("h2", 2));
  f.out.clear();
  REQUIRE(f.job.Report(a, 0, Outcome::kSucceeded, {}, &f.out).ok());
  CHECK(f.job.state() == JobRendezvous::State::kRunning);
  // A finished agent going away is not a loss.
  f.job.NodeLost(a, &f.out);
  CHECK(f.out.empty());
  REQUIRE(f.job.Report(b, 0, Outcome::kSucceeded, {}, &f.out).ok());
  CHECK(f.job.state() == JobRendezvous::State::kClosed);
  CHECK(f.job.Status().state == "succeeded");
}

TEST_CASE("a lost member makes the survivors re-rendezvous, not counted", "[unit]") {
  Fixture f;
  auto a = f.Join(Spec("h1", 1, 1, 3));
  auto b = f.Join(Spec("h2", 2, 1, 3));
  f.clock.Advance(std::chrono::seconds(2));
  f.job.Tick(&f.out);
  REQUIRE(Of<Assignment>(f.out).size() == 2);
  f.out.clear();
  f.job.NodeLost(b, &f.out);
  auto rs = Of<RestartRound>(f.out);
  REQUIRE(rs.size() == 1);
  CHECK(rs[0].first == a);
  CHECK_FALSE(rs[0].second.counts_as_failure);
  f.out.clear();
  f.Join(Spec("h1", 1, 1, 3));
  auto as = Of<Assignment>(f.out);
  REQUIRE(as.size() == 1);  // only survivor expected: no last-call wait
  CHECK(as[0].second.world_size == 4);
  CHECK(as[0].second.restart_count == 0);
}

TEST_CASE("join timeout: a lone node is told within the timeout", "[unit]") {
  Fixture f;
  auto a = f.Join(Spec("h1", 1));
  f.clock.Advance(std::chrono::seconds(9));
  f.job.Tick(&f.out);
  CHECK(f.out.empty());
  f.clock.Advance(std::chrono::seconds(1));
  f.job.Tick(&f.out);
  REQUIRE(f.out.size() == 1);
  auto* st = std::get_if<absl::Status>(&f.out[0].event);
  REQUIRE(st);
  CHECK(absl::IsDeadlineExceeded(*st));
  CHECK_THAT(std::string(st->message()), Catch::Contains("1 of 2 required nodes"));
}

TEST_CASE("rank assignment for many uneven joins is a permutation", "[unit]") {
  const int n = GENERATE(1, 3, 8, 64);
  Fixture f;
  for (int i = n; i > 0; --i) f.Join(Spec("10.0.0." + std::to_string(i % 7), i, n, n, 2));
  auto as = Of<Assignment>(f.out);
  REQUIRE(static_cast<int>(as.size()) == n);
  std::vector<int> seen(n, 0);
  for (auto& [id, a] : as) {
    seen.at(a.group_rank)++;
    CHECK(a.base_rank == 2 * a.group_rank);
    CHECK(a.world_size == 2 * n);
  }
  for (int s : seen) CHECK(s == 1);
}

}  // namespace
}  // namespace ddprun::rendezvous

namespace ddprun::rendezvous {
namespace {

TEST_CASE("snapshot and restore: members re-attach to the same round", "[unit]") {
  Fixture f;
  auto a = f.Join(Spec("h1", 1));
  auto b = f.Join(Spec("h2", 2));
  REQUIRE(Of<Assignment>(f.out).size() == 2);
  REQUIRE(f.job.Report(a, 0, Outcome::kSucceeded, {}, &f.out).ok());
  const auto v = f.job.version();
  JobSnapshot snap = f.job.Snapshot();
  CHECK(snap.state == "running");
  REQUIRE(snap.assigned_ids.size() == 2);

  auto restored = JobRendezvous::Restore(snap, f.clock, std::chrono::seconds(5));
  CHECK(restored->state() == JobRendezvous::State::kRunning);
  CHECK(restored->store_token() == f.job.store_token());
  CHECK(v > 0);
  // b re-attaches: it gets the same assignment, nothing else happens.
  std::vector<Delivery> out;
  auto rs = Spec("h2", 2);
  rs.resume_round = 0;
  rs.resume_node_id = b;
  auto id = restored->Join(rs, &out);
  REQUIRE(id.ok());
  auto as = Of<Assignment>(out);
  REQUIRE(as.size() == 1);
  CHECK(as[0].second.group_rank == 1);
  CHECK(as[0].second.base_rank == 4);
  CHECK(as[0].second.master_port == 1001);
  CHECK(as[0].second.store_token == f.job.store_token());
  // Nothing is pending: a finished member needs no re-attach.
  CHECK_FALSE(restored->NextDeadline().has_value());
  out.clear();
  REQUIRE(restored->Report(b, 0, Outcome::kSucceeded, {}, &out).ok());
  CHECK(restored->state() == JobRendezvous::State::kClosed);
}

TEST_CASE("restore: a member that does not re-attach in time is lost", "[unit]") {
  Fixture f;
  auto snapshot_of = [&] {
    f.Join(Spec("h1", 1, 1, 2));
    f.Join(Spec("h2", 2, 1, 2));
    return f.job.Snapshot();
  };
  JobSnapshot snap = snapshot_of();
  auto job = JobRendezvous::Restore(snap, f.clock, std::chrono::seconds(5));
  std::vector<Delivery> out;
  auto rs = Spec("h1", 1, 1, 2);
  rs.resume_round = 0;
  rs.resume_node_id = "h1:1";
  REQUIRE(job->Join(rs, &out).ok());
  out.clear();
  f.clock.Advance(std::chrono::seconds(4));
  job->Tick(&out);
  CHECK(out.empty());
  f.clock.Advance(std::chrono::seconds(1));
  job->Tick(&out);
  auto r = Of<RestartRound>(out);
  REQUIRE(r.size() == 1);  // the survivor re-rendezvous without h2
  CHECK(r[0].first == "h1:1");
  CHECK(job->round() == 1);
}

// A stream broken while the server was stalled (docs/ha.md, "A stalled
// ddprund"): the member keeps its seat for the hold, the others hear nothing.
TEST_CASE("a detached member re-attaches into its round within the hold; late, it is lost",
          "[unit]") {
  Fixture f;
  auto a = f.Join(Spec("h1", 1));
  auto b = f.Join(Spec("h2", 2));
  REQUIRE(Of<Assignment>(f.out).size() == 2);
  f.out.clear();
  const auto by = f.job.NodeDetached(b, std::chrono::seconds(5), &f.out);
  REQUIRE(by.has_value());
  CHECK(*by == f.clock.Now() + std::chrono::seconds(5));
  CHECK(f.out.empty());  // a is not told anything
  CHECK(f.job.NextDeadline() == by);
  auto rs = Spec("h2", 2);
  rs.resume_round = 0;
  rs.resume_node_id = b;
  SECTION("back within the hold: the same assignment, the round goes on") {
    f.clock.Advance(std::chrono::seconds(4));
    REQUIRE(f.job.Join(rs, &f.out).ok());
    auto as = Of<Assignment>(f.out);
    REQUIRE(as.size() == 1);
    CHECK(as[0].first == b);
    CHECK(as[0].second.round == 0);
    CHECK(as[0].second.group_rank == 1);
    CHECK_FALSE(f.job.NextDeadline().has_value());
    f.clock.Advance(std::chrono::seconds(2));
    f.out.clear();
    f.job.Tick(&f.out);
    CHECK(f.out.empty());
    CHECK(f.job.round() == 0);
  }
  SECTION("not back: lost at the hold's end; its late resume is fenced by the round") {
    f.clock.Advance(std::chrono::seconds(5));
    f.job.Tick(&f.out);
    auto r = Of<RestartRound>(f.out);
    REQUIRE(r.size() == 1);
    CHECK(r[0].first == a);
    CHECK_FALSE(r[0].second.counts_as_failure);
    CHECK(f.job.round() == 1);
    f.out.clear();
    REQUIRE(f.job.Join(rs, &f.out).ok());
    auto late = Of<RestartRound>(f.out);
    REQUIRE(late.size() == 1);
    CHECK(late[0].second.next_round == 1);
    CHECK(Of<Assignment>(f.out).empty());
  }
}

TEST_CASE("NodeDetached outside a running round, or of a finished member, is NodeLost", "[unit]") {
  Fixture f;
  auto a = f.Join(Spec("h1", 1));
  CHECK_FALSE(f.job.NodeDetached(a, std::chrono::seconds(5), &f.out).has_value());
  CHECK_FALSE(f.job.HasNode(a));  // removed from the gathering round
  a = f.Join(Spec("h1", 1));
  auto b = f.Join(Spec("h2", 2));
  REQUIRE(f.job.state() == JobRendezvous::State::kRunning);
  REQUIRE(f.job.Report(a, 0, Outcome::kSucceeded, {}, &f.out).ok());
  f.out.clear();
  CHECK_FALSE(f.job.NodeDetached(a, std::chrono::seconds(5), &f.out).has_value());
  CHECK(f.out.empty());
  CHECK_FALSE(f.job.NextDeadline().has_value());
  (void)b;
}

TEST_CASE("resume for a round that is over gets RestartRound", "[unit]") {
  Fixture f;
  auto a = f.Join(Spec("h1", 1));
  auto b = f.Join(Spec("h2", 2));
  REQUIRE(f.job.Report(a, 0, Outcome::kFailed, {}, &f.out).ok());  // round 1 opens
  f.out.clear();
  auto rs = Spec("h2", 2);
  rs.resume_round = 0;
  rs.resume_node_id = b;
  REQUIRE(f.job.Join(rs, &f.out).ok());
  auto r = Of<RestartRound>(f.out);
  REQUIRE(r.size() == 1);
  CHECK(r[0].second.next_round == 1);
  rs.resume_round = 7;
  CHECK(absl::IsFailedPrecondition(f.job.Join(rs, &f.out).status()));
}

}  // namespace
}  // namespace ddprun::rendezvous

namespace ddprun::rendezvous {
namespace {

TEST_CASE("a host that fails repeatedly is quarantined for the cooldown", "[unit]") {
  FakeClock clock;
  JobRendezvous job("job42", clock, QuarantinePolicy{2, std::chrono::seconds(60)});
  std::vector<Delivery> out;
  auto spec = [](const std::string& h, int p) {
    auto s = Spec(h, p, 1, 2);
    s.policy.max_restarts = 10;
    return s;
  };
  auto join_both = [&] {
    REQUIRE(job.Join(spec("good", 1), &out).ok());
    REQUIRE(job.Join(spec("bad", 2), &out).ok());
  };
  join_both();
  REQUIRE(job.Report("bad:2", 0, Outcome::kFailed, {}, &out).ok());
  join_both();                                                       // round 1
  REQUIRE(job.Report("bad:2", 1, Outcome::kFailed, {}, &out).ok());  // second failure
  out.clear();
  REQUIRE(job.Join(spec("good", 1), &out).ok());
  auto refused = job.Join(spec("bad", 2), &out);
  REQUIRE(absl::IsFailedPrecondition(refused.status()));
  CHECK_THAT(std::string(refused.status().message()), Catch::Contains("quarantined"));
  // The good host does not wait for the quarantined one.
  auto as = Of<Assignment>(out);
  REQUIRE(as.size() == 1);
  CHECK(as[0].second.world_size == 4);
  auto st = job.Status();
  REQUIRE(st.quarantined.size() == 1);
  CHECK_THAT(st.quarantined[0], Catch::StartsWith("bad: 2 worker failures"));
  // After the cooldown it may join again (as a scale-up).
  clock.Advance(std::chrono::seconds(61));
  CHECK(job.Join(spec("bad", 2), &out).ok());
  CHECK(job.Status().quarantined.empty());
}

}  // namespace
}  // namespace ddprun::rendezvous

namespace ddprun::rendezvous {
namespace {

TEST_CASE("a hot spare takes the failed node's seat, whatever the re-join order", "[unit]") {
  Fixture f;
  auto a = f.Join(Spec("h1", 1));
  auto b = f.Join(Spec("h2", 2));
  auto c = f.Join(Spec("h3", 3));  // the round is full: a spare
  CHECK(f.job.Status().waiting == 1);
  f.out.clear();
  REQUIRE(f.job.Report(b, 0, Outcome::kFailed, {}, &f.out).ok());
  f.out.clear();
  // The failed node comes back first: its seat is taken, it waits as a spare.
  f.Join(Spec("h2", 2));
  CHECK(f.out.empty());
  CHECK(f.job.Status().waiting == 1);
  // The healthy member comes back: round 1 runs on it and the promoted spare.
  f.Join(Spec("h1", 1));
  auto as = Of<Assignment>(f.out);
  REQUIRE(as.size() == 2);
  std::set<std::string> ids;
  for (auto& [id, x] : as) {
    ids.insert(id);
    CHECK(x.round == 1);
    CHECK(x.restart_count == 1);
  }
  CHECK(ids == std::set<std::string>{a, c});
}

// The chaos run (bench/chaos, docs/chaos.md) lost every step when seats
// moved: a survivor re-sorted into another group rank got other RANKs, whose
// checkpoints its agent does not hold, and no step was common to all ranks.
TEST_CASE("a survivor keeps its group rank; the promoted spare takes the free seat", "[unit]") {
  Fixture f;
  auto a = f.Join(Spec("h2", 2));
  auto b = f.Join(Spec("h3", 3));
  auto spare = f.Join(Spec("h1", 1));  // sorts before both members
  f.out.clear();
  // b (group rank 1) is lost: h1 is promoted; a must stay group rank 0.
  f.job.NodeLost(b, &f.out);
  f.out.clear();
  f.Join(Spec("h2", 2));
  auto as = Of<Assignment>(f.out);
  REQUIRE(as.size() == 2);
  std::map<std::string, Assignment> by;
  for (auto& [id, x] : as) by[id] = x;
  CHECK(by[a].group_rank == 0);
  CHECK(by[a].base_rank == 0);
  CHECK(by[spare].group_rank == 1);
  CHECK(by[spare].base_rank == 4);
  CHECK(by[a].master_addr == "h2");
  // a (group rank 0) is lost next: a new node on h0 takes seat 0, the
  // former spare keeps seat 1.
  f.out.clear();
  f.job.NodeLost(a, &f.out);
  auto fresh = f.Join(Spec("h0", 9));
  f.Join(Spec("h1", 1));
  as = Of<Assignment>(f.out);
  REQUIRE(as.size() == 2);
  by.clear();
  for (auto& [id, x] : as) by[id] = x;
  CHECK(by[spare].group_rank == 1);
  CHECK(by[fresh].group_rank == 0);
}

// Issue 29 (found with --restart_policy=inplace): nodes started with
// --node_rank keep their seats too. Before, requested ranks re-sorted every
// round: node 0 lost, the survivor (which asked for 1) sorted before the
// promoted spare (which asked for none) and moved to seat 0, so its RANKs
// changed under the checkpoint memory its agent held, and the job resumed
// from nothing.
TEST_CASE(
    "with requested node ranks, a survivor keeps its seat; the promoted spare takes the "
    "free one",
    "[unit]") {
  Fixture f;
  auto s0 = Spec("h1", 1);
  s0.requested_rank = 0;
  auto s1 = Spec("h2", 2);
  s1.requested_rank = 1;
  auto a = f.Join(s0);
  auto b = f.Join(s1);
  auto spare = f.Join(Spec("h3", 3));
  f.out.clear();
  f.job.NodeLost(a, &f.out);  // seat 0
  f.out.clear();
  f.Join(s1);
  auto as = Of<Assignment>(f.out);
  REQUIRE(as.size() == 2);
  std::map<std::string, Assignment> by;
  for (auto& [id, x] : as) by[id] = x;
  CHECK(by[b].group_rank == 1);
  CHECK(by[b].base_rank == 4);
  CHECK(by[spare].group_rank == 0);
  CHECK(by[spare].master_addr == "h3");
  // A newcomer that asks for the free seat gets it: a new agent at the
  // lost node's address with its --node_rank.
  f.out.clear();
  f.job.NodeLost(spare, &f.out);
  auto again = Spec("h1", 5);
  again.requested_rank = 0;
  auto fresh = f.Join(again);
  f.Join(s1);
  as = Of<Assignment>(f.out);
  REQUIRE(as.size() == 2);
  by.clear();
  for (auto& [id, x] : as) by[id] = x;
  CHECK(by[b].group_rank == 1);
  CHECK(by[fresh].group_rank == 0);
}

// Found by chaos_sdk_spare on a loaded machine: b's worker died of a's
// death (a shared-memory peer) and b reported it before a's agent was seen
// lost. The spare s took b's seat, the seat held for a stayed held, and b,
// re-joining into a full round, waited as a spare. Then a was lost: its seat
// was freed but nobody was promoted into it, so the round waited for the
// join timeout with one member and a spare.
TEST_CASE("a node lost while the round gathers frees its seat for a waiting spare", "[unit]") {
  Fixture f;
  auto a = f.Join(Spec("h1", 1));
  auto b = f.Join(Spec("h2", 2));
  auto s = f.Join(Spec("h3", 3));
  f.out.clear();
  REQUIRE(f.job.Report(b, 0, Outcome::kFailed, {}, &f.out).ok());  // s takes b's seat
  f.Join(Spec("h2", 2));  // b is back: the seats are s's and a's; b waits as a spare
  CHECK(Of<Assignment>(f.out).empty());
  f.out.clear();
  f.job.NodeLost(a, &f.out);
  auto as = Of<Assignment>(f.out);
  REQUIRE(as.size() == 2);
  std::set<std::string> ids;
  for (auto& [id, x] : as) ids.insert(id);
  CHECK(ids == std::set<std::string>{b, s});
  CHECK(f.job.state() == JobRendezvous::State::kRunning);
}

TEST_CASE("a worker failure with a spare: the survivor keeps its seat, the spare takes the other",
          "[unit]") {
  Fixture f;
  auto a = f.Join(Spec("h2", 2));
  auto b = f.Join(Spec("h3", 3));
  auto c = f.Join(Spec("h1", 1));  // the spare sorts before both
  f.out.clear();
  REQUIRE(f.job.Report(b, 0, Outcome::kFailed, {}, &f.out).ok());
  f.out.clear();
  f.Join(Spec("h2", 2));
  auto as = Of<Assignment>(f.out);
  REQUIRE(as.size() == 2);
  std::map<std::string, Assignment> by;
  for (auto& [id, x] : as) by[id] = x;
  CHECK(by[a].group_rank == 0);  // before: re-sorted to 1 behind h1's spare
  CHECK(by[c].group_rank == 1);
}

TEST_CASE("without a spare the failed node keeps its seat (no early completion)", "[unit]") {
  Fixture f;
  auto a = f.Join(Spec("h1", 1, 1, 2));
  auto b = f.Join(Spec("h2", 2, 1, 2));
  f.out.clear();
  REQUIRE(f.job.Report(b, 0, Outcome::kFailed, {}, &f.out).ok());
  f.out.clear();
  f.Join(Spec("h1", 1, 1, 2));
  CHECK(Of<Assignment>(f.out).empty());  // waits for h2 although MIN is met
  f.Join(Spec("h2", 2, 1, 2));
  CHECK(Of<Assignment>(f.out).size() == 2);
  (void)a;
}

TEST_CASE("status: the job's node counts, and a gathering round's deadline", "[unit]") {
  Fixture f;
  CHECK(f.job.Status().max_nodes == 0);  // no shape before the first join
  auto a = f.Join(Spec("10.0.0.1", 1));
  f.clock.Advance(std::chrono::seconds(3));
  JobStatus s = f.job.Status();
  CHECK(s.state == "gathering");
  CHECK(s.min_nodes == 2);
  CHECK(s.max_nodes == 2);
  CHECK(s.nodes.size() == 1);
  CHECK(s.join_deadline_in_s == Approx(7.0));  // the first joiner's 10 s join timeout
  f.Join(Spec("10.0.0.2", 2));
  CHECK(f.job.Status().state == "running");
  CHECK(f.job.Status().join_deadline_in_s == 0);
  // A member is lost: the round re-forms and waits for a replacement.
  f.job.NodeLost(a, &f.out);
  f.clock.Advance(std::chrono::seconds(1));
  s = f.job.Status();
  CHECK(s.state == "gathering");
  CHECK(s.round == 1);
  CHECK(s.nodes.empty());  // the survivor has not re-joined yet: no deadline
  CHECK(s.join_deadline_in_s == 0);
}

}  // namespace
}  // namespace ddprun::rendezvous
