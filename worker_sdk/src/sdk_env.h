// The DDP_* environment variables the worker SDK reads, each defined once:
// its name, type, default, meaning and parser (docs/sdk.md's table shows the
// same rows). Only the SDK reads them (ddprun sets none); every read goes
// through ReadSdkEnv, so a bad value is one line naming the variable, what it
// must be and how to fix it.
//
// ddp::Init (and through it the C API and the Python module, which read no
// DDP_* variable themselves) reads them first, so a bad value fails Init
// before any bootstrap; the backends read the values they need again.
//
// To add a variable: a row in SdkEnvVars() (sdk_env.cc) with its parser, a
// field in SdkEnv, its use, a row in docs/sdk.md.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ddp/process_group.h"
#include "ddp/types.h"

namespace ddp::detail {

// What the variables say. A variable that is unset or empty leaves its field
// at the value below, which means "the default".
struct SdkEnv {
  // DDP_TIMEOUT_SEC: replaces InitOptions::timeout when the trainer left it
  // at kDefaultTimeout.
  std::optional<Duration> timeout;
  // DDP_BACKEND: replaces InitOptions::backend when the trainer left kAuto.
  std::optional<ddp::Backend> backend;
  // DDP_SHM: 0 turns the shared memory path off; 1 leaves InitOptions' own.
  std::optional<bool> shared_memory;
  // DDP_SHM_CHUNK (tuning only): bytes per rank per shared-memory step.
  std::size_t shm_chunk_bytes;
  // DDP_SHM_HOST_ID: who shares memory; "" = this host's own identity.
  std::string shm_host_id;
  // DDP_NCCL_LIBRARY: the NCCL the NCCL backend loads; "" = libnccl.so.2 by
  // soname (nccl_loader.h).
  std::string nccl_library;

  SdkEnv();  // every field at its default
};

struct SdkEnvVar {
  const char* name;          // "DDP_SHM_CHUNK"
  const char* type;          // what a value must be, as errors and docs/sdk.md say it
  std::string default_text;  // as docs/sdk.md shows it, written from the constant
  const char* meaning;
  // Checks `text` (set and not empty) and stores it in `out`. Errors are
  // InvalidArgument "NAME='text' is not <type>; <fix>".
  absl::Status (*apply)(const std::string& text, SdkEnv& out);
};

// Every variable, in docs/sdk.md's order.
const std::vector<SdkEnvVar>& SdkEnvVars();

// Reads every variable through `getenv` (nullptr: unset). The first bad
// value is the error (see SdkEnvVar::apply).
absl::StatusOr<SdkEnv> ReadSdkEnv(const std::function<const char*(const char*)>& getenv);
// ReadSdkEnv over this process's environment.
absl::StatusOr<SdkEnv> ReadSdkEnv();

}  // namespace ddp::detail
