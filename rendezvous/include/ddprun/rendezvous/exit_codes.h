// The exit status of ddprun, ddprund and `ddprun status`, defined once
// (docs/cli.md lists them). 128+N means killed by signal N, as shells report.
#pragma once

namespace ddprun {

inline constexpr int kExitSuccess = 0;
inline constexpr int kExitWorkerFailed = 1;     // a worker failed beyond --max_restarts
inline constexpr int kExitUsage = 2;            // bad flags, job file or environment
inline constexpr int kExitRendezvousError = 3;  // join timeout, daemon unreachable, refused
inline constexpr int kExitBenchWrong = 4;       // `ddprun bench`: a collective's result was wrong

inline constexpr int ExitForSignal(int signo) { return 128 + signo; }

}  // namespace ddprun
