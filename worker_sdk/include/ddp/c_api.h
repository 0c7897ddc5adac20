/* The worker SDK's C API: a stable ABI over ddp::ProcessGroup and
 * ddp::Reducer, for C trainers and for the Python module (ctypes).
 *
 * Every function returns a ddp_status_t; on failure ddp_last_error() gives
 * the message (thread-local, valid until the next call on this thread).
 * Handles are opaque; ABI rules: enums and struct layouts never change,
 * functions are only added. ddp_abi_version() is bumped when they are.
 *
 *   ddp_group_t* g;
 *   if (ddp_init(NULL, &g) != DDP_OK) { fprintf(stderr, "%s\n", ddp_last_error()); exit(1); }
 *   ddp_allreduce(g, buf, n, DDP_FLOAT32, DDP_SUM, NULL);   // NULL work: blocking
 */
#ifndef DDP_C_API_H_
#define DDP_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1: the first release; 2: ddp_work_test; 3: ddp_metrics_step, ddp_metrics_scalar;
 * 4: ddp_alloc_memory, ddp_free_memory; 5: ddp_checkpoint_*;
 * 6: ddp_checkpoint_copy_crc32c; 7: DDP_ERR_PEER_LOST, ddp_reconfigure. */
#define DDP_ABI_VERSION 7

typedef enum {
  DDP_OK = 0,
  DDP_ERR_INVALID_ARGUMENT = 1,
  DDP_ERR_TIMEOUT = 2,
  DDP_ERR_CONNECTION = 3,
  DDP_ERR_AUTH = 4,
  DDP_ERR_STATE = 5,
  DDP_ERR_UNSUPPORTED = 6,
  DDP_ERR_INTERNAL = 7,
  DDP_ERR_PEER_LOST = 8 /* a peer of the group is gone: the group is aborted; ddp_reconfigure */
} ddp_status_t;

typedef enum {
  DDP_FLOAT32 = 0,
  DDP_FLOAT16 = 1,
  DDP_BFLOAT16 = 2,
  DDP_FLOAT64 = 3,
  DDP_INT32 = 4,
  DDP_INT64 = 5
} ddp_dtype_t;

typedef enum { DDP_SUM = 0, DDP_AVG = 1, DDP_MAX = 2, DDP_MIN = 3 } ddp_reduce_op_t;
typedef enum { DDP_BACKEND_AUTO = 0, DDP_BACKEND_GLOO = 1, DDP_BACKEND_NCCL = 2 } ddp_backend_t;
typedef enum {
  DDP_COMPRESS_NONE = 0,
  DDP_COMPRESS_FP16 = 1,
  DDP_COMPRESS_BF16 = 2
} ddp_compression_t;

typedef struct ddp_group ddp_group_t;
typedef struct ddp_work ddp_work_t;
typedef struct ddp_reducer ddp_reducer_t;

/* Init options; zero-initialise, then set what you need (0 = default). */
typedef struct {
  int backend;        /* ddp_backend_t */
  double timeout_sec; /* 0: 300 s (or DDP_TIMEOUT_SEC) */
} ddp_init_options_t;

typedef struct {
  size_t bucket_cap_bytes;     /* 0: 25 MiB */
  size_t first_bucket_bytes;   /* 0: 1 MiB */
  int gradient_as_bucket_view; /* bool */
  int compression;             /* ddp_compression_t */
  int no_average;              /* bool: plain sum instead of the mean */
} ddp_reducer_options_t;

int ddp_abi_version(void);
const char* ddp_last_error(void);
const char* ddp_status_name(ddp_status_t status);

ddp_status_t ddp_init(const ddp_init_options_t* options, ddp_group_t** out);
void ddp_group_destroy(ddp_group_t* group);
int ddp_rank(const ddp_group_t* group);
int ddp_world_size(const ddp_group_t* group);
int ddp_local_rank(const ddp_group_t* group);
int ddp_backend(const ddp_group_t* group);
int64_t ddp_round(const ddp_group_t* group);
ddp_status_t ddp_abort(ddp_group_t* group, const char* reason);
/* Under --restart_policy=inplace: replaces the (broken) group of `group` by
 * the new round's, in this process (ddp::Reconfigure). The handle stays
 * valid; reducers made from the old group must be destroyed and made again.
 * DDP_ERR_STATE without the in-place control block, DDP_ERR_TIMEOUT when no
 * new round comes in time; on failure the handle keeps the old group. */
ddp_status_t ddp_reconfigure(ddp_group_t* group, const ddp_init_options_t* options);

/* Collectives. `work` may be NULL: the call then blocks until done.
 * Otherwise *work receives a handle to pass to ddp_work_wait (which frees it). */
ddp_status_t ddp_allreduce(ddp_group_t* g, void* data, size_t count, int dtype, int op,
                           ddp_work_t** work);
ddp_status_t ddp_broadcast(ddp_group_t* g, void* data, size_t count, int dtype, int root,
                           ddp_work_t** work);
ddp_status_t ddp_allgather(ddp_group_t* g, const void* in, void* out, size_t count, int dtype,
                           ddp_work_t** work);
ddp_status_t ddp_reduce_scatter(ddp_group_t* g, const void* in, void* out, size_t count, int dtype,
                                int op, ddp_work_t** work);
ddp_status_t ddp_barrier(ddp_group_t* g, ddp_work_t** work);
/* Waits (timeout_sec <= 0: the group's timeout) and frees the handle. */
ddp_status_t ddp_work_wait(ddp_work_t* work, double timeout_sec);
/* Non-blocking: *done = 1 once the collective completed, else 0. The handle
 * stays valid (wait or free it after). A failed collective returns its error. */
ddp_status_t ddp_work_test(ddp_work_t* work, int* done);
void ddp_work_free(ddp_work_t* work);

ddp_status_t ddp_reducer_create(ddp_group_t* g, const ddp_reducer_options_t* options,
                                ddp_reducer_t** out);
void ddp_reducer_destroy(ddp_reducer_t* r);
ddp_status_t ddp_reducer_register(ddp_reducer_t* r, void* data, size_t count, int dtype,
                                  size_t* index);
ddp_status_t ddp_reducer_gradient_buffer(ddp_reducer_t* r, size_t index, void** out);
ddp_status_t ddp_reducer_mark_ready(ddp_reducer_t* r, size_t index);
ddp_status_t ddp_reducer_finish(ddp_reducer_t* r);
ddp_status_t ddp_reducer_set_require_sync(ddp_reducer_t* r, int require_sync);
size_t ddp_reducer_num_buckets(const ddp_reducer_t* r);

/* Memory for collective buffers that the group reduces fastest
 * (ddp::ProcessGroup::AllocMemory): on a CPU group whose ranks share a host,
 * shared memory every rank maps, so that large all-reduces fold it in place;
 * device memory on NCCL; the heap otherwise. Zero-filled on CPU. Free it with
 * ddp_free_memory on the same group, before ddp_group_destroy. */
ddp_status_t ddp_alloc_memory(ddp_group_t* g, size_t bytes, void** out);
ddp_status_t ddp_free_memory(ddp_group_t* g, void* p);

/* Broadcasts `n` buffers from `root` (initial parameter sync). */
ddp_status_t ddp_broadcast_parameters(ddp_group_t* g, void* const* data, const size_t* counts,
                                      const int* dtypes, size_t n, int root);

/* Live metrics for ddprun's monitoring (ddp/metrics.h): one training step
 * done with `samples` samples (< 0: unknown), and a named scalar. No group
 * needed; no-ops (DDP_OK) when not under ddprun. ddp_metrics_scalar returns
 * DDP_ERR_INVALID_ARGUMENT for a refused name (NULL, empty, over 119 bytes,
 * not printable ASCII, or past 256 names) under ddprun. */
ddp_status_t ddp_metrics_step(double samples);
ddp_status_t ddp_metrics_scalar(const char* name, double value);

/* Checkpoints in memory owned by ddprun's agent (ddp/checkpoint.h,
 * docs/checkpoint.md): named byte spans, the same memory and format as
 * Python's ddprun.checkpoint. No group needed.
 *
 *   ddp_checkpoint_t* c;
 *   if (ddp_checkpoint_load(&c) != DDP_OK) { ... ddp_last_error() ... }
 *   if (c) {                                   // NULL: a fresh start
 *     const void* w; size_t n;
 *     ddp_checkpoint_find(c, "weights", &w, &n);
 *     memcpy(weights, w, n); start = ddp_checkpoint_step(c) + 1;
 *     ddp_checkpoint_free(c);
 *   }
 *   ddp_checkpoint_span_t spans[] = {{"weights", weights, sizeof weights}};
 *   ddp_checkpoint_save(step, spans, 1);       // each step
 *
 * ddp_checkpoint_save returns once the bytes are committed (they survive
 * this process's death); DDP_ERR_INVALID_ARGUMENT for a NULL or empty name,
 * a name given twice, NULL data with a size, or a snapshot over
 * --ckpt_shm_limit; DDP_ERR_STATE without checkpoint memory (not under
 * ddprun); under --ckpt_every N, DDP_OK at once without saving for a step
 * that is not a multiple of N. ddp_checkpoint_load sets *out to the newest step every rank
 * committed, the same on every rank, or to NULL when there is none; every
 * rank calls it at start, before its first save. Free it with
 * ddp_checkpoint_free. Not thread-safe. */
typedef struct {
  const char* name; /* NUL-terminated UTF-8, not empty, unique per save */
  const void* data; /* may be NULL only when size is 0 */
  size_t size;
} ddp_checkpoint_span_t;
typedef struct ddp_checkpoint ddp_checkpoint_t;

ddp_status_t ddp_checkpoint_save(int64_t step, const ddp_checkpoint_span_t* spans, size_t n);
ddp_status_t ddp_checkpoint_load(ddp_checkpoint_t** out);
int64_t ddp_checkpoint_step(const ddp_checkpoint_t* c);
size_t ddp_checkpoint_count(const ddp_checkpoint_t* c);
/* Buffer i (0 <= i < count), in the order saved; data and size stay valid
 * until ddp_checkpoint_free. Any out pointer may be NULL. */
ddp_status_t ddp_checkpoint_buffer(const ddp_checkpoint_t* c, size_t i, const char** name,
                                   const void** data, size_t* size);
/* The buffer named `name`; DDP_ERR_INVALID_ARGUMENT naming the saved names if none. */
ddp_status_t ddp_checkpoint_find(const ddp_checkpoint_t* c, const char* name, const void** data,
                                 size_t* size);
void ddp_checkpoint_free(ddp_checkpoint_t* c);
/* Copies n bytes from src to dst (not overlapping; dst NULL: no copy) and
 * returns the CRC-32C of src's bytes continued from crc (0 to start), reading
 * them once, with up to 4 threads for large copies: the checksum of
 * checkpoint memory (docs/checkpoint.md, "Format"), through which Python's
 * ddprun.checkpoint saves and loads. */
uint32_t ddp_checkpoint_copy_crc32c(void* dst, const void* src, size_t n, uint32_t crc);

#ifdef __cplusplus
}
#endif

#endif /* DDP_C_API_H_ */
