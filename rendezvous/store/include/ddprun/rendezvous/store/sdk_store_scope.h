// Where an SDK worker's keys live on the round's TCPStore (the agent's
// C10dStoreServer), when the launcher sets DDPRUN_TCPSTORE_ADDR
// (worker_env_names.h; docs/sdk.md, "Which store"). Defined once for the
// agent, which writes the scope's job key before it spawns the round's
// workers, and for the SDK, which reads it and keeps every key under it.
//
// The scope is "ddprun/<DDPRUN_TOKEN>/<round>". torch's TCPStore protocol has
// no listing of keys, so a client without the job's token (128 random bits,
// job_rendezvous.cc) can neither read nor write a key of the scope: it has to
// name the key. A new round's keys are in a scope of their own (and on a
// store of their own: the agent starts one per round).
#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace ddprun::rendezvous {

// The key prefix of one job's round, without the trailing '/' (PrefixStore adds it).
inline std::string SdkStoreScope(const std::string& token, std::int64_t round) {
  return absl::StrCat("ddprun/", token, "/", round);
}

// The key the agent sets, in the scope, to the job id before the round's
// workers start: a worker that cannot read it there holds a wrong token or a
// round that has ended.
inline constexpr const char* kSdkStoreJobKey = "job";

inline std::string SdkStoreJobKey(const std::string& token, std::int64_t round) {
  return absl::StrCat(SdkStoreScope(token, round), "/", kSdkStoreJobKey);
}

}  // namespace ddprun::rendezvous
