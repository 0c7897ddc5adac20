#include "ddprun/rendezvous/ha/etcd_election.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "ddprun/rendezvous/common/debug_log.h"

namespace ddprun::rendezvous {
namespace {
constexpr auto kRetryPause = std::chrono::milliseconds(200);
constexpr auto kNoticeEvery = std::chrono::seconds(5);
}  // namespace

EtcdElection::EtcdElection(EtcdElectionOptions options) : options_(std::move(options)) {
  thread_ = std::thread([this] { Run(); });
}

EtcdElection::~EtcdElection() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

bool EtcdElection::MayLead() const {
  std::lock_guard<std::mutex> lock(mu_);
  return leading_ && !lost_ && keeper_ && keeper_->Alive();
}

bool EtcdElection::LeaseAlive() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !lost_ && keeper_ && keeper_->Alive();
}

bool EtcdElection::leading() const {
  std::lock_guard<std::mutex> lock(mu_);
  return leading_;
}

std::string EtcdElection::leader() const {
  std::lock_guard<std::mutex> lock(mu_);
  return leader_;
}

void EtcdElection::Pause(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, d, [&] { return stop_; });
}

// At most one line per kNoticeEvery: a long etcd outage is visible, not noisy.
void EtcdElection::Log(const std::string& line) {
  const auto now = std::chrono::steady_clock::now();
  if (now - last_notice_ < kNoticeEvery) return;
  last_notice_ = now;
  std::fprintf(stderr, "ddprund: %s\n", line.c_str());
}

void EtcdElection::Run() {
  const std::string leader_key = options_.prefix + "/leader";
  EtcdClient& etcd = *options_.client;
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) break;
    }
    absl::StatusOr<EtcdLease> lease = etcd.LeaseGrant(options_.lease_ttl_s);
    if (!lease.ok()) {
      Log(absl::StrCat("standby: cannot campaign for the leadership: ", lease.status().message()));
      Pause(kRetryPause);
      continue;
    }
    if (lease->ttl_s != options_.lease_ttl_s && !ttl_noted_) {
      // etcd raises a lease's TTL to its minimum, 1.5 x its --election-timeout
      // rounded up to whole seconds: every fail-over takes that long.
      ttl_noted_ = true;
      std::fprintf(stderr,
                   "ddprund: etcd granted a lease TTL of %lld s, not the %lld s of "
                   "--etcd_lease_ttl (etcd's minimum is 1.5 x its --election-timeout, rounded up "
                   "to seconds); a lost leader is replaced in about %lld.5 s. For a 1 s TTL run "
                   "etcd with --election-timeout 500 --heartbeat-interval 50 (docs/ha.md)\n",
                   static_cast<long long>(lease->ttl_s),
                   static_cast<long long>(options_.lease_ttl_s),
                   static_cast<long long>(lease->ttl_s));
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      lost_ = false;
      lease_id_ = lease->id;
      keeper_ = etcd.KeepAlive(*lease, [this](absl::Status) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          lost_ = true;
        }
        cv_.notify_all();
      });
    }
    std::int64_t revision = 0;
    while (revision == 0) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_ || lost_) break;
      }
      absl::StatusOr<EtcdTxnResult> r = etcd.Txn(
          {EtcdCompare{leader_key, EtcdCompare::Target::kCreateRevision,
                       EtcdCompare::Result::kEqual, 0, ""}},
          {EtcdOp::Put(leader_key, options_.address, lease->id)}, {EtcdOp::Range(leader_key)});
      if (!r.ok()) {
        Log(absl::StrCat("standby: cannot campaign for the leadership: ", r.status().message()));
        Pause(kRetryPause);
        continue;
      }
      if (r->succeeded) {
        revision = r->revision;
        break;
      }
      if (r->ranges.empty() || r->ranges[0].kvs.empty()) continue;  // deleted meanwhile
      const EtcdKeyValue& kv = r->ranges[0].kvs[0];
      if (kv.lease == lease->id) {  // our own Txn, applied before a timeout
        revision = kv.create_revision;
        break;
      }
      bool changed = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        changed = leader_ != kv.value;
        leader_ = kv.value;
        key_deleted_ = false;
      }
      DDPRUN_DEBUG_LOG(kRdzv) << "standby; the leader is " << kv.value;
      if (changed && options_.on_standby) options_.on_standby(kv.value);
      auto watch = etcd.Watch(
          leader_key, "", r->revision + 1,
          [this](const std::vector<EtcdEvent>& events) {
            for (const auto& e : events) {
              if (!e.deleted) continue;
              {
                std::lock_guard<std::mutex> lock(mu_);
                key_deleted_ = true;
              }
              cv_.notify_all();
            }
          },
          [this](absl::Status) {
            {
              std::lock_guard<std::mutex> lock(mu_);
              key_deleted_ = true;  // read the key again
            }
            cv_.notify_all();
          });
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || lost_ || key_deleted_; });
      lock.unlock();
      watch.reset();
    }
    if (revision != 0) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        leading_ = true;
        leader_ = options_.address;
      }
      options_.on_elected(revision);
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || lost_; });
      if (stop_) break;
      leading_ = false;
      lock.unlock();
      options_.on_deposed(absl::UnavailableError(
          "this replica's etcd lease expired; another replica may lead now"));
      break;
    }
    std::unique_ptr<EtcdLeaseKeeper> old;
    {
      std::lock_guard<std::mutex> lock(mu_);
      old = std::move(keeper_);  // a follower's lost lease: campaign with a new one
    }
    old.reset();  // joins its thread, which may be in the callback that takes mu_
  }
  // Stopping: a leader hands over at once instead of after its TTL.
  std::unique_ptr<EtcdLeaseKeeper> keeper;
  std::int64_t lease_id = 0;
  bool was_leading = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    keeper = std::move(keeper_);
    lease_id = lease_id_;
    was_leading = leading_;
    leading_ = false;
  }
  keeper.reset();
  if (lease_id != 0) (void)etcd.LeaseRevoke(lease_id);
  (void)was_leading;
}

}  // namespace ddprun::rendezvous
