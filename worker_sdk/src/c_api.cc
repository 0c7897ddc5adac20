// The C API (ddp/c_api.h): thin wrappers that catch ddp::Error (and anything
// else) at the ABI boundary and turn it into a status code plus a
// thread-local message.
#include "ddp/c_api.h"

#include <memory>
#include <string>

#include "ddp/checkpoint.h"
#include "ddp/metrics.h"
#include "ddp/process_group.h"
#include "ddp/reducer.h"
#include "ddprun/rendezvous/common/checkpoint_checksum.h"

struct ddp_group {
  std::shared_ptr<ddp::ProcessGroup> pg;
};
struct ddp_work {
  ddp::Work work;
};
struct ddp_reducer {
  std::unique_ptr<ddp::Reducer> reducer;
};
struct ddp_checkpoint {
  ddp::checkpoint::Snapshot snapshot;
};

namespace {

thread_local std::string g_last_error;

ddp_status_t Fail(ddp_status_t code, std::string msg) {
  g_last_error = std::move(msg);
  return code;
}

template <class Fn>
ddp_status_t Guard(Fn&& fn) {
  try {
    fn();
    g_last_error.clear();
    return DDP_OK;
  } catch (const ddp::Error& e) {
    return Fail(static_cast<ddp_status_t>(e.code()), e.what());
  } catch (const std::bad_alloc&) {
    return Fail(DDP_ERR_INTERNAL, "out of memory");
  } catch (const std::exception& e) {
    return Fail(DDP_ERR_INTERNAL, e.what());
  } catch (...) {
    return Fail(DDP_ERR_INTERNAL, "unknown error");
  }
}

#define DDP_REQUIRE(cond, what) \
  if (!(cond)) return Fail(DDP_ERR_INVALID_ARGUMENT, what)

ddp_status_t CheckEnums(int dtype, int op) {
  if (!ddp::IsValidDType(dtype)) {
    return Fail(DDP_ERR_INVALID_ARGUMENT,
                "invalid dtype " + std::to_string(dtype) +
                    " (DDP_FLOAT32, DDP_FLOAT16, DDP_BFLOAT16, DDP_FLOAT64, DDP_INT32, DDP_INT64)");
  }
  if (!ddp::IsValidReduceOp(op)) {
    return Fail(DDP_ERR_INVALID_ARGUMENT, "invalid reduce op " + std::to_string(op) +
                                              " (DDP_SUM, DDP_AVG, DDP_MAX, DDP_MIN)");
  }
  return DDP_OK;
}

ddp_status_t Finish(ddp::Work w, ddp_work_t** out) {
  return Guard([&] {
    if (out != nullptr) {
      *out = new ddp_work{std::move(w)};
    } else {
      w.Wait();
    }
  });
}

}  // namespace

extern "C" {

int ddp_abi_version(void) { return DDP_ABI_VERSION; }
const char* ddp_last_error(void) { return g_last_error.c_str(); }
const char* ddp_status_name(ddp_status_t status) {
  return ddp::ErrorCodeName(static_cast<ddp::ErrorCode>(status));
}

namespace {
// ddp_init_options_t (NULL: defaults) as InitOptions; `fn` names the caller.
ddp_status_t ToInitOptions(const ddp_init_options_t* options, const std::string& fn,
                           ddp::InitOptions* o) {
  if (options == nullptr) return DDP_OK;
  DDP_REQUIRE(options->backend >= 0 && options->backend <= 2,
              fn + ": invalid backend (DDP_BACKEND_AUTO, _GLOO, _NCCL)");
  o->backend = static_cast<ddp::Backend>(options->backend);
  DDP_REQUIRE(options->timeout_sec >= 0, fn + ": timeout_sec is negative");
  if (options->timeout_sec > 0) {
    o->timeout = ddp::Duration(static_cast<std::int64_t>(options->timeout_sec * 1000));
  }
  return DDP_OK;
}
}  // namespace

ddp_status_t ddp_init(const ddp_init_options_t* options, ddp_group_t** out) {
  DDP_REQUIRE(out != nullptr, "ddp_init: out is a null pointer");
  *out = nullptr;
  ddp::InitOptions o;
  if (ddp_status_t s = ToInitOptions(options, "ddp_init", &o); s != DDP_OK) return s;
  return Guard([&] { *out = new ddp_group{ddp::Init(o)}; });
}

ddp_status_t ddp_reconfigure(ddp_group_t* g, const ddp_init_options_t* options) {
  DDP_REQUIRE(g != nullptr, "ddp_reconfigure: group is a null pointer");
  ddp::InitOptions o;
  if (ddp_status_t s = ToInitOptions(options, "ddp_reconfigure", &o); s != DDP_OK) return s;
  return Guard([&] {
    // The handle's reference goes to Reconfigure only once it returned.
    std::shared_ptr<ddp::ProcessGroup> next = ddp::Reconfigure(g->pg, o);
    g->pg = std::move(next);
  });
}

void ddp_group_destroy(ddp_group_t* group) { delete group; }
int ddp_rank(const ddp_group_t* g) { return g ? g->pg->rank() : -1; }
int ddp_world_size(const ddp_group_t* g) { return g ? g->pg->size() : -1; }
int ddp_local_rank(const ddp_group_t* g) { return g ? g->pg->info().local_rank : -1; }
int ddp_backend(const ddp_group_t* g) { return g ? static_cast<int>(g->pg->backend()) : -1; }
int64_t ddp_round(const ddp_group_t* g) { return g ? g->pg->info().round : -1; }

ddp_status_t ddp_abort(ddp_group_t* g, const char* reason) {
  DDP_REQUIRE(g != nullptr, "ddp_abort: group is a null pointer");
  return Guard([&] { g->pg->Abort(reason ? reason : ""); });
}

ddp_status_t ddp_allreduce(ddp_group_t* g, void* data, size_t count, int dtype, int op,
                           ddp_work_t** work) {
  DDP_REQUIRE(g != nullptr, "ddp_allreduce: group is a null pointer");
  if (ddp_status_t s = CheckEnums(dtype, op); s != DDP_OK) return s;
  ddp::Work w;
  ddp_status_t s = Guard([&] {
    w = g->pg->Allreduce(data, count, static_cast<ddp::DType>(dtype),
                         static_cast<ddp::ReduceOp>(op));
  });
  return s == DDP_OK ? Finish(std::move(w), work) : s;
}

ddp_status_t ddp_broadcast(ddp_group_t* g, void* data, size_t count, int dtype, int root,
                           ddp_work_t** work) {
  DDP_REQUIRE(g != nullptr, "ddp_broadcast: group is a null pointer");
  if (ddp_status_t s = CheckEnums(dtype, 0); s != DDP_OK) return s;
  ddp::Work w;
  ddp_status_t s =
      Guard([&] { w = g->pg->Broadcast(data, count, static_cast<ddp::DType>(dtype), root); });
  return s == DDP_OK ? Finish(std::move(w), work) : s;
}

ddp_status_t ddp_allgather(ddp_group_t* g, const void* in, void* out, size_t count, int dtype,
                           ddp_work_t** work) {
  DDP_REQUIRE(g != nullptr, "ddp_allgather: group is a null pointer");
  if (ddp_status_t s = CheckEnums(dtype, 0); s != DDP_OK) return s;
  ddp::Work w;
  ddp_status_t s =
      Guard([&] { w = g->pg->Allgather(in, out, count, static_cast<ddp::DType>(dtype)); });
  return s == DDP_OK ? Finish(std::move(w), work) : s;
}

ddp_status_t ddp_reduce_scatter(ddp_group_t* g, const void* in, void* out, size_t count, int dtype,
                                int op, ddp_work_t** work) {
  DDP_REQUIRE(g != nullptr, "ddp_reduce_scatter: group is a null pointer");
  if (ddp_status_t s = CheckEnums(dtype, op); s != DDP_OK) return s;
  ddp::Work w;
  ddp_status_t s = Guard([&] {
    w = g->pg->ReduceScatter(in, out, count, static_cast<ddp::DType>(dtype),
                             static_cast<ddp::ReduceOp>(op));
  });
  return s == DDP_OK ? Finish(std::move(w), work) : s;
}

ddp_status_t ddp_barrier(ddp_group_t* g, ddp_work_t** work) {
  DDP_REQUIRE(g != nullptr, "ddp_barrier: group is a null pointer");
  ddp::Work w;
  ddp_status_t s = Guard([&] { w = g->pg->Barrier(); });
  return s == DDP_OK ? Finish(std::move(w), work) : s;
}

ddp_status_t ddp_work_wait(ddp_work_t* work, double timeout_sec) {
  DDP_REQUIRE(work != nullptr, "ddp_work_wait: work is a null pointer");
  std::unique_ptr<ddp_work_t> owned(work);
  return Guard([&] {
    if (timeout_sec > 0) {
      owned->work.Wait(ddp::Duration(static_cast<std::int64_t>(timeout_sec * 1000)));
    } else {
      owned->work.Wait();
    }
  });
}

ddp_status_t ddp_work_test(ddp_work_t* work, int* done) {
  DDP_REQUIRE(work != nullptr, "ddp_work_test: work is a null pointer");
  DDP_REQUIRE(done != nullptr, "ddp_work_test: done is a null pointer");
  return Guard([&] { *done = work->work.IsCompleted() ? 1 : 0; });
}

void ddp_work_free(ddp_work_t* work) { delete work; }

ddp_status_t ddp_reducer_create(ddp_group_t* g, const ddp_reducer_options_t* options,
                                ddp_reducer_t** out) {
  DDP_REQUIRE(g != nullptr, "ddp_reducer_create: group is a null pointer");
  DDP_REQUIRE(out != nullptr, "ddp_reducer_create: out is a null pointer");
  ddp::ReducerOptions o;
  if (options != nullptr) {
    if (options->bucket_cap_bytes) o.bucket_cap_bytes = options->bucket_cap_bytes;
    if (options->first_bucket_bytes) o.first_bucket_bytes = options->first_bucket_bytes;
    o.gradient_as_bucket_view = options->gradient_as_bucket_view != 0;
    DDP_REQUIRE(options->compression >= 0 && options->compression <= 2,
                "ddp_reducer_create: invalid compression");
    o.compression = static_cast<ddp::Compression>(options->compression);
    o.average = options->no_average == 0;
  }
  return Guard([&] { *out = new ddp_reducer{std::make_unique<ddp::Reducer>(g->pg, o)}; });
}

void ddp_reducer_destroy(ddp_reducer_t* r) { delete r; }

ddp_status_t ddp_reducer_register(ddp_reducer_t* r, void* data, size_t count, int dtype,
                                  size_t* index) {
  DDP_REQUIRE(r != nullptr, "ddp_reducer_register: reducer is a null pointer");
  if (ddp_status_t s = CheckEnums(dtype, 0); s != DDP_OK) return s;
  return Guard([&] {
    size_t i = r->reducer->Register(data, count, static_cast<ddp::DType>(dtype));
    if (index) *index = i;
  });
}

ddp_status_t ddp_reducer_gradient_buffer(ddp_reducer_t* r, size_t index, void** out) {
  DDP_REQUIRE(r != nullptr && out != nullptr, "ddp_reducer_gradient_buffer: null pointer");
  return Guard([&] { *out = r->reducer->GradientBuffer(index); });
}

ddp_status_t ddp_alloc_memory(ddp_group_t* g, size_t bytes, void** out) {
  DDP_REQUIRE(g != nullptr && out != nullptr, "ddp_alloc_memory: null pointer");
  *out = nullptr;
  return Guard([&] { *out = g->pg->AllocMemory(bytes); });
}

ddp_status_t ddp_free_memory(ddp_group_t* g, void* p) {
  DDP_REQUIRE(g != nullptr, "ddp_free_memory: group is a null pointer");
  return Guard([&] { g->pg->FreeMemory(p); });
}

ddp_status_t ddp_reducer_mark_ready(ddp_reducer_t* r, size_t index) {
  DDP_REQUIRE(r != nullptr, "ddp_reducer_mark_ready: reducer is a null pointer");
  return Guard([&] { r->reducer->MarkReady(index); });
}

ddp_status_t ddp_reducer_finish(ddp_reducer_t* r) {
  DDP_REQUIRE(r != nullptr, "ddp_reducer_finish: reducer is a null pointer");
  return Guard([&] { r->reducer->Finish(); });
}

ddp_status_t ddp_reducer_set_require_sync(ddp_reducer_t* r, int require_sync) {
  DDP_REQUIRE(r != nullptr, "ddp_reducer_set_require_sync: reducer is a null pointer");
  return Guard([&] { r->reducer->SetRequireSync(require_sync != 0); });
}

size_t ddp_reducer_num_buckets(const ddp_reducer_t* r) { return r ? r->reducer->num_buckets() : 0; }

ddp_status_t ddp_broadcast_parameters(ddp_group_t* g, void* const* data, const size_t* counts,
                                      const int* dtypes, size_t n, int root) {
  DDP_REQUIRE(g != nullptr, "ddp_broadcast_parameters: group is a null pointer");
  DDP_REQUIRE(n == 0 || (data && counts && dtypes),
              "ddp_broadcast_parameters: data, counts or dtypes is a null pointer");
  std::vector<ddp::GradSpec> specs;
  for (size_t i = 0; i < n; ++i) {
    if (ddp_status_t s = CheckEnums(dtypes[i], 0); s != DDP_OK) return s;
    specs.push_back(ddp::GradSpec{data[i], counts[i], static_cast<ddp::DType>(dtypes[i]), {}});
  }
  return Guard([&] { ddp::BroadcastParameters(*g->pg, specs, root); });
}

ddp_status_t ddp_metrics_step(double samples) {
  ddp::metrics::Step(samples);
  return DDP_OK;
}

ddp_status_t ddp_metrics_scalar(const char* name, double value) {
  DDP_REQUIRE(name != nullptr, "ddp_metrics_scalar: name is a null pointer");
  if (!ddp::metrics::Enabled()) return DDP_OK;
  DDP_REQUIRE(ddp::metrics::Scalar(name, value),
              "ddp_metrics_scalar: name refused (1-119 printable ASCII bytes without spaces, at "
              "most 256 names per worker)");
  return DDP_OK;
}

ddp_status_t ddp_checkpoint_save(int64_t step, const ddp_checkpoint_span_t* spans, size_t n) {
  DDP_REQUIRE(n == 0 || spans != nullptr, "ddp_checkpoint_save: spans is a null pointer");
  std::vector<ddp::checkpoint::Span> list;
  for (size_t i = 0; i < n; ++i) {
    DDP_REQUIRE(spans[i].name != nullptr, "ddp_checkpoint_save: the name of span " +
                                              std::to_string(i) +
                                              " is a null pointer; give every span a name");
    list.push_back({spans[i].name, spans[i].data, spans[i].size});
  }
  return Guard([&] { ddp::checkpoint::Save(step, list); });
}

ddp_status_t ddp_checkpoint_load(ddp_checkpoint_t** out) {
  DDP_REQUIRE(out != nullptr, "ddp_checkpoint_load: out is a null pointer");
  *out = nullptr;
  return Guard([&] {
    if (auto snap = ddp::checkpoint::Load()) *out = new ddp_checkpoint{std::move(*snap)};
  });
}

int64_t ddp_checkpoint_step(const ddp_checkpoint_t* c) { return c ? c->snapshot.step : -1; }
size_t ddp_checkpoint_count(const ddp_checkpoint_t* c) {
  return c ? c->snapshot.buffers.size() : 0;
}

ddp_status_t ddp_checkpoint_buffer(const ddp_checkpoint_t* c, size_t i, const char** name,
                                   const void** data, size_t* size) {
  DDP_REQUIRE(c != nullptr, "ddp_checkpoint_buffer: checkpoint is a null pointer");
  DDP_REQUIRE(i < c->snapshot.buffers.size(), "ddp_checkpoint_buffer: index " + std::to_string(i) +
                                                  " is not below the count " +
                                                  std::to_string(c->snapshot.buffers.size()));
  const ddp::checkpoint::Buffer& b = c->snapshot.buffers[i];
  if (name) *name = b.name.c_str();
  if (data) *data = b.data();
  if (size) *size = b.size();
  return DDP_OK;
}

ddp_status_t ddp_checkpoint_find(const ddp_checkpoint_t* c, const char* name, const void** data,
                                 size_t* size) {
  DDP_REQUIRE(c != nullptr && name != nullptr, "ddp_checkpoint_find: null pointer");
  return Guard([&] {
    const ddp::checkpoint::Buffer& b = c->snapshot.Get(name);
    if (data) *data = b.data();
    if (size) *size = b.size();
  });
}

void ddp_checkpoint_free(ddp_checkpoint_t* c) { delete c; }

uint32_t ddp_checkpoint_copy_crc32c(void* dst, const void* src, size_t n, uint32_t crc) {
  return ddprun::checkpoint_checksum::CopyCrc32c(crc, dst, src, n,
                                                 ddprun::checkpoint_checksum::DefaultCopyThreads());
}

}  // extern "C"
