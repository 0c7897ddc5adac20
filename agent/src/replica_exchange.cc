#include "replica_exchange.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "ddprun/rendezvous/common/errors.h"
#include "ddprun/rendezvous/common/status_macros.h"
#include "ddprun/rendezvous/store/c10d_store_client.h"

namespace ddprun::agent {
namespace {

// What one node published: its replica endpoint and the replicas it holds.
struct Offer {
  std::string endpoint;
  std::vector<std::pair<replica::Seat, std::int64_t>> held;  // seat, step
};

std::string Encode(const std::string& endpoint, const ReplicaStore& store) {
  std::string v = endpoint;
  for (const auto& r : store.All()) {
    absl::StrAppend(&v, ";", r->seat().base_rank, ",", r->seat().local_ranks, ",",
                    r->seat().world_size, ",", r->step());
  }
  return v;
}

Offer Decode(const std::string& value) {
  Offer o;
  std::vector<std::string> parts = absl::StrSplit(value, ';');
  o.endpoint = parts.empty() ? "" : parts[0];
  for (std::size_t i = 1; i < parts.size(); ++i) {
    std::vector<std::string> f = absl::StrSplit(parts[i], ',');
    replica::Seat s;
    std::int64_t step = 0;
    if (f.size() == 4 && absl::SimpleAtoi(f[0], &s.base_rank) &&
        absl::SimpleAtoi(f[1], &s.local_ranks) && absl::SimpleAtoi(f[2], &s.world_size) &&
        absl::SimpleAtoi(f[3], &step)) {
      o.held.emplace_back(s, step);
    }
  }
  return o;
}

std::string RanksText(const replica::Seat& s) {
  return s.local_ranks == 1
             ? absl::StrCat("rank ", s.base_rank)
             : absl::StrCat("ranks ", s.base_rank, "-", s.base_rank + s.local_ranks - 1);
}

// Restores `steps` (ascending, at most one per slot) of this node's seat
// from the replicas `holder` offered (`local`: this node's own, when it is
// the holder) into `memory`, which it clears first: whatever the memory held
// is older than them. Step i goes into slot i, so the generations follow
// the steps (CheckpointMemory::BeginSeed). Newest first: load() most often
// agrees on the newest, and a newer transfer to the holder evicts the older
// one first. Each replica stands alone: one that cannot be fetched or fails
// its checksum leaves its slot empty (never partly written, never an older
// step) and is one line naming the holder, the ranks, the step and the
// cause; every one fetched is offered to load()'s agreement.
void RestoreSeat(ReplicaService& service, CheckpointMemory& memory, const rendezvous::Assignment& a,
                 const std::string& job_id, const std::string& holder,
                 const std::vector<std::shared_ptr<const HeldReplica>>& local,
                 const std::vector<std::int64_t>& steps, std::int64_t own_newest,
                 const std::function<void(const std::string&)>& log) {
  const replica::Seat mine{a.base_rank, a.local_world_size, a.world_size};
  const bool here = holder == service.endpoint();
  for (int j = 0; j < mine.local_ranks; ++j) memory.Clear(j);
  // One replica into slot `slot`, each rank committed once all are checked.
  auto restore_one = [&](std::int64_t step, int slot) -> absl::Status {
    std::vector<CheckpointMemory::SeedSlot> slot_of;
    std::vector<std::uint32_t> crcs, kinds;
    if (here) {
      auto it = std::find_if(local.begin(), local.end(),
                             [&](const auto& r) { return r->step() == step; });
      if (it == local.end()) return absl::NotFoundError("this node holds it no more");
      const HeldReplica& r = **it;
      for (int j = 0; j < mine.local_ranks; ++j) {
        auto bytes = r.Read(j);  // checked against its CRC-32
        if (!bytes.ok()) return bytes.status();
        auto dst = memory.BeginSeed(j, bytes->size(), slot);
        if (!dst.ok()) return dst.status();
        if (!bytes->empty()) std::memcpy(dst->data(), bytes->data(), bytes->size());
        slot_of.push_back(*std::move(dst));
      }
      crcs = r.crcs();
      kinds = r.kinds();
    } else {
      // Received straight into each rank's memory, committed once checked.
      auto fetched = ReplicaService::Fetch(
          holder, job_id, a.store_token, a.round, mine, memory.limit(),
          ReplicaService::Clock::now() + ReplicaService::kIoTimeout, service.encrypt(),
          [&](int j, std::uint64_t size) -> absl::StatusOr<char*> {
            auto dst = memory.BeginSeed(j, size, slot);
            if (!dst.ok()) return dst.status();
            slot_of.push_back(*std::move(dst));
            return slot_of.back().data();
          },
          step);
      if (!fetched.ok()) return fetched.status();
      crcs = fetched->crcs;
      kinds = fetched->kinds;
    }
    for (int j = 0; j < mine.local_ranks; ++j) {
      const auto k = static_cast<std::size_t>(j);
      DDPRUN_RETURN_IF_ERROR(
          slot_of[k].Commit(step, a.base_rank + j, a.world_size, crcs[k], kinds[k]));
    }
    return absl::OkStatus();
  };
  const std::string fence = rendezvous::Fence(job_id, a.round);
  std::vector<std::int64_t> restored;                        // ascending
  std::vector<std::pair<std::int64_t, std::string>> failed;  // step, cause
  for (std::size_t i = steps.size(); i-- > 0;) {
    absl::Status st = restore_one(steps[i], static_cast<int>(i));
    if (st.ok()) {
      restored.insert(restored.begin(), steps[i]);
      continue;
    }
    // The cause without the server's fence: the agent's line carries it.
    std::string cause(st.message());
    if (const auto at = cause.find(fence); at != std::string::npos) cause.erase(at, fence.size());
    failed.emplace_back(steps[i], std::move(cause));
  }
  if (restored.empty()) {  // one line for the seat
    for (int j = 0; j < mine.local_ranks; ++j) memory.Clear(j);
    std::vector<std::string> causes;
    for (const auto& [step, cause] : failed)
      causes.push_back(absl::StrCat("step ", step, ": ", cause));
    log(absl::StrCat("--ckpt_replicas: cannot restore ", RanksText(mine),
                     " from the replicas held by ", holder, " (", absl::StrJoin(causes, "; "),
                     "); these workers start without them"));
    return;
  }
  for (const auto& [step, cause] : failed) {
    log(absl::StrCat("--ckpt_replicas: cannot restore step ", step, " of ", RanksText(mine),
                     " from the replica held by ", holder, ": ", cause,
                     "; that step is not offered to load()"));
  }
  std::string before;
  if (restored.size() > 1) {
    std::vector<std::int64_t> older(restored.begin(), restored.end() - 1);
    before = absl::StrCat("with step ", absl::StrJoin(older, " and step "), " before it; ");
  }
  log(absl::StrCat("--ckpt_replicas: restored step ", restored.back(), " of ", RanksText(mine),
                   " from the replica held by ", holder, " (", before, "nothing read from storage",
                   own_newest >= 0 ? absl::StrCat("; this node's own memory held step ", own_newest,
                                                  " of them, older")
                                   : "",
                   ")"));
}

}  // namespace

void ExchangeReplicas(ReplicaService& service, CheckpointMemory& memory,
                      const rendezvous::Assignment& a, const std::string& job_id,
                      const std::function<void(const std::string&)>& log) {
  service.SetRound(a.round, a.store_token, "");
  const replica::Seat mine{a.base_rank, a.local_world_size, a.world_size};
  // This seat's newest step in the node's own memory (-1: none). A replica of
  // the seat newer than it wins: a node promoted back into a seat it held
  // rounds ago (a spare since) holds that seat's old steps, which no other
  // rank of the job still has.
  const std::vector<std::int64_t> own =
      memory.CommonSteps(a.local_world_size, a.base_rank, a.world_size);
  const std::int64_t own_newest = own.empty() ? -1 : *std::max_element(own.begin(), own.end());
  std::string successor;
  std::vector<Offer> offers;
  if (a.group_world_size > 1) {
    auto store = rendezvous::C10dStoreClient::Connect(
        a.master_addr, a.master_port, kReplicaExchangeTimeout,
        "the replicas of this round are off (--ckpt_replicas)");
    absl::Status st = store.status();
    const std::string prefix = absl::StrCat(kReplicaKeyPrefix, job_id, "/", a.round, "/");
    std::vector<std::string> keys;
    for (int g = 0; g < a.group_world_size; ++g) keys.push_back(absl::StrCat(prefix, g));
    absl::StatusOr<std::vector<std::string>> values = std::vector<std::string>();
    if (st.ok())
      st = (*store)->Set(keys[a.group_rank], Encode(service.endpoint(), service.store()));
    if (st.ok()) {
      values = (*store)->MultiGet(keys, kReplicaExchangeTimeout);
      st = values.status();
    }
    if (!st.ok()) {
      log(
          absl::StrCat("--ckpt_replicas: cannot exchange the replica addresses through the round's "
                       "store (",
                       st.message(),
                       "); no replica is sent or restored this round (every node needs "
                       "--ckpt_replicas 1)"));
    } else {
      for (const std::string& v : *values) offers.push_back(Decode(v));
      successor =
          offers[static_cast<std::size_t>((a.group_rank + 1) % a.group_world_size)].endpoint;
    }
  }
  {
    // The newest replica of this seat newer than the node's own memory: the
    // one this node holds, else another's. Its holder keeps the seat's newest
    // two; both are restored, since the survivors may hold the older one and
    // not the newest (docs/checkpoint.md, "Replica lag"), and load() agrees
    // on the newest step every rank holds.
    const std::vector<std::shared_ptr<const HeldReplica>> local = service.store().FindAll(mine);
    std::int64_t best = own_newest;
    std::string holder;
    std::vector<std::int64_t> steps;  // the holder's steps of this seat, ascending
    if (!local.empty() && local.back()->step() > best) {
      best = local.back()->step();
      holder = service.endpoint();
      for (const auto& r : local) steps.push_back(r->step());
    }
    for (std::size_t g = 0; g < offers.size(); ++g) {
      if (static_cast<int>(g) == a.group_rank) continue;
      std::vector<std::int64_t> theirs;
      for (const auto& [seat, step] : offers[g].held) {
        if (seat == mine) theirs.push_back(step);
      }
      if (theirs.empty()) continue;
      std::sort(theirs.begin(), theirs.end());
      if (theirs.back() > best) {
        best = theirs.back();
        holder = offers[g].endpoint;
        steps = std::move(theirs);
      }
    }
    // At most one step per slot, the newest ones.
    const std::size_t slots = static_cast<std::size_t>(memory.slots());
    if (steps.size() > slots) steps.erase(steps.begin(), steps.end() - slots);
    if (!holder.empty()) {
      RestoreSeat(service, memory, a, job_id, holder, local, steps, own_newest, log);
    }
  }
  service.SetRound(a.round, a.store_token, successor);
}

}  // namespace ddprun::agent
