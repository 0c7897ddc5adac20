// What a CUDA timing event costs, against an event without timing, on an
// idle stream: the host's cudaEventRecord, the time from a record until
// cudaEventQuery sees it done, and how late a plain event recorded right
// after a timing event is seen done. The NCCL backend samples collective
// durations because of these figures (worker_sdk/src/duration_sampler.h,
// docs/gpu.md). Prints "SKIPPED: no CUDA device" and exits 0 without a GPU.
//
//   cuda_event_cost [calls]     (default 20000 per figure)
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace {

using Clock = std::chrono::steady_clock;

double UsPerCall(Clock::time_point t0, int n) {
  return std::chrono::duration<double>(Clock::now() - t0).count() / n * 1e6;
}

void Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "cuda_event_cost: %s: %s\n", what, cudaGetErrorString(e));
  std::exit(1);
}

void WaitDone(cudaEvent_t e) {
  cudaError_t q;
  while ((q = cudaEventQuery(e)) == cudaErrorNotReady) {
  }
  Check(q, "cudaEventQuery");
}

struct Figures {
  double record_us, record_to_done_us;
};

Figures Measure(cudaStream_t s, unsigned flags, int n) {
  cudaEvent_t e;
  Check(cudaEventCreateWithFlags(&e, flags), "cudaEventCreateWithFlags");
  auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) cudaEventRecord(e, s);
  const double record = UsPerCall(t0, n);
  Check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    cudaEventRecord(e, s);
    WaitDone(e);
  }
  const double done = UsPerCall(t0, n);
  Check(cudaEventDestroy(e), "cudaEventDestroy");
  return {record, done};
}

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 20000;
  if (n <= 0) {
    std::fprintf(stderr, "usage: cuda_event_cost [calls > 0]\n");
    return 2;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no CUDA device\n");
    return 0;
  }
  cudaDeviceProp prop{};
  Check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  cudaStream_t s;
  Check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  Measure(s, cudaEventDefault, 1000);  // warm-up
  const Figures plain = Measure(s, cudaEventDisableTiming, n);
  const Figures timing = Measure(s, cudaEventDefault, n);

  // A plain event right after a timing event: when is the plain one seen done?
  cudaEvent_t t, p;
  Check(cudaEventCreate(&t), "cudaEventCreate");
  Check(cudaEventCreateWithFlags(&p, cudaEventDisableTiming), "cudaEventCreate");
  auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    cudaEventRecord(t, s);
    cudaEventRecord(p, s);
    WaitDone(p);
  }
  const double after_timing = UsPerCall(t0, n);
  t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    cudaEventRecord(p, s);
    cudaEventRecord(t, s);
    WaitDone(p);
  }
  const double before_timing = UsPerCall(t0, n);
  Check(cudaStreamSynchronize(s), "cudaStreamSynchronize");

  std::printf("cuda_event_cost device=\"%s\" calls=%d\n", prop.name, n);
  std::printf("| figure (us per call) | without timing | with timing | ratio |\n|---|---|---|---|\n");
  std::printf("| cudaEventRecord (host) | %.2f | %.2f | %.1fx |\n", plain.record_us, timing.record_us,
              timing.record_us / plain.record_us);
  std::printf("| record until cudaEventQuery sees it done | %.2f | %.2f | %.1fx |\n",
              plain.record_to_done_us, timing.record_to_done_us,
              timing.record_to_done_us / plain.record_to_done_us);
  std::printf("| a plain event recorded after / before a timing event, until seen done | %.2f "
              "(before) | %.2f (after) | %.1fx |\n",
              before_timing, after_timing, after_timing / before_timing);
  return 0;
}
