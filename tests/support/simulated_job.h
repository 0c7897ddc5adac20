// A simulated multi-node job: N agents of one job, each a real Join stream
// over real gRPC to a rendezvous server, spread over a few channels as N
// hosts would be. Shared by bench/rendezvous_bench.cc (time, memory) and the
// integration tier (ranks, restart), and meant for any later measurement of
// the control plane at scale (metrics, HA).
//
// Agents act as ddprun's agent does: FormRound() opens every stream, then
// reads each agent's Assignment; FailAndReform() has one agent report a
// failed worker, and every agent re-joins as soon as it reads its
// RestartRound, as the agent's state machine does. Not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "ddprun/rendezvous/client.h"
#include "ddprun/rendezvous/common/types.h"

namespace ddprun::testing {

struct SimulatedJobOptions {
  std::string job_id = "sim";
  int nodes = 1;
  int nproc = 8;
  int channels = 64;  // connections the agents share (at most the agents played)
  // The agents this instance plays: [first_agent, first_agent + agents) of
  // the job's `nodes` (agents < 0: through the last). A load generator spread
  // over processes, as nodes are over hosts, gives each process a slice.
  int first_agent = 0;
  int agents = -1;
  // The job's policy: 3 restarts and no hang detection unless a test says
  // otherwise; its join_timeout_s is `timeout` below.
  rendezvous::JobPolicy policy = {.max_restarts = 3, .hang_timeout_s = 0};
  rendezvous::Duration timeout = std::chrono::seconds(120);
};

class SimulatedJob {
 public:
  SimulatedJob(std::string host, int port, SimulatedJobOptions options)
      : host_(std::move(host)), port_(port), o_(std::move(options)) {}

  // How many agents this instance plays.
  int count() const { return o_.agents < 0 ? o_.nodes - o_.first_agent : o_.agents; }

  // Opens the channels and waits until each is connected.
  absl::Status Connect() {
    const int n = std::max(1, std::min(count(), o_.channels));
    for (int c = 0; c < n; ++c) {
      clients_.push_back(rendezvous::RendezvousClient::Create(host_, port_));
      if (auto st = clients_.back()->WaitForConnected(o_.timeout); !st.ok()) return st;
    }
    return absl::OkStatus();
  }

  // Every agent joins (all streams open before any is read); returns each
  // agent's Assignment, in agent order (index 0 is agent first_agent).
  absl::StatusOr<std::vector<rendezvous::Assignment>> FormRound() {
    streams_.resize(count());
    for (int i = 0; i < count(); ++i) streams_[i] = Client(i).Join(Spec(o_.first_agent + i));
    return ReadAssignments();
  }

  // Agent `failing` (an index into this instance's agents) reports a failed
  // worker in the current round; each agent re-joins when it reads its
  // RestartRound. Returns the next round's Assignments, in agent order.
  absl::StatusOr<std::vector<rendezvous::Assignment>> FailAndReform(int failing) {
    if (auto st = ReportFailure(failing); !st.ok()) return st;
    return RejoinOnRestart();
  }

  // Agent `failing` (an index into this instance's agents) reports a failed
  // worker in the current round.
  absl::Status ReportFailure(int failing) {
    rendezvous::WorkerFailure f;
    f.host = Spec(o_.first_agent + failing).host;
    f.global_rank = last_[failing].base_rank;
    f.local_rank = 0;
    f.exit_code = 1;
    return Client(failing).Report(o_.job_id, last_[failing].node_id, last_[failing].round,
                                  rendezvous::Outcome::kFailed, {f}, o_.timeout);
  }

  // Each agent re-joins as soon as it reads its RestartRound (someone's
  // ReportFailure, here or in another instance playing the same job), as the
  // agent's state machine does. Returns the next round's Assignments.
  absl::StatusOr<std::vector<rendezvous::Assignment>> RejoinOnRestart() {
    for (int i = 0; i < count(); ++i) {
      rendezvous::RoundEvent e = streams_[i]->Next(o_.timeout);
      if (!std::holds_alternative<rendezvous::RestartRound>(e)) {
        return absl::InternalError("agent " + std::to_string(o_.first_agent + i) +
                                   " got no RestartRound");
      }
      // The old stream ends by itself; dropped later, so its clean-up wait
      // is not on the measured path.
      retired_.push_back(std::move(streams_[i]));
      streams_[i] = Client(i).Join(Spec(o_.first_agent + i));
    }
    return ReadAssignments();
  }

  // Every agent has an assignment of one round: group ranks 0..N-1, each once,
  // base_rank = group_rank * nproc, the same world size.
  static absl::Status CheckRanks(const std::vector<rendezvous::Assignment>& a, int nodes,
                                 int nproc) {
    if (static_cast<int>(a.size()) != nodes) return absl::InternalError("wrong agent count");
    std::set<int> seen;
    for (const auto& x : a) {
      if (auto st = CheckAssignment(x, nodes, nproc, a[0].round); !st.ok()) return st;
      if (!seen.insert(x.group_rank).second)
        return absl::InternalError("group rank " + std::to_string(x.group_rank) + " given twice");
    }
    return absl::OkStatus();
  }

  // One agent's Assignment in a job of `nodes` agents: a group rank in range,
  // base_rank = group_rank * nproc, the job's world sizes, round `round`.
  // (That no group rank is given twice needs every agent's: CheckRanks.)
  static absl::Status CheckAssignment(const rendezvous::Assignment& x, int nodes, int nproc,
                                      std::int64_t round) {
    if (x.group_rank < 0 || x.group_rank >= nodes)
      return absl::InternalError("group rank " + std::to_string(x.group_rank) + " out of range");
    if (x.base_rank != x.group_rank * nproc || x.world_size != nodes * nproc ||
        x.group_world_size != nodes || x.round != round)
      return absl::InternalError("inconsistent assignment for group rank " +
                                 std::to_string(x.group_rank));
    return absl::OkStatus();
  }

  // Ends every stream (the server sees the agents leave).
  void Close() {
    streams_.clear();
    retired_.clear();
  }

  // Agent i's join: host 10.a.b.c (distinct per agent), pid 1000 + i.
  rendezvous::JoinSpec Spec(int i) const {
    rendezvous::JoinSpec s;
    s.job_id = o_.job_id;
    s.host = "10." + std::to_string(i / 65536) + "." + std::to_string((i / 256) % 256) + "." +
             std::to_string(i % 256);
    s.pid = 1000 + i;
    s.nproc = o_.nproc;
    s.min_nodes = o_.nodes;
    s.max_nodes = o_.nodes;
    s.policy = o_.policy;
    s.policy.join_timeout_s = std::chrono::duration<double>(o_.timeout).count();
    s.command = "train";
    return s;
  }

  // The channel agent i uses (to send its metrics reports, say).
  rendezvous::RendezvousClient& ClientOf(int i) { return Client(i); }

  const SimulatedJobOptions& options() const { return o_; }

 private:
  rendezvous::RendezvousClient& Client(int i) { return *clients_[i % clients_.size()]; }

  absl::StatusOr<std::vector<rendezvous::Assignment>> ReadAssignments() {
    std::vector<rendezvous::Assignment> out(count());
    for (int i = 0; i < count(); ++i) {
      rendezvous::RoundEvent e = streams_[i]->Next(o_.timeout);
      if (auto* st = std::get_if<absl::Status>(&e)) return *st;
      if (!std::holds_alternative<rendezvous::Assignment>(e))
        return absl::InternalError("agent " + std::to_string(i) + " got no Assignment");
      out[i] = std::get<rendezvous::Assignment>(std::move(e));
    }
    last_ = out;
    return out;
  }

  std::string host_;
  int port_;
  SimulatedJobOptions o_;
  std::vector<std::unique_ptr<rendezvous::RendezvousClient>> clients_;
  std::vector<std::unique_ptr<rendezvous::JoinStream>> streams_;
  std::vector<std::unique_ptr<rendezvous::JoinStream>> retired_;
  std::vector<rendezvous::Assignment> last_;
};

}  // namespace ddprun::testing
