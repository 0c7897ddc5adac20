// The check workers' protocol over the job's store (preflight_exchange.h).
#include "ddprun/launcher/check/preflight_exchange.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <optional>
#include <set>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "ddprun/rendezvous/common/host_port.h"
#include "ddprun/rendezvous/common/status_macros.h"
#include "nlohmann/json.hpp"

namespace ddprun::launcher::preflight {
namespace {

using SteadyClock = std::chrono::steady_clock;

constexpr size_t kParallelConnects = 32;

std::string Key(const std::string& what) { return absl::StrCat(kKeyPrefix, what); }

// What is left of a deadline, at least 1 ms (a store wait of 0 is not "now").
rendezvous::Duration Left(SteadyClock::time_point deadline) {
  const auto left = deadline - SteadyClock::now();
  return std::max<rendezvous::Duration>(left, std::chrono::milliseconds(1));
}

struct Peer {
  std::string host;
  int port = 0;
};

std::optional<Peer> ParsePeer(const std::string& value) {
  std::vector<std::string> parts = absl::StrSplit(value, ' ');
  Peer p;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &p.port)) return std::nullopt;
  p.host = parts[0];
  return p;
}

// Node 0's side of step 2 for one node. Returns false when the node stopped
// answering (its remaining samples are skipped).
bool ServeClock(rendezvous::Store& store, SystemProbe& probe, int node,
                rendezvous::Duration timeout) {
  for (int i = 0; i < kClockSamples; ++i) {
    if (!store.Get(Key(absl::StrCat("ping/", node, "/", i)), timeout).ok()) return false;
    if (!store.Set(Key(absl::StrCat("pong/", node, "/", i)), std::to_string(probe.WallMicros()))
             .ok()) {
      return false;
    }
  }
  return true;
}

// Node g's side of step 2.
void MeasureClock(rendezvous::Store& store, SystemProbe& probe, int node,
                  rendezvous::Duration timeout, NodeFacts& facts) {
  std::int64_t best_rtt = std::numeric_limits<std::int64_t>::max();
  for (int i = 0; i < kClockSamples; ++i) {
    const std::int64_t t0 = probe.WallMicros();
    if (!store.Set(Key(absl::StrCat("ping/", node, "/", i)), "").ok()) return;
    absl::StatusOr<std::string> pong = store.Get(Key(absl::StrCat("pong/", node, "/", i)), timeout);
    const std::int64_t t2 = probe.WallMicros();
    std::int64_t t1 = 0;
    if (!pong.ok() || !absl::SimpleAtoi(*pong, &t1)) return;
    const std::int64_t rtt = t2 - t0;
    if (rtt < best_rtt) {
      best_rtt = rtt;
      facts.clock_measured = true;
      // Integer microseconds first: wall clocks are ~1.7e15 us, past a
      // double's exact range for sums.
      const std::int64_t offset_us = (t0 + (t2 - t0) / 2) - t1;  // mine minus node 0's
      facts.clock_offset_ms = static_cast<double>(offset_us) / 1000.0;
      facts.clock_uncertainty_ms = static_cast<double>(std::max<std::int64_t>(rtt, 0)) / 2000.0;
    }
  }
}

void ResolveAndReach(SystemProbe& probe, const ExchangeInput& in, const std::vector<Peer>& peers,
                     const std::vector<bool>& present, NodeFacts& facts) {
  // Names: this host's own, the advertised hosts of the others and the
  // targets', each once.
  std::vector<std::string> names{facts.hostname};
  for (const Target& t : in.targets) names.push_back(t.host);
  for (int r = 0; r < in.group_world_size; ++r) {
    if (r != in.group_rank && present[r]) names.push_back(peers[r].host);
  }
  std::set<std::string> seen;
  for (const std::string& name : names) {
    if (name.empty() || !seen.insert(name).second) continue;
    const absl::Status s = probe.Resolve(name);
    facts.resolved.push_back({name, s.ok(), std::string(s.message())});
  }
  // Every connection at once (up to kParallelConnects), so that the phase
  // takes one connect deadline however many peers are unreachable.
  std::vector<Target> all = in.targets;
  for (int r = 0; r < in.group_world_size; ++r) {
    if (r != in.group_rank && present[r]) {
      all.push_back({absl::StrCat("node ", r), peers[r].host, peers[r].port});
    }
  }
  std::vector<Reach> results(all.size());
  for (size_t first = 0; first < all.size(); first += kParallelConnects) {
    const size_t last = std::min(all.size(), first + kParallelConnects);
    std::vector<std::thread> threads;
    for (size_t i = first; i < last; ++i) {
      threads.emplace_back([&, i] {
        const Target& t = all[i];
        const auto start = SteadyClock::now();
        const absl::Status s = probe.Connect(t.host, t.port, in.connect_timeout);
        const double ms =
            std::chrono::duration<double, std::milli>(SteadyClock::now() - start).count();
        results[i] = {t.what, rendezvous::FormatHostPort(t.host, t.port), s.ok(),
                      std::string(s.message()), ms};
      });
    }
    for (std::thread& t : threads) t.join();
  }
  facts.reach.insert(facts.reach.end(), results.begin(), results.end());
}

}  // namespace

absl::StatusOr<ExchangeOutcome> RunExchange(rendezvous::Store& store, SystemProbe& probe,
                                            const std::function<NodeFacts()>& collect_local,
                                            const ExchangeInput& in) {
  const int me = in.group_rank;
  const int n = in.group_world_size;
  NodeFacts clock;  // step 2's result

  // 1. Arrive.
  DDPRUN_ASSIGN_OR_RETURN(std::unique_ptr<Listener> listener, probe.Listen());
  DDPRUN_RETURN_IF_ERROR(
      store.Set(Key(absl::StrCat("listen/", me)), absl::StrCat(in.host, " ", listener->Port())));
  const auto arrival_deadline = SteadyClock::now() + in.timeout;
  std::vector<Peer> peers(n);
  std::vector<bool> present(n, false);
  for (int r = 0; r < n; ++r) {
    absl::StatusOr<std::string> v =
        store.Get(Key(absl::StrCat("listen/", r)), Left(arrival_deadline));
    if (!v.ok()) continue;
    if (std::optional<Peer> p = ParsePeer(*v)) {
      peers[r] = *p;
      present[r] = true;
    }
  }

  // 2. Clocks.
  const rendezvous::Duration clock_timeout = in.connect_timeout;
  if (me == 0) {
    for (int r = 1; r < n; ++r) {
      if (present[r]) ServeClock(store, probe, r, clock_timeout);
    }
  } else if (present[0]) {
    MeasureClock(store, probe, me, clock_timeout + clock_timeout * n, clock);
  }

  // This node's own facts: after the clocks (the Python probe would disturb
  // them) and within node 0's wait for facts.
  NodeFacts local = collect_local();
  local.group_rank = me;
  local.host = in.host;
  local.clock_measured = clock.clock_measured;
  local.clock_offset_ms = clock.clock_offset_ms;
  local.clock_uncertainty_ms = clock.clock_uncertainty_ms;

  // 3. Reach, 4. Facts.
  ResolveAndReach(probe, in, peers, present, local);
  DDPRUN_RETURN_IF_ERROR(store.Set(Key(absl::StrCat("facts/", me)), FactsToJson(local)));

  // 5. Verdict.
  using Json = nlohmann::json;
  ExchangeOutcome out;
  if (me != 0) {
    // Node 0 may wait up to a timeout for arrivals and another for facts,
    // and spends a few connect deadlines on clocks and connections.
    DDPRUN_ASSIGN_OR_RETURN(const std::string verdict,
                            store.Get(Key("verdict"), in.timeout * 2 + in.connect_timeout * 4));
    const Json j = Json::parse(verdict, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.contains("exit_code") || !j.contains("summary")) {
      return absl::InvalidArgumentError(
          "node 0's check verdict is not JSON; run the same ddprun "
          "on every node");
    }
    out.exit_code = j["exit_code"].get<int>();
    out.text = absl::StrCat("ddprun check: node ", me, " (", in.host,
                            "): ", j["summary"].get<std::string>(), "; node 0 prints the table\n");
    out.json = Json{{"node", me},
                    {"host", in.host},
                    {"summary", j["summary"]},
                    {"exit_code", out.exit_code},
                    {"report_on_node", 0}}
                   .dump(2) +
               "\n";
    (void)store.Set(Key(absl::StrCat("ack/", me)), "");
    return out;
  }
  const auto facts_deadline = SteadyClock::now() + in.timeout;
  std::vector<NodeFacts> nodes;
  for (int r = 0; r < n; ++r) {
    if (r == 0) {
      nodes.push_back(local);
      continue;
    }
    NodeFacts missing;
    missing.group_rank = r;
    missing.host = peers[r].host;
    if (!present[r]) {
      missing.error = absl::StrCat("did not arrive within ", in.timeout.count() / 1000.0, " s");
      nodes.push_back(missing);
      continue;
    }
    absl::StatusOr<std::string> v = store.Get(Key(absl::StrCat("facts/", r)), Left(facts_deadline));
    absl::StatusOr<NodeFacts> f =
        v.ok() ? FactsFromJson(*v) : absl::StatusOr<NodeFacts>(v.status());
    if (!f.ok()) {
      missing.error = std::string(f.status().message());
      nodes.push_back(missing);
      continue;
    }
    nodes.push_back(*f);
  }
  const Report report = RunChecks(nodes, in.job, DefaultChecks());
  out.exit_code = ExitCode(report);
  out.text = FormatText(report);
  out.json = FormatJson(report);
  const Json verdict = {{"exit_code", out.exit_code}, {"summary", Summary(report)}};
  DDPRUN_RETURN_IF_ERROR(store.Set(Key("verdict"), verdict.dump()));
  std::vector<std::string> acks;
  for (int r = 1; r < n; ++r) {
    if (nodes[r].reported) acks.push_back(Key(absl::StrCat("ack/", r)));
  }
  if (!acks.empty()) (void)store.Wait(acks, in.connect_timeout * 2);
  return out;
}

}  // namespace ddprun::launcher::preflight
