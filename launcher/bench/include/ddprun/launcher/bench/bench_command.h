// `ddprun bench [bench flags] [launcher flags]`: the SDK's collectives (or,
// with --scaling, a synthetic data-parallel step) across the job's real
// workers. main() sends argv here when argv[1] is "bench".
//
// The workers run ddprun-bench-worker (installed next to ddprun in the build
// tree, in <prefix>/libexec/ddprun/ once installed), started by the normal
// agent path with every launcher flag the user gave, so they get the backend
// a trainer would get. A separate program rather than a hidden mode of
// ddprun: the launcher does not link the worker SDK (nor CUDA and NCCL in a
// GPU build), so it starts on any node, and the bench worker is an ordinary
// SDK program, built and linked like a user's trainer.
//
// --scaling runs one job per world size (1, 2, 4, ... and --nproc_per_node,
// then 2, 4, ... and --nnodes times --nproc_per_node), one after the other;
// across nodes through a first job of every node that keeps them in step
// (launcher/bench/src/bench_scaling_nodes.h).
//
// Exit codes: those of the job (exit_codes.h), kExitUsage for bad flags or a
// request the backend cannot run, kExitBenchWrong when #wrong is not zero.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "ddprun/launcher/cli.h"

namespace ddprun::launcher {

// Where the bench worker is for the ddprun at `self_exe`: next to it, else
// ../libexec/ddprun/. Empty when neither exists.
std::string FindBenchWorker(const std::string& self_exe);

// The hidden subcommand each node's first job runs for --scaling across
// nodes (bench_scaling_nodes.h); not for users.
inline constexpr const char* kBenchScalingNodeSubcommand = "_bench_scaling_node";

// args[0] is the program, args[1] "bench". The caller has called
// BlockAgentSignals() (agent/events.h).
int RunBenchCommand(const std::vector<std::string>& args, const Env& env, const HostFacts& host,
                    std::ostream& out, std::ostream& err);

// main() for kBenchScalingNodeSubcommand: one node's side of --scaling across
// nodes. Needs the environment the first job's agent sets; exit 2 without it.
// The caller has called BlockAgentSignals().
int RunBenchScalingNode(const Env& env, const HostFacts& host, std::ostream& out,
                        std::ostream& err);

}  // namespace ddprun::launcher
