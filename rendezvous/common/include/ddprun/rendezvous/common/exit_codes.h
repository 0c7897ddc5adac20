// The exit status of ddprun, ddprund, `ddprun status` and `ddprun check`, defined once
// (docs/cli.md lists them). 128+N means killed by signal N, as shells report.
#pragma once

namespace ddprun {

inline constexpr int kExitSuccess = 0;
inline constexpr int kExitWorkerFailed = 1;     // a worker failed beyond --max_restarts
inline constexpr int kExitUsage = 2;            // bad flags, job file or environment
inline constexpr int kExitRendezvousError = 3;  // join timeout, daemon unreachable, refused
inline constexpr int kExitBenchWrong = 4;       // `ddprun bench`: a collective's result was wrong
// `ddprun check` (docs/check.md): 0 when every check passed, these otherwise.
inline constexpr int kExitCheckWarnings = 5;  // the worst result is a warning
inline constexpr int kExitCheckFailed = 6;    // at least one check failed

inline constexpr int ExitForSignal(int signo) { return 128 + signo; }

}  // namespace ddprun
