// `ddprun check [--json] [--check_timeout=S] [LAUNCHER FLAGS] SCRIPT [ARGS]`:
// a preflight run like the job itself. The launcher flags are parsed as for
// the job (the same rendezvous, nodes and job file); each node's agent then
// runs ONE check worker (this binary, `ddprun _check_worker`) through the
// normal agent path, under the job id "check.<job id>" so that it never
// joins the real job. The workers exchange their facts through the round's
// store (preflight_exchange.h); group rank 0's node prints the table (or
// JSON) and every node exits with the report's code (exit_codes.h: 0 all
// pass, kExitCheckWarnings, kExitCheckFailed; 2 usage, 3 rendezvous).
//
// The check flags come first, right after `check`; the rest is ddprun's
// command line unchanged.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "ddprun/agent/worker_env.h"

namespace ddprun::launcher {

inline constexpr const char* kCheckSubcommand = "check";
// argv[1] of the check worker; not a user command.
inline constexpr const char* kCheckWorkerSubcommand = "_check_worker";
// The launcher -> check worker contract (the worker's environment).
inline constexpr const char* kEnvCheckSpec = "DDPRUN_CHECK_SPEC";      // JSON, below
inline constexpr const char* kEnvCheckReport = "DDPRUN_CHECK_REPORT";  // file the worker writes
inline constexpr double kDefaultCheckTimeoutS = 30.0;

// args[0] is the program, args[1] "check". Runs this node's agent; returns
// the exit code.
int RunCheckCommand(const std::vector<std::string>& args, const agent::Env& env, std::ostream& out,
                    std::ostream& err);

// The check worker's main (argv[1] == kCheckWorkerSubcommand): reads the
// agent's worker environment and kEnvCheckSpec, runs this node's part and
// writes its outcome to kEnvCheckReport. Returns 0 unless the environment is
// not a check worker's.
int RunCheckWorker(const agent::Env& env, std::ostream& err);

}  // namespace ddprun::launcher
