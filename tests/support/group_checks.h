// Checks of a CPU group's collectives and of the Reducer over ThreadRanks
// (thread_ranks.h), shared by the unit tier (shared memory path,
// tests/unit/worker_sdk/thread_group_test.cc) and the integration tier (Gloo's
// TCP path, tests/integration/worker_sdk/gloo_threads_test.cc). Every rank's
// thread runs the collectives and returns its buffers; the checks compare them
// on the main thread against a reference computed from every rank's inputs
// (sdk_values.h).
#pragma once

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "ddp/ddp.h"
#include "support/sdk_values.h"
#include "support/thread_ranks.h"

namespace ddprun::test {

using Bytes = std::vector<unsigned char>;

// op over every rank's Value(r, i, dtype, salt), rounded to the dtype; kAvg
// divided like the SDK (integers truncate).
inline double ReferenceOf(ddp::ReduceOp op, ddp::DType dtype, int world, std::size_t i,
                          std::uint64_t salt) {
  double acc = Value(0, i, dtype, salt);
  for (int r = 1; r < world; ++r) {
    const double v = Value(r, i, dtype, salt);
    if (op == ddp::ReduceOp::kMax)
      acc = std::max(acc, v);
    else if (op == ddp::ReduceOp::kMin)
      acc = std::min(acc, v);
    else
      acc += v;
  }
  if (op == ddp::ReduceOp::kAvg) {
    acc = IsInt(dtype) ? double(std::int64_t(acc) / world) : acc / world;
  }
  switch (dtype) {
    case ddp::DType::kFloat32:
      return float(acc);
    case ddp::DType::kFloat16:
      return ddp::detail::Float16ToFloat(ddp::detail::FloatToFloat16(float(acc)));
    case ddp::DType::kBFloat16:
      return ddp::detail::BFloat16ToFloat(ddp::detail::FloatToBFloat16(float(acc)));
    default:
      return acc;
  }
}

// Whether got is want, or within the dtype's rounding for floats (sums of
// several ranks may be added in another order than the reference's).
inline bool Close(double got, double want, ddp::DType dtype) {
  if (IsInt(dtype)) return got == want;
  const double tol = dtype == ddp::DType::kFloat64   ? 1e-12
                     : dtype == ddp::DType::kFloat32 ? 1e-6
                     : dtype == ddp::DType::kFloat16 ? 1e-3
                                                     : 8e-3;
  return std::fabs(got - want) <= tol * std::max(1.0, std::fabs(want));
}

// Requires got[i] Close to want(i) for every i < n; reports the first that is not.
template <class Want>
void RequireAllClose(TypedBuf& got, std::size_t n, Want want) {
  for (std::size_t i = 0; i < n; ++i) {
    const double w = want(i);
    if (!Close(got.Get(i), w, got.dtype)) {
      INFO("first differing element " << i << " of " << n);
      REQUIRE(got.Get(i) == w);
    }
  }
}

// Every dtype and op at each size against the reference; every rank ends
// with the same bits.
inline void CheckAllreduce(ThreadRanks& ranks, const std::vector<std::size_t>& sizes) {
  const int world = ranks.size();
  std::uint64_t salt = 1;
  for (ddp::DType dtype : kDTypes) {
    for (ddp::ReduceOp op : kOps) {
      for (std::size_t n : sizes) {
        INFO(ddp::DTypeName(dtype)
             << " " << ddp::ReduceOpName(op) << " n=" << n << " world " << world);
        const auto out = ranks.Run([&](int r) {
          TypedBuf b(dtype, n);
          for (std::size_t i = 0; i < n; ++i) b.Set(i, Value(r, i, dtype, salt));
          ranks.group(r)->Allreduce(b.data(), n, dtype, op).Wait();
          return b.bytes;
        });
        for (int r = 1; r < world; ++r) REQUIRE(out[r] == out[0]);
        TypedBuf got(dtype, n);
        got.bytes = out[0];
        RequireAllClose(got, n,
                        [&](std::size_t i) { return ReferenceOf(op, dtype, world, i, salt); });
        ++salt;
      }
    }
  }
}

// Root's values reach every rank, from every root.
inline void CheckBroadcast(ThreadRanks& ranks, std::size_t n) {
  for (int root = 0; root < ranks.size(); ++root) {
    for (ddp::DType dtype : kDTypes) {
      INFO("root " << root << " " << ddp::DTypeName(dtype) << " n=" << n);
      const auto out = ranks.Run([&](int r) {
        TypedBuf b(dtype, n);
        for (std::size_t i = 0; i < n; ++i) b.Set(i, Value(r, i, dtype, 77));
        ranks.group(r)->Broadcast(b.data(), n, dtype, root).Wait();
        return b.bytes;
      });
      TypedBuf want(dtype, n);
      for (std::size_t i = 0; i < n; ++i) want.Set(i, Value(root, i, dtype, 77));
      for (int r = 0; r < ranks.size(); ++r) REQUIRE(out[r] == want.bytes);
    }
  }
}

// Allgather: rank-major concatenation; reduce-scatter: this rank's block of
// the reduction, for every op.
inline void CheckAllgatherReduceScatter(ThreadRanks& ranks, std::size_t n) {
  const int world = ranks.size();
  for (ddp::DType dtype : kDTypes) {
    INFO(ddp::DTypeName(dtype) << " n=" << n);
    const auto gathered = ranks.Run([&](int r) {
      TypedBuf in(dtype, n), out(dtype, n * world);
      for (std::size_t i = 0; i < n; ++i) in.Set(i, Value(r, i, dtype, 5));
      ranks.group(r)->Allgather(in.data(), out.data(), n, dtype).Wait();
      return out.bytes;
    });
    TypedBuf want(dtype, n * world);
    for (int r = 0; r < world; ++r)
      for (std::size_t i = 0; i < n; ++i) want.Set(r * n + i, Value(r, i, dtype, 5));
    for (int r = 0; r < world; ++r) REQUIRE(gathered[r] == want.bytes);

    for (ddp::ReduceOp op : kOps) {
      INFO(ddp::ReduceOpName(op));
      const auto blocks = ranks.Run([&](int r) {
        TypedBuf in(dtype, n * world), out(dtype, n);
        for (std::size_t i = 0; i < n * world; ++i) in.Set(i, Value(r, i, dtype, 9));
        ranks.group(r)->ReduceScatter(in.data(), out.data(), n, dtype, op).Wait();
        return out.bytes;
      });
      for (int r = 0; r < world; ++r) {
        TypedBuf got(dtype, n);
        got.bytes = blocks[r];
        INFO("rank " << r);
        RequireAllClose(got, n,
                        [&](std::size_t i) { return ReferenceOf(op, dtype, world, r * n + i, 9); });
      }
    }
  }
}

// No rank leaves a barrier before every rank entered it: each counts itself
// in before the barrier and reads the count after it (no sleeps needed).
inline void CheckBarrier(ThreadRanks& ranks, int rounds) {
  std::vector<std::atomic<int>> arrived(rounds);
  const auto seen = ranks.Run([&](int r) {
    std::vector<int> after;
    for (int k = 0; k < rounds; ++k) {
      arrived[k].fetch_add(1);
      ranks.group(r)->Barrier().Wait();
      after.push_back(arrived[k].load());
    }
    return after;
  });
  for (int r = 0; r < ranks.size(); ++r)
    for (int k = 0; k < rounds; ++k) REQUIRE(seen[r][k] == ranks.size());
}

// ---- Reducer ----

// A fake model's gradients of uneven sizes; g[k][i] from (rank, k, i, step),
// exactly summable (multiples of 2^-10), so any order of addition gives the
// same bits.
inline const std::vector<std::size_t> kModel = {1000, 7, 250000, 3, 70000, 1, 30001, 64};

inline std::vector<std::vector<float>> ModelGrads(int rank, int step) {
  std::vector<std::vector<float>> g;
  for (std::size_t k = 0; k < kModel.size(); ++k) {
    g.emplace_back(kModel[k]);
    for (std::size_t i = 0; i < kModel[k]; ++i)
      g[k][i] = float(Value(rank, i + 1000003 * k, ddp::DType::kFloat32, step));
  }
  return g;
}

// Bucketed (several buckets) equals a per-tensor all-reduce bit for bit, over
// three steps, and the bucket statistics cover every byte.
inline void CheckReducerBucketing(ThreadRanks& ranks) {
  struct Result {
    std::vector<std::vector<float>> bucketed, plain;
    std::size_t buckets = 0, steps = 0, stat_buckets = 0, stat_bytes = 0;
  };
  const auto results = ranks.Run([&](int r) {
    auto pg = ranks.group(r);
    ddp::ReducerOptions opts;
    opts.average = false;
    opts.bucket_cap_bytes = 256 * 1024;
    opts.first_bucket_bytes = 16 * 1024;
    ddp::Reducer reducer(pg, opts);
    Result res;
    res.bucketed = ModelGrads(r, 0);
    for (auto& t : res.bucketed) reducer.Register(std::span<float>(t));
    for (int step = 0; step < 3; ++step) {
      auto fresh = ModelGrads(r, step);
      for (std::size_t k = 0; k < kModel.size(); ++k) res.bucketed[k] = fresh[k];
      for (std::size_t k = kModel.size(); k-- > 0;) reducer.MarkReady(k);  // backward order
      reducer.Finish();
      res.plain = std::move(fresh);
      std::vector<ddp::Work> w;
      for (auto& t : res.plain) w.push_back(pg->Allreduce(std::span<float>(t)));
      for (auto& x : w) x.Wait();
    }
    res.buckets = reducer.num_buckets();
    res.steps = reducer.num_steps();
    for (const auto& st : reducer.last_step_stats()) {
      ++res.stat_buckets;
      res.stat_bytes += st.wire_bytes;
    }
    return res;
  });
  std::size_t model_bytes = 0;
  for (std::size_t s : kModel) model_bytes += s * 4;
  for (int r = 0; r < ranks.size(); ++r) {
    INFO("rank " << r);
    const Result& res = results[r];
    REQUIRE(res.buckets > 2);
    REQUIRE(res.steps == 3);
    REQUIRE(res.stat_buckets == res.buckets);
    REQUIRE(res.stat_bytes == model_bytes);
    for (std::size_t k = 0; k < kModel.size(); ++k) {
      INFO("gradient " << k);
      REQUIRE(std::memcmp(res.bucketed[k].data(), res.plain[k].data(), kModel[k] * 4) == 0);
    }
  }
}

// Averaging (the default), MarkReady out of backward order, with and without
// gradient_as_bucket_view (then the gradients live in the buckets).
inline void CheckReducerAveragingAndViews(ThreadRanks& ranks) {
  const int world = ranks.size();
  for (bool view : {false, true}) {
    INFO("gradient_as_bucket_view=" << view);
    struct Result {
      std::vector<std::vector<float>> grads;
      bool in_place = false;
    };
    const auto results = ranks.Run([&](int r) {
      ddp::ReducerOptions opts;
      opts.gradient_as_bucket_view = view;
      opts.bucket_cap_bytes = 256 * 1024;
      ddp::Reducer reducer(ranks.group(r), opts);
      auto mine = ModelGrads(r, 0);
      for (auto& t : mine) reducer.Register(std::span<float>(t));
      std::vector<float*> where;
      for (std::size_t k = 0; k < kModel.size(); ++k)
        where.push_back(static_cast<float*>(reducer.GradientBuffer(k)));
      Result res;
      res.in_place = where[0] == mine[0].data();
      for (int step = 0; step < 2; ++step) {
        const auto fresh = ModelGrads(r, step);
        for (std::size_t k = 0; k < kModel.size(); ++k)
          std::memcpy(where[k], fresh[k].data(), kModel[k] * 4);
        for (std::size_t k = 0; k < kModel.size(); ++k) reducer.MarkReady(k);
        reducer.Finish();
      }
      for (std::size_t k = 0; k < kModel.size(); ++k)
        res.grads.emplace_back(where[k], where[k] + kModel[k]);
      return res;
    });
    for (int r = 0; r < world; ++r) {
      INFO("rank " << r);
      REQUIRE(results[r].in_place == !view);
      for (std::size_t k = 0; k < kModel.size(); ++k) {
        INFO("gradient " << k);
        TypedBuf got(ddp::DType::kFloat32, kModel[k]);
        std::memcpy(got.data(), results[r].grads[k].data(), kModel[k] * 4);
        RequireAllClose(got, kModel[k], [&](std::size_t i) {
          double want = 0;
          for (int q = 0; q < world; ++q)
            want += Value(q, i + 1000003 * k, ddp::DType::kFloat32, 1);
          return want / world;
        });
      }
    }
  }
}

// ---- A lost peer ----

// The agent breaks the group (the in-place control block's generation moves
// past the one the group was formed in, Backend::WatchBreaks) while every
// rank but the last waits in an all-reduce the last never joins: each
// waiting rank gets PeerLostError (rank unknown: -1) within 2 s of the break,
// far below the group's 30 s timeout, and its later calls are refused. At
// each of `counts` (floats: small ones take the caller-run and sync paths).
inline void CheckAgentBreakFailsFast(int world, ddp::InitOptions options,
                                     const std::vector<std::size_t>& counts) {
  using Clock = std::chrono::steady_clock;
  options.timeout = std::chrono::seconds(30);
  for (std::size_t count : counts) {
    ThreadRanks ranks(world, options);
    std::atomic<std::uint64_t> generation{0};
    for (int r = 0; r < world; ++r) ranks.group(r)->backend_impl().WatchBreaks(&generation, 0);
    std::atomic<std::int64_t> broke_at{0};
    struct Seen {
      std::string error;
      int lost_rank = -2;
      Clock::time_point at;
      bool refused_after = false;
    };
    std::thread breaker([&] {
      // The waiting ranks are blocked by now, or block right after: either
      // way the error must follow the break.
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      broke_at = Clock::now().time_since_epoch().count();
      generation.store(1, std::memory_order_release);
    });
    std::vector<Seen> seen = ranks.Run([&](int r) {
      Seen s;
      if (r == world - 1) return s;  // never joins
      std::vector<float> v(count, 1.0f);
      try {
        ranks.group(r)->Allreduce(std::span<float>(v)).Wait();
        s.error = "no error";
      } catch (const ddp::PeerLostError& e) {
        s.at = Clock::now();
        s.error = e.what();
        s.lost_rank = e.rank();
        try {
          ranks.group(r)->Barrier().Wait();
        } catch (const ddp::StateError&) {
          s.refused_after = true;
        }
      } catch (const std::exception& e) {
        s.error = std::string("another error: ") + e.what();
      }
      return s;
    });
    breaker.join();
    for (int r = 0; r + 1 < world; ++r) {
      INFO(count << " floats, rank " << r << ": " << seen[r].error);
      REQUIRE(seen[r].lost_rank == -1);
      REQUIRE(seen[r].error.find("broken") != std::string::npos);
      const auto after = seen[r].at - Clock::time_point(Clock::duration(broke_at.load()));
      REQUIRE(after >= Clock::duration::zero());
      REQUIRE(after < std::chrono::seconds(2));
      REQUIRE(seen[r].refused_after);
    }
  }
}

}  // namespace ddprun::test
