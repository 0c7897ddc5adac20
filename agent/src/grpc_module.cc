// Finds and loads lib/libddprun_grpc.so (grpc_module.h).
#include "ddprun/agent/grpc_module.h"

#include <dlfcn.h>
#include <limits.h>
#include <unistd.h>

#include <mutex>

#include "absl/strings/str_cat.h"

// Defined when the program links the gRPC session in (ddprun_agent's
// grpc_module_linked.cc); bin/ddprun does not, and loads the module.
extern "C" const ddprun::agent::GrpcModule* ddprun_grpc_module_linked() __attribute__((weak));

namespace ddprun::agent {
namespace {

std::string ModulePath() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  std::string exe = n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
  const std::size_t slash = exe.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : exe.substr(0, slash);
  return dir + "/../lib/libddprun_grpc.so";
}

absl::StatusOr<const GrpcModule*> Load() {
  if (ddprun_grpc_module_linked != nullptr) return ddprun_grpc_module_linked();
  const std::string path = ModulePath();
  // RTLD_LOCAL: the module's own copies of our static libraries stay its own.
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    return absl::FailedPreconditionError(
        absl::StrCat("cannot load ddprun's gRPC module: ", why ? why : path,
                     "; build it with `cmake --build build --target ddprun_grpc`, and keep "
                     "lib/libddprun_grpc.so beside the bin/ directory of ddprun"));
  }
  using Entry = const GrpcModule* (*)();
  auto entry = reinterpret_cast<Entry>(::dlsym(handle, kGrpcModuleEntry));
  const GrpcModule* module = entry != nullptr ? entry() : nullptr;
  if (module == nullptr || module->version != kGrpcModuleVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("ddprun's gRPC module ", path, " is not from this build of ddprun",
                     "; rebuild both (`cmake --build build --target ddprun ddprun_grpc`)"));
  }
  return module;
}

}  // namespace

absl::StatusOr<const GrpcModule*> LoadGrpcModule() {
  static std::once_flag once;
  static absl::StatusOr<const GrpcModule*>* result = nullptr;
  std::call_once(once, [] { result = new absl::StatusOr<const GrpcModule*>(Load()); });
  return *result;
}

}  // namespace ddprun::agent
