// NCCL through dlopen and dlsym (nccl_loader.h).
#include "nccl_loader.h"

#include <dlfcn.h>
#include <link.h>

#include "absl/strings/str_cat.h"
#include "sdk_env.h"

namespace ddp::detail {
namespace {

std::string DlError() {
  const char* e = dlerror();
  return e != nullptr ? e : "unknown dlopen error";
}

// The file behind a dlopen handle, or `fallback` when the loader does not say.
std::string LoadedPath(void* handle, const std::string& fallback) {
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
      *map->l_name != '\0') {
    return map->l_name;
  }
  return fallback;
}

// A library without one of NcclApi's functions: not NCCL, or older than 2.14
// (ncclCommInitRankConfig, ncclCommFinalize).
absl::Status MissingFunction(const std::string& path, const std::string& named,
                             const std::string& from, const char* function) {
  return absl::FailedPreconditionError(absl::StrCat(
      "the NCCL backend needs ", kNcclSoname, " of NCCL >= 2.14: ", path,
      path == named ? "" : absl::StrCat(" (", named, ")"), " has no function ", function,
      from.empty()
          ? "; install NCCL >= 2.14, or set DDP_NCCL_LIBRARY to its libnccl.so.2"
          : absl::StrCat("; point ", from, " at libnccl.so.2 of NCCL >= 2.14, or unset it")));
}

}  // namespace

std::string NcclVersionText(int code) {
  return absl::StrCat(code / 10000, ".", code / 100 % 100, ".", code % 100);
}

absl::StatusOr<NcclApi> LoadNcclLibrary(const std::string& library, const std::string& from) {
  const std::string named = from.empty() ? library : absl::StrCat(from, "=", library);
  // RTLD_LOCAL: NCCL's symbols stay out of the global scope (a trainer's own
  // NCCL, if any, is not interposed). Never dlclosed (nccl_loader.h).
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the NCCL backend needs ", kNcclSoname, ": ", DlError(),
        from.empty() ? "" : absl::StrCat(" (", from, ")"),
        "; install NCCL or pip install nvidia-nccl-cu12 (a PyTorch 2.x worker uses the one "
        "torch loaded), or set DDP_NCCL_LIBRARY to the path of libnccl.so.2"));
  }
  NcclApi api;
  api.path = LoadedPath(handle, library);
  dlerror();
#define DDP_NCCL_LOAD(name)                                              \
  api.name = reinterpret_cast<decltype(api.name)>(dlsym(handle, #name)); \
  if (api.name == nullptr) return MissingFunction(api.path, named, from, #name);
  DDP_NCCL_FUNCTIONS(DDP_NCCL_LOAD)
#undef DDP_NCCL_LOAD
  api.ncclCommShrink = dlsym(handle, "ncclCommShrink");  // optional: null before NCCL 2.27
  if (ncclResult_t r = api.ncclGetVersion(&api.version); r != ncclSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("the NCCL backend needs ", kNcclSoname, ": ncclGetVersion of ", api.path,
                     " failed (", r, "); reinstall NCCL, or set DDP_NCCL_LIBRARY to another"));
  }
  return api;
}

absl::StatusOr<const NcclApi*> LoadNccl() {
  static const absl::StatusOr<NcclApi>* const kLoaded = [] {
    absl::StatusOr<SdkEnv> env = ReadSdkEnv();
    if (!env.ok()) return new absl::StatusOr<NcclApi>(env.status());
    if (!env->nccl_library.empty()) {
      return new absl::StatusOr<NcclApi>(LoadNcclLibrary(env->nccl_library, "DDP_NCCL_LIBRARY"));
    }
    return new absl::StatusOr<NcclApi>(LoadNcclLibrary(kNcclSoname, ""));
  }();
  if (!kLoaded->ok()) return kLoaded->status();
  return &**kLoaded;
}

}  // namespace ddp::detail
