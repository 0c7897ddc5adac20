// An SDK trainer that survives a peer's death in its own process
// (docs/sdk.md, "Re-forming in place"): every step all-reduces a gradient,
// updates its parameters and saves them with ddp::checkpoint::Save; when a
// collective throws PeerLostError it calls ddp::Reconfigure, reloads the
// checkpoint every rank agrees on and goes on from the step after it.
//
// The gradients are small integers and the learning rate a power of two, so
// every sum is exact: the final parameters do not depend on the order of
// additions, and a run with faults must end with the bits of a fault-free
// run (tests/sdk/inplace_sdk_test.cc compares them).
//
// Environment (all optional but TRAINER_OUT):
//   TRAINER_OUT        prefix of this rank's files: <out>.<rank>.start (one
//                      line per process start: its pid), <out>.<rank> (the
//                      final report: pid, re-forms, each re-form's times,
//                      the parameters' digest)
//   TRAINER_STEPS      steps to train (default 200)
//   TRAINER_COUNT      parameters (floats, default 4096)
//   TRAINER_KILL_RANK  the rank that SIGKILLs itself at step TRAINER_KILL_STEP
//   TRAINER_KILL_STEP  in its first process only (before <out>.killed exists; the
//                      victim writes it): kill -9 in the middle of the job
// Output lines "lost: ... lost_ms=<PeerLostError after the kill>" and
// "reform: ... reconfigure_ms=<Reconfigure, wait included>" (and, with
// DDPRUN_DEBUG=sdk, Reconfigure's waited_ms/formed_ms line) are what
// bench/sdk_recovery.sh reads.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "ddp/ddp.h"

namespace {

std::string Env(const char* name, const char* fallback = "") {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

std::int64_t MonotonicNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// FNV-1a over the parameters' bytes.
std::uint64_t Digest(const std::vector<float>& p) {
  std::uint64_t h = 1469598103934665603ULL;
  const auto* b = reinterpret_cast<const unsigned char*>(p.data());
  for (std::size_t i = 0; i < p.size() * sizeof(float); ++i) h = (h ^ b[i]) * 1099511628211ULL;
  return h;
}

}  // namespace

int main() {
  const std::string out = Env("TRAINER_OUT");
  if (out.empty()) {
    std::fprintf(stderr, "inplace_trainer: set TRAINER_OUT\n");
    return 2;
  }
  const std::int64_t steps = std::stoll(Env("TRAINER_STEPS", "200"));
  const std::size_t count = std::stoul(Env("TRAINER_COUNT", "4096"));
  const int kill_rank = std::stoi(Env("TRAINER_KILL_RANK", "-1"));
  const std::int64_t kill_step = std::stoll(Env("TRAINER_KILL_STEP", "-1"));
  const std::string killed_file = out + ".killed";
  // The victim dies once: its replacement finds the file it wrote.
  const bool first_life = !std::ifstream(killed_file).good();
  try {
    auto pg = ddp::Init();
    const int start_rank = pg->rank();
    std::ofstream(out + "." + std::to_string(start_rank) + ".start", std::ios::app)
        << ::getpid() << "\n";
    std::vector<float> params(count, 0.0f);
    std::vector<float> grad(count);
    std::int64_t step = 0;
    auto restore = [&] {
      step = 0;
      std::fill(params.begin(), params.end(), 0.0f);
      if (auto snap = ddp::checkpoint::Load()) {
        const auto& w = snap->Get("params");
        std::memcpy(params.data(), w.data(), w.size());
        step = snap->step + 1;
      }
    };
    restore();
    int reforms = 0;
    std::string times;
    while (step < steps) {
      try {
        if (first_life && pg->rank() == kill_rank && step == kill_step) {
          std::ofstream(killed_file) << MonotonicNs() << "\n";
          ::kill(::getpid(), SIGKILL);
        }
        for (std::size_t i = 0; i < count; ++i) {
          grad[i] = static_cast<float>((pg->rank() + 1) * (step % 7 + 1) + i % 5);
        }
        pg->Allreduce(std::span<float>(grad)).Wait();
        for (std::size_t i = 0; i < count; ++i) params[i] -= grad[i] * 0.0625f;
        ddp::checkpoint::Save(step, {{"params", params.data(), params.size() * sizeof(float)}});
        ++step;
      } catch (const ddp::PeerLostError& e) {
        const std::int64_t lost_at = MonotonicNs();
        std::int64_t killed = 0;
        std::ifstream(killed_file) >> killed;
        // Printed before Reconfigure: under --restart_policy=job it throws.
        std::printf("lost: rank=%d lost_rank=%d lost_ms=%.2f\n", pg->rank(), e.rank(),
                    killed ? (lost_at - killed) / 1e6 : -1.0);
        std::fflush(stdout);
        std::fprintf(stderr, "inplace_trainer rank %d: %s; re-forming\n", pg->rank(), e.what());
        const std::int64_t t0 = MonotonicNs();
        pg = ddp::Reconfigure(std::move(pg));
        const std::int64_t t1 = MonotonicNs();
        restore();
        ++reforms;
        char line[160];
        std::snprintf(line, sizeof line, "reform: rank=%d reconfigure_ms=%.2f round=%lld",
                      pg->rank(), (t1 - t0) / 1e6, static_cast<long long>(pg->info().round));
        std::printf("%s\n", line);
        std::fflush(stdout);
        times += std::string(line) + "\n";
      }
    }
    std::ofstream(out + "." + std::to_string(pg->rank()))
        << "pid=" << ::getpid() << "\nreforms=" << reforms << "\n"
        << times << "digest=" << Digest(params) << "\n";
    return 0;
  } catch (const ddp::Error& e) {
    std::fprintf(stderr, "inplace_trainer: %s\n", e.what());
    return 1;
  }
}
