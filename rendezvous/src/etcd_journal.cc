#include "etcd_journal.h"

#include <cstdio>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "ddprun/rendezvous/errors.h"
#include "job_snapshot_proto.h"

namespace ddprun::rendezvous {
namespace {

constexpr auto kRetryPause = std::chrono::milliseconds(100);
constexpr auto kWaitNotice = std::chrono::seconds(5);  // one line per 5 s of waiting

std::string Hex(const std::string& bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

std::string Round20(std::int64_t round) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%020lld", static_cast<long long>(round));
  return buf;
}

absl::Status Foreign(const std::string& prefix, const std::string& key, const std::string& why) {
  return absl::FailedPreconditionError(
      absl::StrCat("etcd key '", key, "' under --etcd_prefix=", prefix, " is not ddprun's (", why,
                   "); another program or cluster writes there: give this ddprund cluster its own "
                   "--etcd_prefix, or remove those keys (etcdctl del --prefix ",
                   prefix, "/) if they are stale"));
}

}  // namespace

absl::StatusOr<std::string> NormalizeEtcdPrefix(const std::string& prefix) {
  if (prefix.empty() || prefix[0] != '/') {
    return absl::InvalidArgumentError("--etcd_prefix '" + prefix +
                                      "' must start with '/'; write for example /ddprun");
  }
  for (unsigned char c : prefix) {
    if (c < 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError(
          "--etcd_prefix holds a control character; write for example /ddprun");
    }
  }
  std::string p = prefix;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  if (p == "/") {
    return absl::InvalidArgumentError(
        "--etcd_prefix=/ would share etcd's whole key space; write for example /ddprun");
  }
  return p;
}

absl::Status ClaimEtcdPrefix(EtcdClient& client, const std::string& prefix) {
  const std::string format_key = prefix + "/format";
  DDPRUN_ASSIGN_OR_RETURN(EtcdRange marker, client.Range(format_key));
  if (!marker.kvs.empty()) {
    if (marker.kvs[0].value != kEtcdFormat) {
      return Foreign(prefix, format_key,
                     absl::StrCat("format '", marker.kvs[0].value.substr(0, 64),
                                  "', this ddprund writes '", kEtcdFormat, "'"));
    }
    return absl::OkStatus();
  }
  DDPRUN_ASSIGN_OR_RETURN(EtcdRange any,
                          client.Range(prefix + "/", EtcdClient::PrefixEnd(prefix + "/"), 1));
  if (!any.kvs.empty()) return Foreign(prefix, any.kvs[0].key, "no " + format_key + " marker");
  // Two replicas starting together both write the same marker: harmless.
  DDPRUN_ASSIGN_OR_RETURN(EtcdTxnResult put,
                          client.Txn({EtcdCompare{format_key, EtcdCompare::Target::kVersion,
                                                  EtcdCompare::Result::kEqual, 0, ""}},
                                     {EtcdOp::Put(format_key, kEtcdFormat)}));
  (void)put;
  return absl::OkStatus();
}

EtcdJournal::EtcdJournal(EtcdJournalOptions options) : options_(std::move(options)) {}

std::string EtcdJournal::JobPrefix(const std::string& job_id) const {
  return absl::StrCat(options_.prefix, "/jobs/", Hex(job_id), "/");
}

std::string EtcdJournal::StoreKey(const std::string& job_id, std::int64_t round,
                                  const std::string& key) const {
  return absl::StrCat(JobPrefix(job_id), "store/", Round20(round), "/", key);
}

absl::Status EtcdJournal::Write(std::vector<EtcdOp> ops) {
  const std::string leader_key = options_.prefix + "/leader";
  const auto started = std::chrono::steady_clock::now();
  auto noticed = started;
  while (true) {
    if (deposed_.load()) {
      return absl::UnavailableError("this ddprund replica no longer leads; it writes nothing");
    }
    if (!options_.may_lead()) {
      deposed_.store(true);
      absl::Status st = absl::UnavailableError(
          "this ddprund replica's etcd lease was not renewed within its TTL, so another replica "
          "may lead now; it steps down without deciding anything more");
      options_.on_deposed(st);
      return st;
    }
    ++writes_;
    absl::StatusOr<EtcdTxnResult> r = options_.client->Txn(
        {EtcdCompare{leader_key, EtcdCompare::Target::kCreateRevision, EtcdCompare::Result::kEqual,
                     leader_revision_.load(), ""}},
        ops);
    if (r.ok() && r->succeeded) return absl::OkStatus();
    if (r.ok()) {
      deposed_.store(true);
      absl::Status st = absl::FailedPreconditionError(
          absl::StrCat("another ddprund replica leads now (", leader_key,
                       " is no longer this replica's); this one steps down without deciding "
                       "anything more"));
      options_.on_deposed(st);
      return st;
    }
    if (KindOf(r.status()) != ErrorKind::kConnection) return r.status();
    const auto now = std::chrono::steady_clock::now();
    if (now - noticed >= kWaitNotice) {
      noticed = now;
      std::fprintf(stderr,
                   "ddprund: waiting for etcd to persist a change (%lld s so far; joins, restarts "
                   "and store writes wait meanwhile, running workers go on): %s\n",
                   static_cast<long long>(
                       std::chrono::duration_cast<std::chrono::seconds>(now - started).count()),
                   std::string(r.status().message()).c_str());
    }
    std::this_thread::sleep_for(kRetryPause);
  }
}

absl::StatusOr<std::vector<RecoveredJob>> EtcdJournal::Recover() {
  const std::string jobs = options_.prefix + "/jobs/";
  DDPRUN_ASSIGN_OR_RETURN(EtcdRange all, options_.client->Range(jobs, EtcdClient::PrefixEnd(jobs)));
  struct Parts {
    std::optional<pb::JobSnapshot> snapshot;
    std::map<std::int64_t, std::vector<std::pair<std::string, std::string>>> rounds;
  };
  std::map<std::string, Parts> by_job;  // by hex id
  for (EtcdKeyValue& kv : all.kvs) {
    const std::string rest = kv.key.substr(jobs.size());
    const std::size_t slash = rest.find('/');
    if (slash == std::string::npos) return Foreign(options_.prefix, kv.key, "no job id");
    const std::string hex = rest.substr(0, slash);
    const std::string what = rest.substr(slash + 1);
    if (what == "snapshot") {
      pb::JobSnapshot snap;
      if (!snap.ParseFromString(kv.value) || snap.format_version() != kFormatVersion ||
          Hex(snap.job_id()) != hex) {
        return Foreign(options_.prefix, kv.key, "not a ddprun job snapshot");
      }
      by_job[hex].snapshot = std::move(snap);
    } else if (what.rfind("store/", 0) == 0 && what.size() >= 6 + 21 && what[6 + 20] == '/') {
      const std::string digits = what.substr(6, 20);
      if (digits.find_first_not_of("0123456789") != std::string::npos) {
        return Foreign(options_.prefix, kv.key, "not a store key");
      }
      by_job[hex].rounds[std::stoll(digits)].emplace_back(what.substr(6 + 21), std::move(kv.value));
    } else {
      return Foreign(options_.prefix, kv.key, "unknown key");
    }
  }
  std::vector<RecoveredJob> out;
  for (auto& [hex, parts] : by_job) {
    if (!parts.snapshot) continue;  // keys written after a Forget began: nothing to restore
    RecoveredJob job;
    job.snapshot = SnapshotFromProto(*parts.snapshot);
    job.store_round = job.snapshot.round;
    if (!parts.rounds.empty() && parts.rounds.rbegin()->first >= job.store_round) {
      job.store_round = parts.rounds.rbegin()->first;
      job.store = std::move(parts.rounds.rbegin()->second);
    }
    out.push_back(std::move(job));
  }
  return out;
}

absl::Status EtcdJournal::WriteSnapshot(const JobSnapshot& snap, std::int64_t store_round,
                                        const KvEngine& store) {
  (void)store;  // its keys are in etcd already (AppendKey)
  pb::JobSnapshot p;
  SnapshotToProto(snap, &p);
  const std::string base = JobPrefix(snap.job_id);
  return Write({EtcdOp::Put(base + "snapshot", p.SerializeAsString()),
                // Keys of the rounds before store_round are never read again.
                EtcdOp::Delete(base + "store/", StoreKey(snap.job_id, store_round, ""))});
}

absl::Status EtcdJournal::AppendKey(const std::string& job_id, std::int64_t round,
                                    const std::string& key, const KvEngine& store) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string k = StoreKey(job_id, round, key);
  if (auto v = store.Get(key)) return Write({EtcdOp::Put(k, *v)});
  return Write({EtcdOp::Delete(k)});
}

void EtcdJournal::Forget(const std::string& job_id) {
  const std::string base = JobPrefix(job_id);
  (void)Write({EtcdOp::Delete(base, EtcdClient::PrefixEnd(base))});
}

}  // namespace ddprun::rendezvous
