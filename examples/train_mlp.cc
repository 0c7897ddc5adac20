// A small data-parallel trainer on the worker SDK, without PyTorch:
//   build/bin/ddprun --nproc_per_node=4 build/examples/train_mlp [--epochs 10]
//
// A 16-64-1 MLP (tanh) learns a fixed teacher function by SGD on MSE. Like
// DDP with DistributedSampler:
//   - rank 0's initial parameters are broadcast (each rank starts from its own seed);
//   - each epoch shuffles the dataset with seed + epoch, the same on every rank,
//     and rank r takes every world-th index starting at r;
//   - backward marks each layer's gradients ready (last layer first), so the
//     Reducer all-reduces them while the rest of backward runs;
//   - Finish() leaves the mean gradient, so every rank takes the same step.
// It exits non-zero unless the loss fell and the parameters are identical on
// every rank at the end.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "ddp/ddp.h"

namespace {

constexpr int kIn = 16, kHidden = 64;
constexpr int kSamples = 4096, kBatch = 32;  // per rank
constexpr float kLr = 0.05f;

struct Dataset {
  std::vector<float> x, y;
  Dataset() : x(kSamples * kIn), y(kSamples) {
    std::mt19937 gen(1234);  // the same data on every rank
    std::normal_distribution<float> n(0, 1);
    for (auto& v : x) v = n(gen);
    for (int s = 0; s < kSamples; ++s) {
      const float* xs = &x[s * kIn];
      y[s] = std::sin(xs[0]) + 0.5f * xs[1] * xs[2] - 0.3f * xs[3];
    }
  }
};

// Parameters and gradients, in model (registration) order.
struct Mlp {
  std::vector<float> w1 = std::vector<float>(kHidden * kIn), b1 = std::vector<float>(kHidden),
                     w2 = std::vector<float>(kHidden), b2 = std::vector<float>(1);
  std::vector<float> gw1 = w1, gb1 = b1, gw2 = w2, gb2 = b2;
  std::vector<std::vector<float>*> params() { return {&w1, &b1, &w2, &b2}; }
  std::vector<std::vector<float>*> grads() { return {&gw1, &gb1, &gw2, &gb2}; }

  void InitRandom(unsigned seed) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> n(0, 1);
    for (auto& v : w1) v = n(gen) / std::sqrt(float(kIn));
    for (auto& v : w2) v = n(gen) / std::sqrt(float(kHidden));
  }
};

// One mini-batch: forward, then backward with MarkReady per layer. Returns the loss.
float Step(Mlp& m, const Dataset& d, std::span<const int> batch, ddp::Reducer& reducer) {
  for (auto* g : m.grads()) std::fill(g->begin(), g->end(), 0.0f);
  std::vector<float> h(kHidden), dh(kHidden);
  float loss = 0;
  const float scale = 1.0f / float(batch.size());
  // Output layer gradients first, then the hidden layer's.
  std::vector<float> hs(batch.size() * kHidden), err(batch.size());
  for (std::size_t b = 0; b < batch.size(); ++b) {
    const float* x = &d.x[batch[b] * kIn];
    float out = m.b2[0];
    for (int j = 0; j < kHidden; ++j) {
      float a = m.b1[j];
      for (int i = 0; i < kIn; ++i) a += m.w1[j * kIn + i] * x[i];
      hs[b * kHidden + j] = std::tanh(a);
      out += m.w2[j] * hs[b * kHidden + j];
    }
    err[b] = out - d.y[batch[b]];
    loss += 0.5f * err[b] * err[b] * scale;
  }
  for (std::size_t b = 0; b < batch.size(); ++b) {
    m.gb2[0] += err[b] * scale;
    for (int j = 0; j < kHidden; ++j) m.gw2[j] += err[b] * hs[b * kHidden + j] * scale;
  }
  reducer.MarkReady(3);  // b2
  reducer.MarkReady(2);  // w2: its bucket goes out while the hidden layer's backward runs
  for (std::size_t b = 0; b < batch.size(); ++b) {
    const float* x = &d.x[batch[b] * kIn];
    for (int j = 0; j < kHidden; ++j) {
      const float hj = hs[b * kHidden + j];
      const float da = err[b] * m.w2[j] * (1 - hj * hj) * scale;
      m.gb1[j] += da;
      for (int i = 0; i < kIn; ++i) m.gw1[j * kIn + i] += da * x[i];
    }
  }
  reducer.MarkReady(1);
  reducer.MarkReady(0);
  reducer.Finish();  // mean gradient over ranks
  for (std::size_t k = 0; k < 4; ++k) {
    auto& p = *m.params()[k];
    const auto& g = *m.grads()[k];
    for (std::size_t i = 0; i < p.size(); ++i) p[i] -= kLr * g[i];
  }
  return loss;
}

// DistributedSampler: shuffle with seed + epoch, pad to a multiple of world, take rank's share.
std::vector<int> ShardForEpoch(int epoch, int rank, int world) {
  std::vector<int> idx(kSamples);
  std::iota(idx.begin(), idx.end(), 0);
  std::mt19937 gen(42 + epoch);
  std::shuffle(idx.begin(), idx.end(), gen);
  const int total = (kSamples + world - 1) / world * world;
  for (int i = kSamples; i < total; ++i) idx.push_back(idx[i - kSamples]);
  std::vector<int> mine;
  for (int i = rank; i < total; i += world) mine.push_back(idx[i]);
  return mine;
}

}  // namespace

int main(int argc, char** argv) {
  int epochs = 10;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--epochs") epochs = std::atoi(argv[i + 1]);
  try {
    auto pg = ddp::Init();
    const int rank = pg->rank(), world = pg->size();
    Dataset data;
    Mlp model;
    model.InitRandom(1000 + rank);  // different on purpose: the broadcast fixes it
    std::vector<ddp::GradSpec> params;
    for (auto* p : model.params()) params.push_back({p->data(), p->size(), ddp::DType::kFloat32, {}});
    ddp::BroadcastParameters(*pg, params);

    ddp::ReducerOptions opts;
    opts.first_bucket_bytes = 512;  // tiny model: still show several buckets
    opts.bucket_cap_bytes = 2048;
    ddp::Reducer reducer(pg, opts);
    for (auto* g : model.grads()) reducer.Register(std::span<float>(*g));

    float first = 0, last = 0;
    for (int epoch = 0; epoch < epochs; ++epoch) {
      const std::vector<int> shard = ShardForEpoch(epoch, rank, world);
      double sum = 0;
      int steps = 0;
      for (std::size_t s = 0; s + kBatch <= shard.size(); s += kBatch, ++steps)
      {
        const float loss = Step(model, data, std::span<const int>(shard).subspan(s, kBatch), reducer);
        sum += loss;
        ddp::metrics::Step(kBatch);  // ddprun's live view: steps, samples/s, step time
        ddp::metrics::Scalar("loss", loss);
      }
      double mean[1] = {sum / std::max(steps, 1)};
      pg->Allreduce(mean, 1, ddp::DType::kFloat64, ddp::ReduceOp::kAvg).Wait();
      if (epoch == 0) first = float(mean[0]);
      last = float(mean[0]);
      if (rank == 0)
        std::printf("epoch %d: loss %.5f (%d steps of %d per rank, %zu buckets)\n", epoch,
                    mean[0], steps, kBatch, reducer.num_buckets());
    }

    // Identical parameters on every rank: max and min over ranks agree bitwise.
    bool same = true;
    for (auto* p : model.params()) {
      std::vector<float> hi = *p, lo = *p;
      pg->Allreduce(std::span<float>(hi), ddp::ReduceOp::kMax).Wait();
      pg->Allreduce(std::span<float>(lo), ddp::ReduceOp::kMin).Wait();
      same = same && std::memcmp(hi.data(), lo.data(), hi.size() * 4) == 0;
    }
    if (rank == 0) {
      std::printf("loss %.5f -> %.5f; parameters identical on all %d ranks: %s\n", first, last,
                  world, same ? "yes" : "NO");
    }
    if (!same || !(last < first)) return 1;
    return 0;
  } catch (const ddp::Error& e) {
    std::fprintf(stderr, "train_mlp: %s\n", e.what());
    return 1;
  }
}
