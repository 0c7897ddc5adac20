/* The worker SDK's C API (ddp/c_api.h) from a C program, as a C trainer uses
 * it. tests/sdk/sdk_api_test.cc runs it under the real ddprun:
 *
 *   build/bin/ddprun --nproc_per_node=2 --no_python build/bin/c_api_worker
 *   build/bin/c_api_worker --outside        (without ddprun: ddp_init refuses)
 *
 * Every rank issues the same calls in the same order. A failed check prints
 * "rank R: FAIL <file>:<line>: <what>" and the program goes on (the ranks stay
 * in step); it exits 1 at the end, or prints "rank R: all C API checks
 * passed" and exits 0. Compiled as C (C11), not C++. */
#define _POSIX_C_SOURCE 200809L /* unsetenv */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp/c_api.h"

static int g_rank = -1;
static int g_failures = 0;

#define CHECK(cond, ...)                                                        \
  do {                                                                          \
    if (!(cond)) {                                                              \
      ++g_failures;                                                             \
      printf("rank %d: FAIL %s:%d: %s: ", g_rank, __FILE__, __LINE__, #cond);   \
      printf(__VA_ARGS__);                                                      \
      printf("\n");                                                             \
      fflush(stdout);                                                           \
    }                                                                           \
  } while (0)

/* A call that must succeed; on failure the status and ddp_last_error(). */
#define OK(call)                                                                       \
  do {                                                                                 \
    ddp_status_t s_ = (call);                                                          \
    CHECK(s_ == DDP_OK, "%s (%d): %s", ddp_status_name(s_), (int)s_, ddp_last_error()); \
  } while (0)

/* A call that must fail with `code` and a ddp_last_error() containing `text`. */
#define FAILS(call, code, text)                                                           \
  do {                                                                                    \
    ddp_status_t s_ = (call);                                                             \
    CHECK(s_ == (code), "returned %s (%d), want %s; last error: %s", ddp_status_name(s_), \
          (int)s_, ddp_status_name(code), ddp_last_error());                              \
    CHECK(strstr(ddp_last_error(), (text)) != NULL, "last error %s lacks \"%s\"",         \
          ddp_last_error(), (text));                                                      \
  } while (0)

static int EnvInt(const char* name) {
  const char* v = getenv(name);
  return v ? atoi(v) : -1;
}

/* Small integers as IEEE half / bfloat16 bits (exact; no rounding needed). */
static uint16_t HalfOf(int v) {
  if (v == 0) return 0;
  float f = (float)v;
  uint32_t b;
  memcpy(&b, &f, 4);
  const uint32_t sign = (b >> 16) & 0x8000u;
  const int exp = (int)((b >> 23) & 0xff) - 127 + 15;
  return (uint16_t)(sign | ((uint32_t)exp << 10) | ((b >> 13) & 0x3ffu));
}
static uint16_t BFloatOf(int v) {
  float f = (float)v;
  uint32_t b;
  memcpy(&b, &f, 4);
  return (uint16_t)(b >> 16);
}

static void Outside(void) {
  const char* vars[] = {"DDPRUN_STORE_ADDR", "DDPRUN_JOB_ID", "DDPRUN_ROUND", "DDPRUN_TOKEN",
                        "DDPRUN_HOST", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; ++i) unsetenv(vars[i]);
  ddp_group_t* g = (ddp_group_t*)&g; /* must be reset to NULL */
  FAILS(ddp_init(NULL, &g), DDP_ERR_INVALID_ARGUMENT, "DDPRUN_STORE_ADDR is not set");
  CHECK(g == NULL, "ddp_init left *out set on failure");
  CHECK(strstr(ddp_last_error(), "ddprun --nproc_per_node=") != NULL,
        "no ddprun command line in: %s", ddp_last_error());
  printf("ddp_init outside ddprun: %s: %s\n", ddp_status_name(DDP_ERR_INVALID_ARGUMENT),
         ddp_last_error());
}

static void Collectives(ddp_group_t* g, int rank, int world) {
  /* allreduce: every op on f32, sums of the other dtypes, blocking and async. */
  float f[5];
  const int ops[] = {DDP_SUM, DDP_AVG, DDP_MAX, DDP_MIN};
  for (int k = 0; k < 4; ++k) {
    for (int i = 0; i < 5; ++i) f[i] = (float)((rank + 1) * (i + 1));
    OK(ddp_allreduce(g, f, 5, DDP_FLOAT32, ops[k], NULL));
    for (int i = 0; i < 5; ++i) {
      const double s = (i + 1) * world * (world + 1) / 2.0;
      const double want = k == 0 ? s : k == 1 ? s / world : k == 2 ? (i + 1) * world : (i + 1);
      CHECK(fabs(f[i] - want) <= 1e-6 * want, "f32 op %d element %d: %g, want %g", ops[k], i,
            f[i], want);
    }
  }
  double d[1001];
  int32_t i32[7];
  int64_t i64[3];
  uint16_t h[4], bf[4];
  for (int i = 0; i < 1001; ++i) d[i] = rank * 0.5 + i;
  for (int i = 0; i < 7; ++i) i32[i] = -(rank + 1) * i;
  for (int i = 0; i < 3; ++i) i64[i] = ((int64_t)1 << 40) * (rank + 1) + i;
  for (int i = 0; i < 4; ++i) h[i] = HalfOf(rank + 1 + i), bf[i] = BFloatOf(rank + 1 + i);
  ddp_work_t *w1 = NULL, *w2 = NULL, *w3 = NULL, *w4 = NULL, *w5 = NULL;
  OK(ddp_allreduce(g, d, 1001, DDP_FLOAT64, DDP_SUM, &w1));
  OK(ddp_allreduce(g, i32, 7, DDP_INT32, DDP_MIN, &w2));
  OK(ddp_allreduce(g, i64, 3, DDP_INT64, DDP_SUM, &w3));
  OK(ddp_allreduce(g, h, 4, DDP_FLOAT16, DDP_SUM, &w4));
  OK(ddp_allreduce(g, bf, 4, DDP_BFLOAT16, DDP_MAX, &w5));
  CHECK(w1 && w2 && w3 && w4 && w5, "an async call gave no work handle");
  /* ddp_work_test polls without freeing; a null out-pointer is refused. */
  if (w5) {
    int done = 0;
    for (int spin = 0; spin < 1000000 && !done; ++spin) OK(ddp_work_test(w5, &done));
    CHECK(done == 1, "ddp_work_test never reported the collective done");
    FAILS(ddp_work_test(w5, NULL), DDP_ERR_INVALID_ARGUMENT, "done is a null pointer");
  }
  /* ddp_work_wait frees the handle; wait in reverse issue order. */
  if (w5) OK(ddp_work_wait(w5, 30.0));
  if (w4) OK(ddp_work_wait(w4, 0));
  if (w3) OK(ddp_work_wait(w3, 30.0));
  if (w2) OK(ddp_work_wait(w2, 30.0));
  if (w1) OK(ddp_work_wait(w1, 30.0));
  for (int i = 0; i < 1001; ++i) {
    const double want = 0.5 * world * (world - 1) / 2.0 + (double)i * world;
    if (d[i] != want) {
      CHECK(d[i] == want, "f64 sum element %d: %g, want %g", i, d[i], want);
      break;
    }
  }
  for (int i = 0; i < 7; ++i) CHECK(i32[i] == -world * i, "i32 min %d: %d", i, (int)i32[i]);
  for (int i = 0; i < 3; ++i) {
    const int64_t want = ((int64_t)1 << 40) * world * (world + 1) / 2 + (int64_t)i * world;
    CHECK(i64[i] == want, "i64 sum %d: %lld, want %lld", i, (long long)i64[i], (long long)want);
  }
  for (int i = 0; i < 4; ++i) {
    CHECK(h[i] == HalfOf(world * (world + 1) / 2 + world * i), "f16 sum %d: 0x%04x", i, h[i]);
    CHECK(bf[i] == BFloatOf(world + i), "bf16 max %d: 0x%04x", i, bf[i]);
  }
  /* Zero elements at a null pointer are fine. */
  OK(ddp_allreduce(g, NULL, 0, DDP_FLOAT32, DDP_SUM, NULL));

  /* broadcast from every root */
  for (int root = 0; root < world; ++root) {
    for (int i = 0; i < 1001; ++i) d[i] = rank * 1000.0 + i;
    OK(ddp_broadcast(g, d, 1001, DDP_FLOAT64, root, NULL));
    CHECK(d[0] == root * 1000.0 && d[1000] == root * 1000.0 + 1000,
          "broadcast from %d: %g .. %g", root, d[0], d[1000]);
  }

  /* allgather: rank-major */
  int32_t gin[5], gout[5 * 16];
  for (int i = 0; i < 5; ++i) gin[i] = rank * 100 + i;
  ddp_work_t* w = NULL;
  OK(ddp_allgather(g, gin, gout, 5, DDP_INT32, &w));
  if (w) OK(ddp_work_wait(w, 30.0));
  for (int r = 0; r < world; ++r)
    for (int i = 0; i < 5; ++i)
      CHECK(gout[r * 5 + i] == r * 100 + i, "allgather [%d]: %d", r * 5 + i, (int)gout[r * 5 + i]);

  /* reduce_scatter: this rank's block of the sum */
  float rin[4 * 16], rout[4];
  for (int i = 0; i < 4 * world; ++i) rin[i] = (float)(i + rank);
  OK(ddp_reduce_scatter(g, rin, rout, 4, DDP_FLOAT32, DDP_SUM, NULL));
  for (int i = 0; i < 4; ++i) {
    const float want = (float)((rank * 4 + i) * world + world * (world - 1) / 2);
    CHECK(rout[i] == want, "reduce_scatter [%d]: %g, want %g", i, rout[i], want);
  }

  /* ddp_alloc_memory: zero-filled; a large all-reduce of it (the shared
   * memory path's direct fold on one host) sums exactly, twice in a row. */
  {
    const size_t n = 300007; /* above the one-barrier size at any world size */
    float* m = NULL;
    OK(ddp_alloc_memory(g, n * sizeof(float), (void**)&m));
    CHECK(m != NULL, "ddp_alloc_memory gave NULL");
    if (m != NULL) {
      CHECK(m[0] == 0.0f && m[n - 1] == 0.0f, "ddp_alloc_memory: not zero-filled");
      for (int rep = 0; rep < 2; ++rep) {
        for (size_t i = 0; i < n; ++i) m[i] = (float)((rank + 1) * (int)(i % 7) + rep);
        OK(ddp_allreduce(g, m, n, DDP_FLOAT32, DDP_SUM, NULL));
        int bad = 0;
        for (size_t i = 0; i < n; ++i) {
          const float want = (float)((i % 7) * world * (world + 1) / 2 + rep * world);
          bad += m[i] != want;
        }
        CHECK(bad == 0, "allreduce of ddp_alloc_memory memory: %d wrong element(s)", bad);
      }
      OK(ddp_free_memory(g, m));
    }
    FAILS(ddp_alloc_memory(g, 16, NULL), DDP_ERR_INVALID_ARGUMENT, "null");
    FAILS(ddp_alloc_memory(NULL, 16, (void**)&m), DDP_ERR_INVALID_ARGUMENT, "null");
    OK(ddp_free_memory(g, NULL));
  }
  /* barrier: blocking, async, and an async one freed without waiting */
  OK(ddp_barrier(g, NULL));
  w = NULL;
  OK(ddp_barrier(g, &w));
  if (w) OK(ddp_work_wait(w, 30.0));
  w = NULL;
  OK(ddp_barrier(g, &w));
  ddp_work_free(w);
  OK(ddp_barrier(g, NULL));
}

enum { kGrads = 4 };
static const size_t kSizes[kGrads] = {3000, 7, 20000, 1};

static void ReducerChecks(ddp_group_t* g, int rank, int world) {
  /* Bucketed mean of f32 gradients (small caps: several buckets) against a
   * plain allreduce; one f64 gradient in its own bucket. */
  float* grads[kGrads];
  float* plain[kGrads];
  for (int k = 0; k < kGrads; ++k) {
    grads[k] = malloc(kSizes[k] * sizeof(float));
    plain[k] = malloc(kSizes[k] * sizeof(float));
  }
  double g64[10];
  ddp_reducer_options_t ro;
  memset(&ro, 0, sizeof ro);
  ro.bucket_cap_bytes = 16 * 1024;
  ro.first_bucket_bytes = 4 * 1024;
  ddp_reducer_t* r = NULL;
  OK(ddp_reducer_create(g, &ro, &r));
  for (int k = 0; k < kGrads; ++k) {
    size_t idx = 99;
    OK(ddp_reducer_register(r, grads[k], kSizes[k], DDP_FLOAT32, &idx));
    CHECK(idx == (size_t)k, "register returned index %zu, want %d", idx, k);
  }
  OK(ddp_reducer_register(r, g64, 10, DDP_FLOAT64, NULL));
  for (int step = 0; step < 2; ++step) {
    for (int k = 0; k < kGrads; ++k)
      for (size_t i = 0; i < kSizes[k]; ++i)
        grads[k][i] = plain[k][i] = (float)((rank + 1) * (int)(i % 97) + step * 3 + k);
    for (int i = 0; i < 10; ++i) g64[i] = rank * 4.0 + i;
    OK(ddp_reducer_mark_ready(r, kGrads));
    for (int k = kGrads - 1; k >= 0; --k) OK(ddp_reducer_mark_ready(r, (size_t)k));
    OK(ddp_reducer_finish(r));
    for (int k = 0; k < kGrads; ++k) {
      OK(ddp_allreduce(g, plain[k], kSizes[k], DDP_FLOAT32, DDP_AVG, NULL));
      size_t bad = 0;
      for (size_t i = 0; i < kSizes[k]; ++i)
        if (fabsf(grads[k][i] - plain[k][i]) > 1e-6f * fabsf(plain[k][i])) ++bad;
      CHECK(bad == 0, "step %d gradient %d: %zu elements differ from the allreduce", step, k, bad);
    }
    CHECK(g64[9] == 2.0 * (world - 1) + 9, "f64 gradient mean: %g", g64[9]);
  }
  CHECK(ddp_reducer_num_buckets(r) >= 3, "%zu buckets, want >= 3",
        ddp_reducer_num_buckets(r));
  /* Misuse: a gradient marked twice, register after the first step, a bad index. */
  OK(ddp_reducer_mark_ready(r, 0));
  FAILS(ddp_reducer_mark_ready(r, 0), DDP_ERR_INVALID_ARGUMENT, "twice");
  OK(ddp_reducer_finish(r));
  float extra[4];
  FAILS(ddp_reducer_register(r, extra, 4, DDP_FLOAT32, NULL), DDP_ERR_STATE, "");
  FAILS(ddp_reducer_mark_ready(r, 99), DDP_ERR_INVALID_ARGUMENT, "");
  ddp_reducer_destroy(r);

  /* No sync (gradient accumulation), then a synced step of the sum; plain sum. */
  memset(&ro, 0, sizeof ro);
  ro.no_average = 1;
  r = NULL;
  OK(ddp_reducer_create(g, &ro, &r));
  float acc[100] = {0};
  OK(ddp_reducer_register(r, acc, 100, DDP_FLOAT32, NULL));
  OK(ddp_reducer_set_require_sync(r, 0));
  for (int i = 0; i < 100; ++i) acc[i] += (float)(rank + 1);
  OK(ddp_reducer_mark_ready(r, 0));
  OK(ddp_reducer_finish(r));
  CHECK(acc[0] == (float)(rank + 1), "no sync: %g, want the local %d", acc[0], rank + 1);
  OK(ddp_reducer_set_require_sync(r, 1));
  for (int i = 0; i < 100; ++i) acc[i] += 1.0f;
  OK(ddp_reducer_mark_ready(r, 0));
  OK(ddp_reducer_finish(r));
  const float want_sum = (float)(world * (world + 1) / 2 + world);
  CHECK(acc[0] == want_sum && acc[99] == want_sum, "sync after no sync: %g, want %g", acc[0],
        want_sum);
  ddp_reducer_destroy(r);

  /* gradient_as_bucket_view: write into ddp_reducer_gradient_buffer. */
  memset(&ro, 0, sizeof ro);
  ro.gradient_as_bucket_view = 1;
  r = NULL;
  OK(ddp_reducer_create(g, &ro, &r));
  float vg[50];
  OK(ddp_reducer_register(r, vg, 50, DDP_FLOAT32, NULL));
  void* view = NULL;
  OK(ddp_reducer_gradient_buffer(r, 0, &view));
  CHECK(view != NULL && view != (void*)vg, "the bucket view is %p (gradient %p)", view,
        (void*)vg);
  if (view) {
    float* v = view;
    for (int i = 0; i < 50; ++i) v[i] = (float)(rank * 2);
    OK(ddp_reducer_mark_ready(r, 0));
    OK(ddp_reducer_finish(r));
    CHECK(v[0] == (float)(world - 1) && v[49] == (float)(world - 1), "bucket view mean: %g",
          v[0]);
  }
  FAILS(ddp_reducer_gradient_buffer(r, 0, NULL), DDP_ERR_INVALID_ARGUMENT, "null");
  ddp_reducer_destroy(r);

  /* fp16 compression: small integers/4 survive the round trip exactly. */
  memset(&ro, 0, sizeof ro);
  ro.compression = DDP_COMPRESS_FP16;
  r = NULL;
  OK(ddp_reducer_create(g, &ro, &r));
  float cg[64];
  for (int i = 0; i < 64; ++i) cg[i] = (float)(rank + i % 8) * 0.25f;
  OK(ddp_reducer_register(r, cg, 64, DDP_FLOAT32, NULL));
  double cf64[2];
  FAILS(ddp_reducer_register(r, cf64, 2, DDP_FLOAT64, NULL), DDP_ERR_INVALID_ARGUMENT,
        "f32 gradients only");
  OK(ddp_reducer_mark_ready(r, 0));
  OK(ddp_reducer_finish(r));
  for (int i = 0; i < 64; ++i) {
    const double want = ((world - 1) / 2.0 + i % 8) * 0.25;
    CHECK(fabs(cg[i] - want) <= 1e-3 * (1 + fabs(want)), "fp16 compressed mean %d: %g, want %g",
          i, cg[i], want);
  }
  ddp_reducer_destroy(r);
  memset(&ro, 0, sizeof ro);
  ro.compression = 7;
  r = (ddp_reducer_t*)&r;
  FAILS(ddp_reducer_create(g, &ro, &r), DDP_ERR_INVALID_ARGUMENT, "compression");

  /* Initial parameter sync from the last rank. */
  float p1[1000];
  double p2[33];
  int64_t p3[5];
  for (int i = 0; i < 1000; ++i) p1[i] = (float)(rank + 1);
  for (int i = 0; i < 33; ++i) p2[i] = rank * 2.5;
  for (int i = 0; i < 5; ++i) p3[i] = rank - 7;
  void* const data[3] = {p1, p2, p3};
  const size_t counts[3] = {1000, 33, 5};
  const int dtypes[3] = {DDP_FLOAT32, DDP_FLOAT64, DDP_INT64};
  OK(ddp_broadcast_parameters(g, data, counts, dtypes, 3, world - 1));
  CHECK(p1[999] == (float)world && p2[32] == (world - 1) * 2.5 && p3[4] == world - 1 - 7,
        "broadcast_parameters: %g %g %lld", p1[999], p2[32], (long long)p3[4]);
  const int bad_dtypes[3] = {DDP_FLOAT32, 17, DDP_INT64};
  FAILS(ddp_broadcast_parameters(g, data, counts, bad_dtypes, 3, 0), DDP_ERR_INVALID_ARGUMENT,
        "invalid dtype 17");
  FAILS(ddp_broadcast_parameters(g, NULL, counts, dtypes, 3, 0), DDP_ERR_INVALID_ARGUMENT,
        "null");

  for (int k = 0; k < kGrads; ++k) free(grads[k]), free(plain[k]);
}

static void BadInput(ddp_group_t* g, int world) {
  float x[4] = {1, 1, 1, 1};
  FAILS(ddp_allreduce(NULL, x, 4, DDP_FLOAT32, DDP_SUM, NULL), DDP_ERR_INVALID_ARGUMENT, "null");
  FAILS(ddp_allreduce(g, NULL, 4, DDP_FLOAT32, DDP_SUM, NULL), DDP_ERR_INVALID_ARGUMENT, "");
  FAILS(ddp_allreduce(g, x, 4, 42, DDP_SUM, NULL), DDP_ERR_INVALID_ARGUMENT, "invalid dtype 42");
  FAILS(ddp_allreduce(g, x, 4, -1, DDP_SUM, NULL), DDP_ERR_INVALID_ARGUMENT, "invalid dtype -1");
  FAILS(ddp_allreduce(g, x, 4, DDP_FLOAT32, 9, NULL), DDP_ERR_INVALID_ARGUMENT,
        "invalid reduce op 9");
  FAILS(ddp_broadcast(g, x, 4, DDP_FLOAT32, world, NULL), DDP_ERR_INVALID_ARGUMENT, "not a rank");
  FAILS(ddp_broadcast(g, x, 4, DDP_FLOAT32, -1, NULL), DDP_ERR_INVALID_ARGUMENT, "");
  FAILS(ddp_broadcast(NULL, x, 4, DDP_FLOAT32, 0, NULL), DDP_ERR_INVALID_ARGUMENT, "null");
  FAILS(ddp_allgather(g, x, NULL, 1, DDP_FLOAT32, NULL), DDP_ERR_INVALID_ARGUMENT, "");
  FAILS(ddp_allgather(g, x, x, 1, 6, NULL), DDP_ERR_INVALID_ARGUMENT, "invalid dtype 6");
  FAILS(ddp_reduce_scatter(g, NULL, x, 1, DDP_FLOAT32, DDP_SUM, NULL), DDP_ERR_INVALID_ARGUMENT,
        "");
  FAILS(ddp_barrier(NULL, NULL), DDP_ERR_INVALID_ARGUMENT, "null");
  FAILS(ddp_work_wait(NULL, 1.0), DDP_ERR_INVALID_ARGUMENT, "null");
  FAILS(ddp_reducer_create(NULL, NULL, NULL), DDP_ERR_INVALID_ARGUMENT, "null");
  FAILS(ddp_reducer_finish(NULL), DDP_ERR_INVALID_ARGUMENT, "null");
  FAILS(ddp_abort(NULL, "x"), DDP_ERR_INVALID_ARGUMENT, "null");
  FAILS(ddp_init(NULL, NULL), DDP_ERR_INVALID_ARGUMENT, "null");
  ddp_init_options_t o;
  memset(&o, 0, sizeof o);
  o.backend = 3;
  ddp_group_t* none = NULL;
  FAILS(ddp_init(&o, &none), DDP_ERR_INVALID_ARGUMENT, "invalid backend");
  o.backend = DDP_BACKEND_GLOO;
  o.timeout_sec = -1;
  FAILS(ddp_init(&o, &none), DDP_ERR_INVALID_ARGUMENT, "timeout_sec is negative");
  CHECK(none == NULL, "ddp_init set *out on failure");
  /* Accessors of a null handle, destroying null handles. */
  CHECK(ddp_rank(NULL) == -1 && ddp_world_size(NULL) == -1 && ddp_round(NULL) == -1,
        "accessors of a null group");
  ddp_group_destroy(NULL);
  ddp_reducer_destroy(NULL);
  ddp_work_free(NULL);
  CHECK(strcmp(ddp_status_name(DDP_ERR_STATE), "state") == 0, "%s", ddp_status_name(DDP_ERR_STATE));
  CHECK(strcmp(ddp_status_name(DDP_OK), "ok") == 0, "%s", ddp_status_name(DDP_OK));
  /* Nothing was sent: the group still works, and success clears the message. */
  OK(ddp_allreduce(g, x, 4, DDP_FLOAT32, DDP_SUM, NULL));
  CHECK(x[0] == (float)world, "allreduce after the bad calls: %g", x[0]);
  CHECK(ddp_last_error()[0] == '\0', "last error after a success: %s", ddp_last_error());
}

static void AbortChecks(ddp_group_t* g, int world) {
  /* A second group (explicit options), aborted: every later call is
   * DDP_ERR_STATE naming the reason; the first group goes on. */
  ddp_init_options_t o;
  memset(&o, 0, sizeof o);
  o.backend = DDP_BACKEND_GLOO;
  o.timeout_sec = 30;
  ddp_group_t* g2 = NULL;
  OK(ddp_init(&o, &g2));
  if (!g2) return;
  CHECK(ddp_backend(g2) == DDP_BACKEND_GLOO, "backend %d", ddp_backend(g2));
  int32_t v = 1;
  OK(ddp_allreduce(g2, &v, 1, DDP_INT32, DDP_SUM, NULL));
  CHECK(v == world, "second group's allreduce: %d", (int)v);
  ddp_reducer_t* r = NULL;
  OK(ddp_reducer_create(g2, NULL, &r));
  float gr[8] = {0};
  OK(ddp_reducer_register(r, gr, 8, DDP_FLOAT32, NULL));
  /* Every rank is past g2's allreduce before any aborts g2 (on the shared
   * memory path a rank still leaving a finished collective fails it when a
   * faster peer aborts right after). */
  OK(ddp_barrier(g, NULL));
  OK(ddp_abort(g2, "c_api_worker abort"));
  FAILS(ddp_allreduce(g2, &v, 1, DDP_INT32, DDP_SUM, NULL), DDP_ERR_STATE, "c_api_worker abort");
  ddp_work_t* w = NULL;
  FAILS(ddp_barrier(g2, &w), DDP_ERR_STATE, "c_api_worker abort");
  CHECK(w == NULL, "a work handle from a refused call");
  FAILS(ddp_broadcast(g2, &v, 1, DDP_INT32, 0, NULL), DDP_ERR_STATE, "");
  ddp_status_t s = ddp_reducer_mark_ready(r, 0);
  if (s == DDP_OK) s = ddp_reducer_finish(r);
  CHECK(s == DDP_ERR_STATE, "a reducer step on an aborted group: %s: %s", ddp_status_name(s),
        ddp_last_error());
  ddp_reducer_destroy(r);
  /* Re-forming in place needs --restart_policy=inplace; the handle keeps its group. */
  FAILS(ddp_reconfigure(g2, NULL), DDP_ERR_STATE, "--restart_policy=inplace");
  CHECK(ddp_rank(g2) == ddp_rank(g), "the handle lost its group after a refused reconfigure");
  CHECK(strcmp(ddp_status_name(DDP_ERR_PEER_LOST), "peer lost") == 0, "%s",
        ddp_status_name(DDP_ERR_PEER_LOST));
  ddp_group_destroy(g2);
  OK(ddp_barrier(g, NULL)); /* the first group is untouched */
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  CHECK(ddp_abi_version() == DDP_ABI_VERSION, "ABI %d", ddp_abi_version());
  if (argc > 1 && strcmp(argv[1], "--outside") == 0) {
    Outside();
    if (g_failures) return 1;
    printf("outside ddprun: all C API checks passed\n");
    return 0;
  }
  g_rank = EnvInt("RANK");
  ddp_group_t* g = NULL;
  const ddp_status_t s = ddp_init(NULL, &g);
  if (s != DDP_OK || g == NULL) {
    printf("rank %d: FAIL ddp_init: %s: %s\n", g_rank, ddp_status_name(s), ddp_last_error());
    return 1;
  }
  const int rank = ddp_rank(g), world = ddp_world_size(g);
  CHECK(rank == g_rank && world == EnvInt("WORLD_SIZE"), "rank %d of %d", rank, world);
  CHECK(ddp_local_rank(g) == EnvInt("LOCAL_RANK"), "local rank %d", ddp_local_rank(g));
  CHECK(ddp_round(g) == EnvInt("DDPRUN_ROUND"), "round %lld", (long long)ddp_round(g));
  CHECK(ddp_backend(g) == DDP_BACKEND_GLOO, "backend %d (no GPU: Gloo)", ddp_backend(g));
  CHECK(world <= 16, "the buffers here hold 16 ranks");
  Collectives(g, rank, world);
  ReducerChecks(g, rank, world);
  BadInput(g, world);
  AbortChecks(g, world);
  OK(ddp_barrier(g, NULL));
  ddp_group_destroy(g);
  if (g_failures) {
    printf("rank %d: %d check(s) failed\n", rank, g_failures);
    return 1;
  }
  printf("rank %d: all C API checks passed\n", rank);
  return 0;
}
