// libFuzzer target: arbitrary text as a job file. ParseJobConfig must return
// (never crash, leak or hang), and keep its contract: a problem is an
// InvalidArgument whose message names the file. A parsed config's
// FlagValues() must work too.
// Built by scripts/fuzz.sh (clang, -fsanitize=fuzzer,address,undefined).
#include <cstddef>
#include <cstdint>
#include <string>

#include "ddprun/launcher/job_config.h"
#include "ddprun/rendezvous/common/status_macros.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > ddprun::launcher::kMaxConfigBytes) return 0;  // LoadJobConfig refuses these first
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<ddprun::launcher::JobConfig> config =
      ddprun::launcher::ParseJobConfig(text, "fuzz.yaml");
  if (!config.ok()) {
    DDPRUN_CHECK(absl::IsInvalidArgument(config.status())) << config.status();
    DDPRUN_CHECK(config.status().message().rfind("fuzz.yaml", 0) == 0) << config.status();
    return 0;
  }
  (void)config->FlagValues();
  return 0;
}
