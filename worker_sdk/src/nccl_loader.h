// NCCL, loaded at run time (docs/gpu.md, "Which NCCL"). The SDK library has
// no NEEDED entry for libnccl: a CPU-only user of the SDK, or one on a
// machine without NCCL, loads and runs it all the same. The NCCL backend
// calls NCCL only through the table below, which LoadNccl fills with dlopen
// and dlsym when a group first asks for the NCCL backend; gloo and shared
// memory groups never load it.
//
// Which library: DDP_NCCL_LIBRARY (sdk_env.h) when set, else the soname
// libnccl.so.2. In a PyTorch 2.x worker torch has already loaded its own
// libnccl.so.2 (the nvidia-nccl pip package) when it imported CUDA, and a
// dlopen by soname returns that one: one NCCL per process. Elsewhere the
// dynamic loader's search applies (LD_LIBRARY_PATH, ld.so.cache).
//
// Built only with DDPRUN_WITH_CUDA (it needs nccl.h for the functions' types).
#pragma once

#include <nccl.h>

#include <string>

#include "absl/status/statusor.h"

namespace ddp::detail {

// Every NCCL function the NCCL backend calls; X(name) once per function.
#define DDP_NCCL_FUNCTIONS(X) \
  X(ncclGetVersion)           \
  X(ncclGetErrorString)       \
  X(ncclGetUniqueId)          \
  X(ncclCommInitRankConfig)   \
  X(ncclCommGetAsyncError)    \
  X(ncclCommFinalize)         \
  X(ncclCommDestroy)          \
  X(ncclCommAbort)            \
  X(ncclAllReduce)            \
  X(ncclBroadcast)            \
  X(ncclAllGather)            \
  X(ncclReduceScatter)

// A loaded NCCL: each function under its own name, typed as nccl.h declares
// it (api.ncclAllReduce(...)). Never unloaded: the library stays for the
// life of the process, so the pointers stay valid.
struct NcclApi {
#define DDP_NCCL_MEMBER(name) decltype(&::name) name = nullptr;
  DDP_NCCL_FUNCTIONS(DDP_NCCL_MEMBER)
#undef DDP_NCCL_MEMBER
  // Optional: NCCL >= 2.27's ncclCommShrink (a communicator without some
  // ranks), null when the library has none. Resolved untyped (older nccl.h
  // do not declare it); the in-place re-form does not call it (the new
  // round's replacement must join, which a shrink cannot add: docs/sdk.md).
  void* ncclCommShrink = nullptr;
  std::string path;  // the file the dynamic loader opened, e.g. /usr/lib/.../libnccl.so.2
  int version = 0;   // ncclGetVersion's code, as NCCL_VERSION_CODE (22809 = 2.28.9)
};

// The soname the SDK asks for when DDP_NCCL_LIBRARY is not set.
inline constexpr char kNcclSoname[] = "libnccl.so.2";

// Loads `library` (a path, or a name the dynamic loader looks up) and every
// function of NcclApi. `from` says where the name came from, for the error
// ("DDP_NCCL_LIBRARY", or "" for the default). Errors, FailedPrecondition,
// one line each:
//   the file does not load: "the NCCL backend needs libnccl.so.2: <dlerror>;
//     install NCCL or pip install nvidia-nccl-cu12, or set DDP_NCCL_LIBRARY ..."
//   a function is missing: names the function and the library
//     ("... /usr/lib/x86_64-linux-gnu/libz.so.1 has no ncclGetVersion ...").
absl::StatusOr<NcclApi> LoadNcclLibrary(const std::string& library, const std::string& from);

// The process's NCCL: DDP_NCCL_LIBRARY, else kNcclSoname, loaded on the first
// call (thread-safe); that first result, success or error, is every later
// call's. A bad DDP_NCCL_LIBRARY value is ReadSdkEnv's error.
absl::StatusOr<const NcclApi*> LoadNccl();

// "2.28.9" from a version code (NCCL >= 2.9's major*10000 + minor*100 + patch).
std::string NcclVersionText(int code);

}  // namespace ddp::detail
