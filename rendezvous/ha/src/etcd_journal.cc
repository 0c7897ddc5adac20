#include "ddprun/rendezvous/ha/etcd_journal.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "ddprun/rendezvous/common/errors.h"
#include "ddprun/rendezvous/ha/etcd_snapshot_chunks.h"
#include "ddprun/rendezvous/ha/job_snapshot_proto.h"

namespace ddprun::rendezvous {
namespace {

constexpr auto kRetryPause = std::chrono::milliseconds(100);
constexpr auto kWaitNotice = std::chrono::seconds(5);  // one line per 5 s of waiting
// What a request holds besides its keys and values (the Txn's framing, the
// compare's revision, etcd's raft header), generously.
constexpr std::size_t kRequestOverhead = 512;
// A snapshot head's value is under this.
constexpr std::size_t kHeadValueBytes = 160;

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

std::string Chunk8(std::int64_t i) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%08lld", static_cast<long long>(i));
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
  const std::string under = prefix + "/";
  // ddprun never deletes the marker: once read, it stays (a restarted replica
  // needs no more than this read).
  DDPRUN_ASSIGN_OR_RETURN(EtcdRange marker, client.Range(format_key));
  // Replicas started together race here. One transaction decides: it creates
  // the marker only while no key at all lives under the prefix (none with a
  // create_revision), else reads it. So exactly one racer creates it, and every
  // other one reads ddprun's marker, whatever the interleaving.
  EtcdCompare nothing_under;  // create_revision == 0 for every key under the prefix
  nothing_under.key = under;
  nothing_under.range_end = EtcdClient::PrefixEnd(under);
  nothing_under.target = EtcdCompare::Target::kCreateRevision;
  nothing_under.result = EtcdCompare::Result::kEqual;
  nothing_under.number = 0;
  // A prefix emptied between the transaction and the read that names a key
  // (etcdctl del) is claimed again; it cannot keep changing for long.
  constexpr int kAttempts = 3;
  for (int attempt = 0; marker.kvs.empty() && attempt < kAttempts; ++attempt) {
    DDPRUN_ASSIGN_OR_RETURN(EtcdTxnResult claim,
                            client.Txn({nothing_under}, {EtcdOp::Put(format_key, kEtcdFormat)},
                                       {EtcdOp::Range(format_key)}));
    if (claim.succeeded) return absl::OkStatus();
    if (claim.ranges.size() == 1 && !claim.ranges[0].kvs.empty()) {
      marker = std::move(claim.ranges[0]);
      break;
    }
    // Keys under the prefix but no marker: another program's data.
    DDPRUN_ASSIGN_OR_RETURN(EtcdRange any, client.Range(under, EtcdClient::PrefixEnd(under), 1));
    if (!any.kvs.empty()) return Foreign(prefix, any.kvs[0].key, "no " + format_key + " marker");
  }
  if (marker.kvs.empty()) {
    return Foreign(prefix, format_key,
                   "keys under it appeared and vanished " + std::to_string(kAttempts) +
                       " times while this replica claimed it");
  }
  if (marker.kvs[0].value != kEtcdFormat) {
    return Foreign(prefix, format_key,
                   absl::StrCat("format '", marker.kvs[0].value.substr(0, 64),
                                "', this ddprund writes '", kEtcdFormat, "'"));
  }
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
    if (KindOf(r.status()) == ErrorKind::kBadInput) {
      std::size_t bytes = kRequestOverhead;
      for (const EtcdOp& op : ops) bytes += op.key.size() + op.range_end.size() + op.value.size();
      return absl::InvalidArgumentError(absl::StrCat(
          "etcd refused a request of about ", bytes, " bytes (", r.status().message(),
          "); ddprund keeps each request within --etcd_max_request_bytes=",
          options_.max_request_bytes,
          ", which must not exceed etcd's --max-request-bytes: lower it, or raise etcd's"));
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
    std::optional<std::string> legacy;  // P/jobs/<hex>/snapshot
    std::optional<SnapshotHead> head;
    // version -> chunk index -> bytes
    std::map<std::int64_t, std::map<std::int64_t, std::string>> chunks;
    std::map<std::int64_t, std::vector<std::pair<std::string, std::string>>> rounds;
  };
  auto digits = [](const std::string& s) {
    return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
  };
  std::map<std::string, Parts> by_job;  // by hex id
  for (EtcdKeyValue& kv : all.kvs) {
    const std::string rest = kv.key.substr(jobs.size());
    const std::size_t slash = rest.find('/');
    if (slash == std::string::npos) return Foreign(options_.prefix, kv.key, "no job id");
    const std::string hex = rest.substr(0, slash);
    const std::string what = rest.substr(slash + 1);
    if (what == "snapshot") {
      by_job[hex].legacy = std::move(kv.value);
    } else if (what == "head") {
      absl::StatusOr<SnapshotHead> head = ParseSnapshotHead(kv.value);
      if (!head.ok()) return Foreign(options_.prefix, kv.key, "not a ddprun snapshot head");
      by_job[hex].head = *head;
    } else if (what.rfind("snapshot/", 0) == 0 && what.size() == 9 + 20 + 1 + 8 &&
               what[9 + 20] == '/' && digits(what.substr(9, 20)) && digits(what.substr(30))) {
      by_job[hex].chunks[std::stoll(what.substr(9, 20))][std::stoll(what.substr(30))] =
          std::move(kv.value);
    } else if (what.rfind("store/", 0) == 0 && what.size() >= 6 + 21 && what[6 + 20] == '/') {
      if (!digits(what.substr(6, 20))) return Foreign(options_.prefix, kv.key, "not a store key");
      by_job[hex].rounds[std::stoll(what.substr(6, 20))].emplace_back(what.substr(6 + 21),
                                                                      std::move(kv.value));
    } else {
      return Foreign(options_.prefix, kv.key, "unknown key");
    }
  }
  std::vector<RecoveredJob> out;
  for (auto& [hex, parts] : by_job) {
    // Chunks of a version no head names are an unfinished write: ignored
    // here, deleted by the job's next snapshot write.
    std::string bytes;
    std::string from = jobs + hex + "/snapshot";
    if (parts.head) {
      from = jobs + hex + "/head";
      std::vector<std::string> chunks;
      auto version = parts.chunks.find(parts.head->version);
      if (version != parts.chunks.end()) {
        for (std::int64_t i = 0; i < parts.head->chunks; ++i) {
          auto c = version->second.find(i);
          if (c == version->second.end()) break;
          chunks.push_back(std::move(c->second));
        }
      }
      absl::StatusOr<std::string> raw = JoinAndDecompress(*parts.head, chunks);
      if (!raw.ok()) {
        return absl::DataLossError(
            absl::StrCat("etcd key '", from, "' names snapshot version ", parts.head->version,
                         " whose chunks are missing or damaged (", raw.status().message(),
                         "); this job cannot be recovered: remove its keys (etcdctl del --prefix ",
                         jobs, hex, "/) and start it again"));
      }
      bytes = *std::move(raw);
    } else if (parts.legacy) {
      bytes = *std::move(parts.legacy);
    } else {
      continue;  // keys written after a Forget began, or a first write unfinished
    }
    pb::JobSnapshot snap;
    if (!snap.ParseFromString(bytes) || snap.format_version() != kFormatVersion ||
        Hex(snap.job_id()) != hex) {
      return Foreign(options_.prefix, from, "not a ddprun job snapshot");
    }
    RecoveredJob job;
    job.snapshot = SnapshotFromProto(snap);
    job.store_round = job.snapshot.round;
    if (!parts.rounds.empty() && parts.rounds.rbegin()->first >= job.store_round) {
      job.store_round = parts.rounds.rbegin()->first;
      job.store = std::move(parts.rounds.rbegin()->second);
    }
    if (parts.head) {
      std::lock_guard<std::mutex> lock(versions_mu_);
      std::int64_t& v = versions_[job.snapshot.job_id];
      v = std::max(v, parts.head->version);
    }
    out.push_back(std::move(job));
  }
  return out;
}

std::size_t EtcdJournal::RoomForValues(std::size_t key_bytes) const {
  const std::size_t used = kRequestOverhead + key_bytes + options_.prefix.size() + 8;  // + leader
  return options_.max_request_bytes > used ? options_.max_request_bytes - used : 0;
}

absl::Status EtcdJournal::WriteSnapshot(const JobSnapshot& snap, std::int64_t store_round,
                                        const KvEngine& store) {
  (void)store;  // its keys are in etcd already (AppendKey)
  pb::JobSnapshot p;
  SnapshotToProto(snap, &p);
  const std::string base = JobPrefix(snap.job_id);
  const std::string dir = base + "snapshot/";
  std::int64_t version;
  {
    std::lock_guard<std::mutex> lock(versions_mu_);
    version = versions_[snap.job_id] + 1;
  }
  const std::string vdir = absl::StrCat(dir, Round20(version), "/");
  const std::string store_end = StoreKey(snap.job_id, store_round, "");
  // The last Txn's keys: two chunk keys, the head, two ranges, the legacy key, one range.
  const std::size_t keys = 2 * (vdir.size() + 8) + base.size() + 4 + 2 * dir.size() +
                           (vdir.size() + 8) + base.size() + 8 + base.size() + 6 + store_end.size();
  const std::size_t room = RoomForValues(keys);
  if (room < kHeadValueBytes + 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--etcd_max_request_bytes=", options_.max_request_bytes,
        " leaves no room for a job snapshot's chunk under --etcd_prefix=", options_.prefix,
        "; raise it (and etcd's --max-request-bytes) or shorten the prefix"));
  }
  SnapshotHead head;
  const std::vector<std::string> chunks =
      CompressAndSplit(p.SerializeAsString(), room - kHeadValueBytes, &head);
  head.version = version;
  auto chunk_key = [&](std::int64_t i) { return vdir + Chunk8(i); };
  const auto n = static_cast<std::int64_t>(chunks.size());
  for (std::int64_t i = 0; i + 1 < n; ++i) {
    DDPRUN_RETURN_IF_ERROR(Write({EtcdOp::Put(chunk_key(i), chunks[i])}));
  }
  DDPRUN_RETURN_IF_ERROR(
      Write({EtcdOp::Put(chunk_key(n - 1), chunks.back()),
             EtcdOp::Put(base + "head", EncodeSnapshotHead(head)),
             // Every other version: older ones, an unfinished one's extra chunks.
             EtcdOp::Delete(dir, vdir), EtcdOp::Delete(chunk_key(n), EtcdClient::PrefixEnd(dir)),
             EtcdOp::Delete(base + "snapshot"),  // the layout before chunks
             // Keys of the rounds before store_round are never read again.
             EtcdOp::Delete(base + "store/", store_end)}));
  std::lock_guard<std::mutex> lock(versions_mu_);
  versions_[snap.job_id] = version;
  return absl::OkStatus();
}

absl::Status EtcdJournal::CheckStoreValue(const std::string& job_id, std::int64_t round,
                                          const std::string& key, std::size_t value_bytes) const {
  const std::size_t room = RoomForValues(StoreKey(job_id, round, key).size());
  if (value_bytes <= room) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      Fence(job_id, round), "store value of ", value_bytes, " bytes for key '", key.substr(0, 64),
      "' does not fit one etcd request (at most ", room,
      " bytes with --etcd_max_request_bytes=", options_.max_request_bytes,
      "): keep large data out of the store, or raise etcd's --max-request-bytes and ddprund's "
      "--etcd_max_request_bytes together"));
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
  std::lock_guard<std::mutex> lock(versions_mu_);
  versions_.erase(job_id);
}

}  // namespace ddprun::rendezvous
