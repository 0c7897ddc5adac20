// The worker environment contract between the agent (which sets these) and
// the worker SDK (which reads them): ddprun's own variables, defined once.
// torchrun's variables (RANK, LOCAL_RANK, MASTER_ADDR, ...) are PyTorch's
// contract and keep their names where they are set (agent/src/worker_env.cc).
#pragma once

namespace ddprun {

inline constexpr const char* kEnvStoreAddr = "DDPRUN_STORE_ADDR";  // host:port of the gRPC Store
// host:port of the round's TCPStore (the agent's C10dStoreServer), set only
// when the SDK bootstraps there instead of the gRPC Store: a single-node job
// whose rendezvous runs inside the launcher (docs/sdk.md, "Which store").
// Unset (erased, never inherited): the gRPC Store at DDPRUN_STORE_ADDR.
inline constexpr const char* kEnvTcpStoreAddr = "DDPRUN_TCPSTORE_ADDR";
// Replicated control plane (docs/ha.md): every ddprund replica the agent
// knows, "h1:p1,h2:p2,..." (its --rdzv_endpoint list); unset with one daemon.
// The SDK's store starts at DDPRUN_STORE_ADDR and moves on through this list
// when that replica stops serving.
inline constexpr const char* kEnvStoreReplicas = "DDPRUN_STORE_REPLICAS";
inline constexpr const char* kEnvJobId = "DDPRUN_JOB_ID";
inline constexpr const char* kEnvRound = "DDPRUN_ROUND";
inline constexpr const char* kEnvToken = "DDPRUN_TOKEN";
inline constexpr const char* kEnvHost = "DDPRUN_HOST";
// TLS to the store at DDPRUN_STORE_ADDR (docs/tls.md): absolute paths of the
// agent's --tls_ca, --tls_cert, --tls_key; unset when the agent has none.
inline constexpr const char* kEnvTlsCa = "DDPRUN_TLS_CA";
inline constexpr const char* kEnvTlsCert = "DDPRUN_TLS_CERT";
inline constexpr const char* kEnvTlsKey = "DDPRUN_TLS_KEY";
// Subsystems of the debug channel (debug_log.h): DDPRUN_DEBUG=rdzv,agent,store,sdk or all.
inline constexpr const char* kEnvDebug = "DDPRUN_DEBUG";
// `ddprun bench` (launcher/bench/worker/bench_worker.h): where rank 0 writes
// its summary for the launcher, and the test hook that corrupts one rank's results.
inline constexpr const char* kEnvBenchResult = "DDPRUN_BENCH_RESULT";
inline constexpr const char* kEnvBenchCorruptRank = "DDPRUN_BENCH_CORRUPT_RANK";
// `ddprun bench --scaling` across nodes: the run (the user's launcher flags,
// the bench worker and its flags, as JSON) for each node's scaling worker
// (launcher/bench/src/bench_scaling_nodes.h).
inline constexpr const char* kEnvBenchScalingSpec = "DDPRUN_BENCH_SCALING_SPEC";
// Monitoring (docs/monitoring-sources.md). The worker's metrics channel
// (metrics_channel.h), as a path the worker opens; unset: not monitored.
inline constexpr const char* kEnvMetricsFile = "DDPRUN_METRICS_FILE";
// Where the Python start-up hook's faulthandler writes stacks (opened for
// appending by the worker).
inline constexpr const char* kEnvStackFile = "DDPRUN_STACK_FILE";
// "0": the Python start-up hook does nothing (set by --python_hook=0, or
// by the user for one job).
inline constexpr const char* kEnvPythonHook = "DDPRUN_PYTHON_HOOK";
// Checkpoints in memory (docs/checkpoint.md): the number of the inherited
// descriptor of the worker's checkpoint memory (checkpoint_layout.h); unset
// when --ckpt_shm_limit is 0. And the steps every local rank of this node
// had committed when the round's workers were spawned ("3,4"; "" none).
inline constexpr const char* kEnvCkptFd = "DDPRUN_CKPT_FD";
inline constexpr const char* kEnvCkptSteps = "DDPRUN_CKPT_STEPS";
// --ckpt_every: save keeps only steps that are multiples of it.
inline constexpr const char* kEnvCkptEvery = "DDPRUN_CKPT_EVERY";

}  // namespace ddprun
