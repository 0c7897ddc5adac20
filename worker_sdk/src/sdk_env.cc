// The worker SDK's DDP_* variables and their parsers (sdk_env.h).
#include "sdk_env.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "shm_group.h"

namespace ddp::detail {
namespace {

// The range DDP_SHM_CHUNK accepts: a page at least (a smaller step is
// raised to one anyway), at most what one rank may use of a host's segment
// (four slots of it when it runs alone; with more ranks the steps shrink).
constexpr std::size_t kMinShmChunkBytes = 4096;
constexpr std::size_t kMaxShmChunkBytes = kMaxShmSegmentBytes / 4;

absl::Status Bad(const char* name, const std::string& text, const std::string& what,
                 const std::string& fix) {
  return absl::InvalidArgumentError(absl::StrCat(name, "='", text, "' is not ", what, "; ", fix));
}

absl::Status TimeoutSec(const std::string& t, SdkEnv& out) {
  double sec = 0;
  if (!absl::SimpleAtod(t, &sec) || !std::isfinite(sec) || sec <= 0) {
    return Bad("DDP_TIMEOUT_SEC", t, "a positive number of seconds",
               "write seconds, e.g. 60, or unset it for the default");
  }
  out.timeout = Duration(static_cast<std::int64_t>(sec * 1000));
  return absl::OkStatus();
}

absl::Status BackendName(const std::string& t, SdkEnv& out) {
  if (t == "auto") {
    out.backend = ddp::Backend::kAuto;
  } else if (t == "gloo") {
    out.backend = ddp::Backend::kGloo;
  } else if (t == "nccl") {
    out.backend = ddp::Backend::kNccl;
  } else {
    return Bad("DDP_BACKEND", t, "one of auto, gloo, nccl", "write one of them, or unset it");
  }
  return absl::OkStatus();
}

absl::Status Shm(const std::string& t, SdkEnv& out) {
  if (t == "0") {
    out.shared_memory = false;
  } else if (t == "1") {
    out.shared_memory = true;
  } else {
    return Bad("DDP_SHM", t, "0 (TCP only) or 1 (shared memory)", "write 0 or 1, or unset it");
  }
  return absl::OkStatus();
}

absl::Status ShmChunk(const std::string& t, SdkEnv& out) {
  std::uint64_t bytes = 0;
  if (!absl::SimpleAtoi(t, &bytes) || bytes < kMinShmChunkBytes || bytes > kMaxShmChunkBytes) {
    return Bad("DDP_SHM_CHUNK", t,
               absl::StrCat("a number of bytes in ", kMinShmChunkBytes, "..", kMaxShmChunkBytes),
               absl::StrCat("write bytes, or unset it for the default, ", kDefaultShmChunkBytes,
                            " (it is for tuning only)"));
  }
  out.shm_chunk_bytes = static_cast<std::size_t>(bytes);
  return absl::OkStatus();
}

absl::Status ShmHostId(const std::string& t, SdkEnv& out) {
  out.shm_host_id = t;  // any text: ranks compare it, nothing parses it
  return absl::OkStatus();
}

absl::Status NcclLibrary(const std::string& t, SdkEnv& out) {
  out.nccl_library = t;  // a path or a soname: dlopen says whether it loads (nccl_loader.cc)
  return absl::OkStatus();
}

}  // namespace

SdkEnv::SdkEnv() : shm_chunk_bytes(kDefaultShmChunkBytes) {}

const std::vector<SdkEnvVar>& SdkEnvVars() {
  static const std::vector<SdkEnvVar> kVars{
      {"DDP_BACKEND", "one of auto, gloo, nccl", "auto",
       "replaces InitOptions::backend when it is kAuto: NCCL with a GPU, else the CPU paths",
       BackendName},
      {"DDP_TIMEOUT_SEC", "a positive number of seconds",
       absl::StrCat(std::chrono::duration_cast<std::chrono::seconds>(kDefaultTimeout).count()),
       "replaces InitOptions::timeout when it is the default: bootstrap and every collective",
       TimeoutSec},
      {"DDP_SHM", "0 (TCP only) or 1 (shared memory)", "1",
       "0 turns the shared memory path between ranks of a host off (InitOptions::shared_memory)",
       Shm},
      {"DDP_SHM_CHUNK",
       "a number of bytes",  // the range is in the error
       absl::StrCat(kDefaultShmChunkBytes),
       "bytes per rank per step of the shared memory path (tuning only)", ShmChunk},
      {"DDP_SHM_HOST_ID", "any text", "boot id, pid namespace, uid",
       "ranks share memory only with ranks of the same id", ShmHostId},
      {"DDP_NCCL_LIBRARY", "a path to libnccl.so.2", "libnccl.so.2",
       "the NCCL the NCCL backend loads (dlopen); by default the soname: the one PyTorch loaded, "
       "else the library path",
       NcclLibrary},
  };
  return kVars;
}

absl::StatusOr<SdkEnv> ReadSdkEnv(const std::function<const char*(const char*)>& getenv) {
  SdkEnv env;
  for (const SdkEnvVar& v : SdkEnvVars()) {
    const char* text = getenv(v.name);
    if (text == nullptr || *text == '\0') continue;
    if (absl::Status st = v.apply(text, env); !st.ok()) return st;
  }
  return env;
}

absl::StatusOr<SdkEnv> ReadSdkEnv() {
  return ReadSdkEnv([](const char* name) { return std::getenv(name); });
}

}  // namespace ddp::detail
