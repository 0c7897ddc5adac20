/* ddp_checkpoint_* (ddp/c_api.h) from a C program, for
 * tests/sdk/checkpoint_sdk_test.cc, under ddprun --max_restarts=1:
 *
 *   ckpt_c_worker OUT STEPS KILL_AT
 *
 * A synchronous "training" (an all-reduced update of a weight vector) that
 * saves every step; rank 1 kills itself (SIGKILL) in step KILL_AT, after
 * its all-reduce, on the first attempt. Each rank writes "resumed S D", "saved S D"
 * and "final D" (D: FNV-1a of the weights) to OUT/rank<r>.attempt<a>.txt.
 * On the first attempt, rank 0 also prints "ERROR <case>: <status>: <message>"
 * for each bad input before its first save. Compiled as C (C11). */
#define _POSIX_C_SOURCE 200809L

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp/c_api.h"

#define N 2048

static unsigned long long Digest(const float* w) {
  unsigned long long h = 1469598103934665603ull;
  const unsigned char* p = (const unsigned char*)w;
  for (size_t i = 0; i < N * sizeof(float); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

static void Bad(const char* what, ddp_status_t s) {
  printf("ERROR %s: %s: %s\n", what, ddp_status_name(s), s == DDP_OK ? "" : ddp_last_error());
}

static void BadInput(void) {
  static char big[2 << 20]; /* over the test's 1 MiB limit */
  const char x = 1;
  ddp_checkpoint_span_t limit[] = {{"big", big, sizeof big}};
  Bad("limit", ddp_checkpoint_save(0, limit, 1));
  ddp_checkpoint_span_t null_name[] = {{NULL, &x, 1}};
  Bad("null name", ddp_checkpoint_save(0, null_name, 1));
  ddp_checkpoint_span_t empty[] = {{"", &x, 1}};
  Bad("empty", ddp_checkpoint_save(0, empty, 1));
  ddp_checkpoint_span_t twice[] = {{"a", &x, 1}, {"a", &x, 1}};
  Bad("duplicate", ddp_checkpoint_save(0, twice, 2));
  fflush(stdout);
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: ckpt_c_worker OUT STEPS KILL_AT\n");
    return 64;
  }
  const int steps = atoi(argv[2]), kill_at = atoi(argv[3]);
  const char* attempt = getenv("TORCHELASTIC_RESTART_COUNT");
  ddp_group_t* g = NULL;
  if (ddp_init(NULL, &g) != DDP_OK) {
    fprintf(stderr, "ddp_init: %s\n", ddp_last_error());
    return 1;
  }
  const int rank = ddp_rank(g);
  char path[4096];
  snprintf(path, sizeof path, "%s/rank%d.attempt%s.txt", argv[1], rank, attempt);
  FILE* log = fopen(path, "w");
  if (log == NULL) return 1;
  static float w[N], grad[N];
  for (int i = 0; i < N; ++i) w[i] = 0.25f;
  int64_t start = 0;
  ddp_checkpoint_t* c = NULL;
  if (ddp_checkpoint_load(&c) != DDP_OK) {
    fprintf(stderr, "ddp_checkpoint_load: %s\n", ddp_last_error());
    return 1;
  }
  if (c != NULL) {
    const void* data = NULL;
    size_t size = 0;
    const char* name = NULL;
    if (ddp_checkpoint_find(c, "w", &data, &size) != DDP_OK || size != sizeof w ||
        ddp_checkpoint_buffer(c, 0, &name, NULL, NULL) != DDP_OK || strcmp(name, "w") != 0 ||
        ddp_checkpoint_count(c) != 1) {
      fprintf(stderr, "bad snapshot: %s\n", ddp_last_error());
      return 1;
    }
    const ddp_status_t missing = ddp_checkpoint_find(c, "nope", &data, &size);
    fprintf(log, "missing %s\n", missing == DDP_ERR_INVALID_ARGUMENT ? "refused" : "accepted");
    ddp_checkpoint_find(c, "w", &data, &size);
    memcpy(w, data, sizeof w);
    start = ddp_checkpoint_step(c) + 1;
    fprintf(log, "resumed %lld %016llx\n", (long long)ddp_checkpoint_step(c), Digest(w));
    ddp_checkpoint_free(c);
  }
  if (rank == 0 && strcmp(attempt, "0") == 0) BadInput();
  for (int64_t step = start; step < steps; ++step) {
    for (int i = 0; i < N; ++i) grad[i] = (float)((i * 3 + step * 11 + rank * 17) % 97) / 97.0f;
    if (ddp_allreduce(g, grad, N, DDP_FLOAT32, DDP_AVG, NULL) != DDP_OK) return 1;
    /* After the all-reduce: rank 0 has committed the previous step. */
    if (step == kill_at && rank == 1 && strcmp(attempt, "0") == 0) raise(SIGKILL);
    for (int i = 0; i < N; ++i) w[i] = 0.9f * w[i] + 0.1f * grad[i];
    ddp_checkpoint_span_t spans[] = {{"w", w, sizeof w}};
    if (ddp_checkpoint_save(step, spans, 1) != DDP_OK) {
      fprintf(stderr, "ddp_checkpoint_save: %s\n", ddp_last_error());
      return 1;
    }
    fprintf(log, "saved %lld %016llx\n", (long long)step, Digest(w));
    fflush(log);
  }
  fprintf(log, "final %016llx\n", Digest(w));
  fclose(log);
  ddp_group_destroy(g);
  return 0;
}
