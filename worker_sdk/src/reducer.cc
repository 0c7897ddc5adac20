// The Reducer (ddp/reducer.h): bucket assignment, launch in bucket order,
// averaging/compression and the first-step cross-rank check.
//
// Compression converts through Backend::CompressF32/DecompressF32: on the
// host for host-memory backends, with kernels on the caller's stream on NCCL.
#include "ddp/reducer.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backend.h"
#include "status.h"

namespace ddp {

std::vector<std::vector<std::size_t>> ComputeBucketAssignment(const std::vector<GradSpec>& grads,
                                                              std::size_t first_bucket_bytes,
                                                              std::size_t bucket_cap_bytes) {
  // One open bucket per (dtype, device); gradients are taken in reverse
  // registration order; a bucket closes once it reaches its limit. Buckets
  // are ordered by when they were opened, which for one dtype is reverse
  // registration order (c10d's _compute_bucket_assignment_by_size, reversed).
  struct Open {
    std::vector<std::size_t> members;
    std::size_t bytes = 0;
    std::size_t order = 0;  // when it was opened
  };
  using Key = std::tuple<int, int, int>;
  std::map<Key, Open> open;
  std::map<Key, std::size_t> closed_count;
  std::vector<std::pair<std::size_t, std::vector<std::size_t>>> done;
  std::size_t opened = 0;
  for (std::size_t k = grads.size(); k-- > 0;) {
    const GradSpec& g = grads[k];
    const Key key{static_cast<int>(g.dtype), static_cast<int>(g.device.type), g.device.index};
    auto it = open.find(key);
    if (it == open.end()) {
      it = open.emplace(key, Open{}).first;
      it->second.order = opened++;
    }
    Open& b = it->second;
    b.members.push_back(k);
    b.bytes += g.count * DTypeSize(g.dtype);
    // The first bucket of each (dtype, device) is small, so the last layers'
    // gradients go out early.
    const std::size_t limit = closed_count[key] == 0
                                  ? std::min(first_bucket_bytes, bucket_cap_bytes)
                                  : bucket_cap_bytes;
    if (b.bytes >= limit) {
      done.emplace_back(b.order, std::move(b.members));
      ++closed_count[key];
      open.erase(it);
    }
  }
  for (auto& [key, b] : open) done.emplace_back(b.order, std::move(b.members));
  std::stable_sort(done.begin(), done.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::vector<std::size_t>> out;
  for (auto& [order, members] : done) out.push_back(std::move(members));
  return out;
}

class ReducerImpl {
  using Clock = std::chrono::steady_clock;

 public:
  ReducerImpl(std::shared_ptr<ProcessGroup> group, ReducerOptions options)
      : group_(std::move(group)), b_(group_->backend_impl()), options_(options) {}

  ~ReducerImpl() {
    // Outstanding buckets must finish before their memory goes.
    for (Bucket& bucket : buckets_) {
      if (bucket.work) (void)bucket.work->Wait(b_.timeout());
      if (bucket.flat) b_.Free(bucket.flat);
      if (bucket.wire && bucket.wire != bucket.flat) b_.Free(bucket.wire);
    }
  }

  absl::StatusOr<std::size_t> Register(void* data, std::size_t count, DType dtype,
                                       Device device) {
    if (steps_ > 0 || built_) {
      return absl::FailedPreconditionError(absl::StrCat(
          b_.Fence(), "Reducer::Register: gradients must all be registered before the first "
                      "step (", grads_.size(), " were registered, then a step ran)"));
    }
    if (!IsValidDType(static_cast<int>(dtype))) {
      return absl::InvalidArgumentError(absl::StrCat(b_.Fence(), "Reducer::Register: gradient ",
                                                     grads_.size(), " has invalid dtype ",
                                                     static_cast<int>(dtype)));
    }
    if (data == nullptr && count > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          b_.Fence(), "Reducer::Register: gradient ", grads_.size(), " is a null pointer"));
    }
    if (options_.compression != Compression::kNone && dtype != DType::kFloat32) {
      return absl::InvalidArgumentError(
          absl::StrCat(b_.Fence(), "Reducer::Register: gradient ", grads_.size(), " is ",
                       DTypeName(dtype), "; compression applies to f32 gradients only"));
    }
    grads_.push_back(GradSpec{data, count, dtype, device});
    return grads_.size() - 1;
  }

  absl::StatusOr<void*> GradientBuffer(std::size_t index) {
    DDPRUN_RETURN_IF_ERROR(CheckIndex("GradientBuffer", index));
    if (!options_.gradient_as_bucket_view) return grads_[index].data;
    DDPRUN_RETURN_IF_ERROR(EnsureBuilt());
    const Slot& s = slots_[index];
    return static_cast<char*>(buckets_[s.bucket].flat) +
           s.offset * DTypeSize(grads_[index].dtype);
  }

  absl::Status MarkReady(std::size_t index) {
    DDPRUN_RETURN_IF_ERROR(CheckIndex("MarkReady", index));
    if (!require_sync_) return absl::OkStatus();
    DDPRUN_RETURN_IF_ERROR(BeginStep());
    if (ready_[index]) {
      return absl::InvalidArgumentError(absl::StrCat(
          b_.Fence(), "Reducer::MarkReady: gradient ", index, " was marked ready twice in step ",
          steps_));
    }
    ready_[index] = true;
    Bucket& bucket = buckets_[slots_[index].bucket];
    if (--bucket.pending == 0) {
      bucket.ready_at = Clock::now();
      return LaunchReadyBuckets();
    }
    return absl::OkStatus();
  }

  absl::Status Finish() {
    if (broken_) return Broken("Finish");
    if (!require_sync_) return absl::OkStatus();  // accumulate locally
    DDPRUN_RETURN_IF_ERROR(BeginStep());
    // Gradients never marked ready count as ready (e.g. unused parameters:
    // their buffers hold whatever the trainer left there, usually zeros).
    for (std::size_t i = 0; i < grads_.size(); ++i) {
      if (!ready_[i]) {
        ready_[i] = true;
        Bucket& bucket = buckets_[slots_[i].bucket];
        if (--bucket.pending == 0) bucket.ready_at = Clock::now();
      }
    }
    DDPRUN_RETURN_IF_ERROR(LaunchReadyBuckets());
    for (Bucket& bucket : buckets_) {
      absl::Status s = bucket.work ? bucket.work->WaitDefault() : absl::OkStatus();
      bucket.work.reset();
      if (!s.ok()) return Break(s);
      if (bucket.wire != bucket.flat) {
        // Compressed: pre-divided on the way out, so only widen. The
        // collective is complete (waited above); on NCCL the kernel runs on
        // the caller's stream, before the unpacking copies below.
        s = b_.DecompressF32(bucket.wire, static_cast<float*>(bucket.flat), bucket.count,
                             bucket.wire_dtype);
        if (!s.ok()) return Break(s);
      }
      if (!options_.gradient_as_bucket_view && !unpacked_) {
        DDPRUN_RETURN_IF_ERROR(b_.CopyMany(bucket.unpack, bucket.on_device));
      }
    }
    EndStep();
    return absl::OkStatus();
  }

  void SetRequireSync(bool v) { require_sync_ = v; }
  bool require_sync() const { return require_sync_; }
  std::size_t num_steps() const { return steps_; }
  std::size_t num_buckets() const { return buckets_.size(); }
  std::vector<std::vector<std::size_t>> assignment() const {
    std::vector<std::vector<std::size_t>> out;
    for (const Bucket& b : buckets_) out.push_back(b.members);
    return out;
  }
  const std::vector<BucketStats>& last_step_stats() const { return last_stats_; }

 private:
  struct Bucket {
    std::vector<std::size_t> members;
    DType dtype = DType::kFloat32;
    DType wire_dtype = DType::kFloat32;
    std::size_t count = 0;
    std::size_t pending = 0;
    void* flat = nullptr;  // the gradients, packed (or viewed)
    void* wire = nullptr;  // what is all-reduced: flat, or its compressed copy
    detail::WorkPtr work;
    // Copy mode with a flat buffer: the gradients into it before the
    // collective, and back after; on_device when every member is on a GPU.
    std::vector<detail::CopySpan> pack, unpack;
    bool on_device = false;
    // This step: its last gradient became ready; LaunchReadyBuckets took it
    // up; its collective was issued (BucketStats).
    Clock::time_point ready_at, start_at, launched_at;
  };
  struct Slot {
    std::size_t bucket = 0;
    std::size_t offset = 0;  // in elements
  };

  absl::Status CheckIndex(const char* op, std::size_t index) {
    if (broken_) return Broken(op);
    if (index >= grads_.size()) {
      return absl::InvalidArgumentError(absl::StrCat(b_.Fence(), "Reducer::", op, ": gradient ",
                                                     index, " is not registered (",
                                                     grads_.size(), " are)"));
    }
    return absl::OkStatus();
  }
  absl::Status Broken(const char* op) const {
    return absl::FailedPreconditionError(
        absl::StrCat(b_.Fence(), "Reducer::", op, ": an earlier step failed: ", broken_why_));
  }

  absl::Status EnsureBuilt() {
    if (built_) return absl::OkStatus();
    if (grads_.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat(b_.Fence(), "Reducer: no gradients were registered"));
    }
    const auto assignment = ComputeBucketAssignment(grads_, options_.first_bucket_bytes,
                                                    options_.bucket_cap_bytes);
    // Copy mode on a backend that all-reduces a list of buffers in place
    // (shared memory): no packing into flat buckets and back; the backend's
    // own copy into shared memory is the packing.
    unpacked_ = !options_.gradient_as_bucket_view &&
                options_.compression == Compression::kNone && b_.SupportsAllreducePieces();
    slots_.assign(grads_.size(), Slot{});
    for (const auto& members : assignment) {
      Bucket bucket;
      bucket.members = members;
      bucket.dtype = grads_[members.front()].dtype;
      for (std::size_t i : members) {
        slots_[i] = Slot{buckets_.size(), bucket.count};
        bucket.count += grads_[i].count;
      }
      bucket.wire_dtype = bucket.dtype;
      if (unpacked_) {
        buckets_.push_back(std::move(bucket));
        continue;  // no flat buffer: the backend reads and writes the gradients
      }
      DDPRUN_ASSIGN_OR_RETURN(bucket.flat, b_.Alloc(bucket.count * DTypeSize(bucket.dtype)));
      bucket.wire = bucket.flat;
      if (options_.compression != Compression::kNone) {
        bucket.wire_dtype =
            options_.compression == Compression::kFloat16 ? DType::kFloat16 : DType::kBFloat16;
        DDPRUN_ASSIGN_OR_RETURN(bucket.wire, b_.Alloc(bucket.count * 2));
      }
      const std::size_t esize = DTypeSize(bucket.dtype);
      bucket.on_device = true;
      for (std::size_t i : members) {
        char* in_flat = static_cast<char*>(bucket.flat) + slots_[i].offset * esize;
        const std::size_t bytes = grads_[i].count * esize;
        bucket.pack.push_back({in_flat, grads_[i].data, bytes});
        bucket.unpack.push_back({grads_[i].data, in_flat, bytes});
        bucket.on_device = bucket.on_device && grads_[i].device.type == DeviceType::kCuda;
      }
      if (options_.gradient_as_bucket_view) {
        // The view starts with what the trainer's buffer held.
        DDPRUN_RETURN_IF_ERROR(b_.CopyMany(bucket.pack, bucket.on_device));
      }
      buckets_.push_back(std::move(bucket));
    }
    ready_.assign(grads_.size(), false);
    ResetPending();
    built_ = true;
    return absl::OkStatus();
  }

  void ResetPending() {
    for (Bucket& b : buckets_) b.pending = b.members.size();
    std::fill(ready_.begin(), ready_.end(), false);
    next_bucket_ = 0;
  }

  absl::Status BeginStep() {
    DDPRUN_RETURN_IF_ERROR(EnsureBuilt());
    if (!checked_) {
      absl::Status s = CheckAcrossRanks();
      if (!s.ok()) return Break(s);
      checked_ = true;
    }
    return absl::OkStatus();
  }

  void EndStep() {
    last_stats_.resize(buckets_.size());
    for (std::size_t k = 0; k < buckets_.size(); ++k) {
      const Bucket& b = buckets_[k];
      BucketStats& st = last_stats_[k];
      st.count = b.count;
      st.wire_bytes = b.count * DTypeSize(b.wire_dtype);
      st.ready_to_launch = std::chrono::duration_cast<std::chrono::nanoseconds>(
          b.launched_at - b.ready_at);
      st.issue = std::chrono::duration_cast<std::chrono::nanoseconds>(b.launched_at - b.start_at);
    }
    ResetPending();
    ++steps_;
  }

  // Launches every bucket whose gradients are all ready, strictly in bucket order.
  absl::Status LaunchReadyBuckets() {
    while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
      Bucket& bucket = buckets_[next_bucket_];
      bucket.start_at = Clock::now();
      auto work = Launch(bucket);
      if (!work.ok()) return Break(work.status());
      bucket.work = *work;
      bucket.launched_at = Clock::now();
      ++next_bucket_;
    }
    return absl::OkStatus();
  }

  // Packs (or compresses) a bucket as its mode needs and issues its all-reduce.
  absl::StatusOr<detail::WorkPtr> Launch(Bucket& bucket) {
    // Averaging is the backend's kAvg (ncclAvg on NCCL; on the CPU paths the
    // communication thread divides, on shared memory each rank its share
    // while it is in cache), so Finish() does not pass over the buckets again.
    const ReduceOp reduce = options_.average ? ReduceOp::kAvg : ReduceOp::kSum;
    if (unpacked_) {
      std::vector<detail::Backend::Piece> pieces;
      for (std::size_t i : bucket.members) pieces.push_back({grads_[i].data, grads_[i].count});
      return b_.AllreducePieces(std::move(pieces), bucket.dtype, reduce);
    }
    if (!options_.gradient_as_bucket_view) {
      DDPRUN_RETURN_IF_ERROR(b_.CopyMany(bucket.pack, bucket.on_device));
    }
    if (bucket.wire == bucket.flat) {
      return b_.Allreduce(bucket.wire, bucket.count, bucket.wire_dtype, reduce);
    }
    // Compressed: pre-divided so that the sum of world values stays in half
    // range, then summed.
    const float scale = options_.average ? 1.0f / float(b_.size()) : 1.0f;
    DDPRUN_RETURN_IF_ERROR(b_.CompressF32(static_cast<const float*>(bucket.flat), bucket.wire,
                                       bucket.count, bucket.wire_dtype, scale));
    return b_.Allreduce(bucket.wire, bucket.count, bucket.wire_dtype, ReduceOp::kSum);
  }

  // Marks the Reducer unusable; later calls name s.
  absl::Status Break(absl::Status s) {
    broken_ = true;
    broken_why_ = std::string(s.message());
    return s;
  }

  // At the first step every rank allgathers (count, hash of (count, dtype)
  // per gradient); if they differ, the full lists, to name the first
  // differing gradient. Every rank then returns the same error.
  absl::Status CheckAcrossRanks() {
    const int world = b_.size();
    if (world == 1) return absl::OkStatus();
    std::uint64_t h = 1469598103934665603ull;
    for (const GradSpec& g : grads_) {
      for (std::uint64_t v : {std::uint64_t(g.count), std::uint64_t(g.dtype)}) {
        h ^= v;
        h *= 1099511628211ull;
      }
    }
    std::vector<std::int64_t> mine = {std::int64_t(grads_.size()), std::int64_t(h >> 1)};
    std::vector<std::int64_t> all(2 * world);
    DDPRUN_RETURN_IF_ERROR(AllgatherHost(mine, &all));
    bool same = true;
    std::int64_t max_n = 0;
    for (int r = 0; r < world; ++r) {
      same = same && all[2 * r] == all[0] && all[2 * r + 1] == all[1];
      max_n = std::max(max_n, all[2 * r]);
    }
    if (same) return absl::OkStatus();
    std::vector<std::int64_t> list(2 * max_n, -1);
    for (std::size_t i = 0; i < grads_.size(); ++i) {
      list[2 * i] = std::int64_t(grads_[i].count);
      list[2 * i + 1] = std::int64_t(grads_[i].dtype);
    }
    std::vector<std::int64_t> lists(list.size() * world);
    DDPRUN_RETURN_IF_ERROR(AllgatherHost(list, &lists));
    auto describe = [&](int r, std::int64_t i) -> std::string {
      const std::int64_t c = lists[r * 2 * max_n + 2 * i];
      const std::int64_t d = lists[r * 2 * max_n + 2 * i + 1];
      if (c < 0) return absl::StrCat("rank ", r, " has no such gradient (", all[2 * r],
                                     " registered)");
      return absl::StrCat("rank ", r, " has ", c, " x ", DTypeName(static_cast<DType>(d)));
    };
    for (std::int64_t i = 0; i < max_n; ++i) {
      for (int r = 1; r < world; ++r) {
        if (lists[r * 2 * max_n + 2 * i] != lists[2 * i] ||
            lists[r * 2 * max_n + 2 * i + 1] != lists[2 * i + 1]) {
          return absl::InvalidArgumentError(absl::StrCat(
              b_.Fence(), "Reducer: the registered gradients differ across ranks; the first "
                          "differing one is gradient ", i, " (registration order): ",
              describe(0, i), ", ", describe(r, i),
              ". Every rank must register the same buffers in the same order."));
        }
      }
    }
    return absl::InternalError(absl::StrCat(b_.Fence(), "Reducer: gradient hashes differ"));
  }

  // A blocking allgather of host int64 values (through device memory on NCCL).
  absl::Status AllgatherHost(const std::vector<std::int64_t>& in,
                             std::vector<std::int64_t>* out) {
    const std::size_t n = in.size();
    if (!b_.device_memory()) {
      DDPRUN_ASSIGN_OR_RETURN(const detail::WorkPtr w,
                              b_.Allgather(in.data(), out->data(), n, DType::kInt64));
      return w->WaitDefault();
    }
    DDPRUN_ASSIGN_OR_RETURN(void* const dev, b_.Alloc(8 * n * (b_.size() + 1)));
    char* d = static_cast<char*>(dev);
    absl::Status s = b_.Copy(d, in.data(), 8 * n);
    if (s.ok()) {
      auto w = b_.Allgather(d, d + 8 * n, n, DType::kInt64);
      s = w.ok() ? (*w)->WaitDefault() : w.status();
    }
    if (s.ok()) s = b_.Copy(out->data(), d + 8 * n, 8 * n * b_.size());
    if (s.ok()) s = b_.SyncCopies();
    b_.Free(d);
    return s;
  }

  std::shared_ptr<ProcessGroup> group_;
  detail::Backend& b_;
  ReducerOptions options_;
  std::vector<GradSpec> grads_;
  std::vector<Bucket> buckets_;
  std::vector<Slot> slots_;
  std::vector<bool> ready_;
  std::size_t next_bucket_ = 0;
  std::size_t steps_ = 0;
  bool unpacked_ = false;  // copy mode without flat buckets (AllreducePieces)
  bool built_ = false;
  bool checked_ = false;
  bool require_sync_ = true;
  bool broken_ = false;
  std::string broken_why_;
  std::vector<BucketStats> last_stats_;
};

// ---- public boundary ----

Reducer::Reducer(std::shared_ptr<ProcessGroup> group, ReducerOptions options) {
  if (!group) throw InvalidArgumentError("ddp::Reducer: the process group is null");
  if (options.bucket_cap_bytes == 0) {
    throw InvalidArgumentError("ddp::Reducer: bucket_cap_bytes must be positive");
  }
  impl_ = std::make_unique<ReducerImpl>(std::move(group), options);
}
Reducer::~Reducer() = default;

std::size_t Reducer::Register(void* data, std::size_t count, DType dtype, Device device) {
  return detail::ValueOrThrow(impl_->Register(data, count, dtype, device));
}
void* Reducer::GradientBuffer(std::size_t index) {
  return detail::ValueOrThrow(impl_->GradientBuffer(index));
}
void Reducer::MarkReady(std::size_t index) { detail::ThrowIfError(impl_->MarkReady(index)); }
void Reducer::Finish() { detail::ThrowIfError(impl_->Finish()); }
void Reducer::SetRequireSync(bool require_sync) { impl_->SetRequireSync(require_sync); }
std::size_t Reducer::num_buckets() const { return impl_->num_buckets(); }
std::vector<std::vector<std::size_t>> Reducer::bucket_assignment() const {
  return impl_->assignment();
}
std::size_t Reducer::num_steps() const { return impl_->num_steps(); }
std::vector<BucketStats> Reducer::last_step_stats() const { return impl_->last_step_stats(); }

Reducer::NoSyncGuard::NoSyncGuard(Reducer& r) : r_(r), previous_(r.impl_->require_sync()) {
  r_.SetRequireSync(false);
}
Reducer::NoSyncGuard::~NoSyncGuard() { r_.SetRequireSync(previous_); }

void BroadcastParameters(ProcessGroup& group, const std::vector<GradSpec>& params, int root) {
  detail::Backend& b = group.backend_impl();
  constexpr std::size_t kChunkBytes = 250u * 1024 * 1024;
  // Coalesce per dtype into chunks of up to 250 MiB (DDP's broadcast_bucket_size).
  std::map<int, std::vector<std::size_t>> by_dtype;
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!IsValidDType(static_cast<int>(params[i].dtype))) {
      throw InvalidArgumentError(absl::StrCat(b.Fence(), "BroadcastParameters: parameter ", i,
                                              " has an invalid dtype"));
    }
    if (params[i].data == nullptr && params[i].count > 0) {
      throw InvalidArgumentError(
          absl::StrCat(b.Fence(), "BroadcastParameters: parameter ", i, " is a null pointer"));
    }
    by_dtype[static_cast<int>(params[i].dtype)].push_back(i);
  }
  for (auto& [d, idx] : by_dtype) {
    const DType dtype = static_cast<DType>(d);
    const std::size_t esize = DTypeSize(dtype);
    std::size_t k = 0;
    while (k < idx.size()) {
      std::size_t bytes = 0, end = k;
      while (end < idx.size() && (end == k || bytes + params[idx[end]].count * esize <= kChunkBytes)) {
        bytes += params[idx[end]].count * esize;
        ++end;
      }
      void* flat = detail::ValueOrThrow(b.Alloc(bytes));
      std::size_t off = 0;
      absl::Status s;
      for (std::size_t j = k; j < end && s.ok(); ++j) {
        s = b.Copy(static_cast<char*>(flat) + off, params[idx[j]].data, params[idx[j]].count * esize);
        off += params[idx[j]].count * esize;
      }
      if (s.ok()) {
        auto w = b.Broadcast(flat, bytes / esize, dtype, root);
        s = w.ok() ? (*w)->WaitDefault() : w.status();
      }
      off = 0;
      for (std::size_t j = k; j < end && s.ok(); ++j) {
        s = b.Copy(params[idx[j]].data, static_cast<char*>(flat) + off, params[idx[j]].count * esize);
        off += params[idx[j]].count * esize;
      }
      if (s.ok()) s = b.SyncCopies();
      b.Free(flat);
      detail::ThrowIfError(s);
      k = end;
    }
  }
}

}  // namespace ddp
