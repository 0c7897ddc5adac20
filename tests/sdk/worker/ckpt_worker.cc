// A C++ trainer of ddp::checkpoint (ddp/checkpoint.h) for
// tests/sdk/checkpoint_sdk_test.cc, run under ddprun:
//   ckpt_worker train OUT STEPS KILL_AT  a synchronous "training" (an
//       all-reduced update of weights and momentum) that saves every step;
//       rank 1 kills itself (SIGKILL) in step KILL_AT, after its all-reduce,
//       on the first attempt. Each rank logs "resumed S D", "saved S D", "final D"
//       (D: FNV-1a of the state) to OUT/rank<r>.attempt<a>.txt.
//   ckpt_worker bad      prints "ERROR <case>: <message>" for each bad input.
//   ckpt_worker save     saves kInterop (step 7) for Python to load.
//   ckpt_worker load     loads what tests' Python saved (step 8), checks it.
#include <signal.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "ddp/checkpoint.h"
#include "ddp/ddp.h"

namespace {

namespace ckpt = ddp::checkpoint;

std::string Digest(const std::vector<const std::vector<float>*>& parts) {
  std::uint64_t h = 1469598103934665603ull;
  for (const auto* v : parts) {
    const auto* p = reinterpret_cast<const unsigned char*>(v->data());
    for (std::size_t i = 0; i < v->size() * sizeof(float); ++i) h = (h ^ p[i]) * 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::vector<float> FromBuffer(const ckpt::Buffer& b) {
  std::vector<float> v(b.size() / sizeof(float));
  std::memcpy(v.data(), b.data(), v.size() * sizeof(float));
  return v;
}

int Train(const std::string& out, int steps, int kill_at) {
  auto pg = ddp::Init();
  const int rank = pg->rank();
  const std::string attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
  std::ofstream log(out + "/rank" + std::to_string(rank) + ".attempt" + attempt + ".txt");
  constexpr std::size_t kN = 4096;
  std::vector<float> weights(kN, 0.5f), momentum(kN, 0.0f), grad(kN);
  std::int64_t start = 0;
  if (auto snap = ckpt::Load()) {
    weights = FromBuffer(snap->Get("weights"));
    momentum = FromBuffer(snap->Get("momentum"));
    std::int64_t saved_step = -1;
    std::memcpy(&saved_step, snap->Get("step").data(), sizeof saved_step);
    if (saved_step != snap->step || weights.size() != kN) return 2;
    start = snap->step + 1;
    log << "resumed " << snap->step << " " << Digest({&weights, &momentum}) << std::endl;
  }
  for (std::int64_t step = start; step < steps; ++step) {
    for (std::size_t i = 0; i < kN; ++i) {
      grad[i] = static_cast<float>((i * 7 + step * 13 + rank * 29) % 101) / 101.0f - weights[i];
    }
    pg->Allreduce(grad.data(), kN, ddp::DType::kFloat32, ddp::ReduceOp::kAvg).Wait();
    // After the all-reduce: the other rank has left its save of the
    // previous step to enter it, so that step is committed on both ranks.
    if (step == kill_at && rank == 1 && attempt == "0") ::raise(SIGKILL);
    for (std::size_t i = 0; i < kN; ++i) {
      momentum[i] = 0.9f * momentum[i] + grad[i];
      weights[i] += 0.05f * momentum[i];
    }
    ckpt::Save(step, {{"weights", weights.data(), kN * sizeof(float)},
                      {"momentum", momentum.data(), kN * sizeof(float)},
                      {"step", &step, sizeof step}});
    log << "saved " << step << " " << Digest({&weights, &momentum}) << std::endl;
  }
  log << "final " << Digest({&weights, &momentum}) << std::endl;
  return 0;
}

template <class Fn>
void Expect(const char* what, Fn&& fn) {
  try {
    fn();
    std::printf("NO ERROR %s\n", what);
  } catch (const ddp::Error& e) {
    std::printf("ERROR %s (%s): %s\n", what, ddp::ErrorCodeName(e.code()), e.what());
  }
  std::fflush(stdout);
}

int Bad() {
  const bool fresh = !ckpt::Load().has_value();
  std::printf("fresh start: %s\n", fresh ? "yes" : "no");
  std::vector<char> big(2 << 20);  // 2 MiB > the test's 1 MiB limit
  char x = 1;
  Expect("limit", [&] { ckpt::Save(1, {{"big", big.data(), big.size()}}); });
  Expect("empty", [&] { ckpt::Save(1, {{"", &x, 1}}); });
  Expect("duplicate", [&] { ckpt::Save(1, {{"a", &x, 1}, {"a", &x, 1}}); });
  Expect("null", [&] { ckpt::Save(1, {{"a", nullptr, 4}}); });
  // None of them wrote anything: still a fresh start after a restart.
  ckpt::Save(2, {{"ok", &x, 1}});
  std::printf("saved 2\n");
  return 0;
}

// The interop state: names and bytes the Python side checks (test file).
std::vector<unsigned char> Alpha() {
  std::vector<unsigned char> v(1000);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<unsigned char>(i % 251);
  return v;
}

int SaveForPython() {
  const std::vector<unsigned char> alpha = Alpha();
  const char one = 1;
  ckpt::Save(
      7, {{"alpha", alpha.data(), alpha.size()}, {"empty", nullptr, 0}, {"n\xc3\xbc", &one, 1}});
  std::printf("C++ saved 7\n");
  std::fflush(stdout);
  return 3;  // a failure: the agent restarts the worker
}

int LoadFromPython() {
  auto snap = ckpt::Load();
  if (!snap || snap->step != 8) {
    std::printf("FAIL: expected step 8\n");
    return 1;
  }
  // Python saved {"raw": bytes(range(200)), "arr": np.arange(10, dtype=float32), ...}.
  const ckpt::Buffer& raw = snap->Get("raw");
  bool ok = raw.size() == 200;
  for (std::size_t i = 0; ok && i < 200; ++i) ok = static_cast<unsigned char>(raw.bytes[i]) == i;
  std::vector<float> want(10);
  for (int i = 0; i < 10; ++i) want[i] = static_cast<float>(i);
  const ckpt::Buffer& arr = snap->Get("arr");
  ok = ok && arr.size() == 40 && std::memcmp(arr.data(), want.data(), 40) == 0;
  if (const ckpt::Buffer* t = snap->Find("tensor")) {
    std::vector<std::int64_t> tw = {0, 1, 2, 3, 4, 5};
    ok = ok && t->size() == 48 && std::memcmp(t->data(), tw.data(), 48) == 0;
    std::printf("tensor checked\n");
  }
  std::printf(ok ? "C++ LOADED PYTHON OK\n" : "FAIL: bytes differ\n");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "train" && argc == 5) return Train(argv[2], std::atoi(argv[3]), std::atoi(argv[4]));
    if (mode == "bad") return Bad();
    if (mode == "save") return SaveForPython();
    if (mode == "load") return LoadFromPython();
  } catch (const ddp::Error& e) {
    std::fprintf(stderr, "ckpt_worker: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "usage: ckpt_worker train OUT STEPS KILL_AT | bad | save | load\n");
  return 64;
}
