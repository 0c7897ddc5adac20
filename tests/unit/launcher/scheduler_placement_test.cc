// Zero-flag placement (docs/schedulers.md): a command line without a job
// file inside a multi-node srun step takes node rank, node count, the
// rendezvous host and the job id from Slurm through the real parser, says so
// in one line, and refuses what Slurm contradicts. The environment is
// injected: these are the variables srun sets in each task.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "ddprun/launcher/cli.h"
#include "ddprun/launcher/placement.h"

namespace ddprun::launcher {
namespace {

using agent::RendezvousMode;

// What `srun -N<nnodes> ddprun ...` puts in task `nodeid`'s environment.
Env SrunStep(const std::string& nodelist, int nnodes, int nodeid) {
  return {{"PATH", "/usr/bin:/bin"},
          {"SLURM_JOB_ID", "4242"},
          {"SLURM_JOB_NODELIST", nodelist},
          {"SLURM_JOB_NUM_NODES", std::to_string(nnodes)},
          {"SLURM_NNODES", std::to_string(nnodes)},
          {"SLURM_NODEID", std::to_string(nodeid)},
          {"SLURM_STEP_ID", "0"},
          {"SLURM_STEP_NODELIST", nodelist},
          {"SLURM_STEP_NUM_NODES", std::to_string(nnodes)},
          {"SLURM_STEP_NUM_TASKS", std::to_string(nnodes)}};
}

HostFacts Host() {
  HostFacts host;
  host.cpu_count = 4;
  host.gpu_count = [] { return 0; };
  return host;
}

absl::StatusOr<ParsedCommand> Parse(std::vector<std::string> flags, const Env& env) {
  flags.insert(flags.begin(), "ddprun");
  flags.push_back("/bin/true");
  return ParseCommandLine(flags, env, Host());
}

// The usage error of a command line, which must be one "ddprun: " line.
std::string Err(std::vector<std::string> flags, const Env& env) {
  auto r = Parse(std::move(flags), env);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  const std::string msg(r.status().message());
  CHECK(msg.rfind("ddprun: ", 0) == 0);
  CHECK(msg.find('\n') == std::string::npos);
  return msg;
}

std::string Notice(const ParsedCommand& p) {
  for (const std::string& w : p.warnings) {
    if (w.rfind("ddprun: placed by ", 0) == 0) return w;
  }
  return "";
}

TEST_CASE("zero flags in a multi-node srun step: placement from Slurm, said in one line",
          "[unit]") {
  auto p = Parse({}, SrunStep("gpu[01-04]", 4, 2));
  INFO(p.status().message());
  REQUIRE(p.ok());
  CHECK(p->options.node_rank == 2);
  CHECK(p->options.min_nodes == 4);
  CHECK(p->options.max_nodes == 4);
  CHECK(p->options.mode == RendezvousMode::kRemote);
  CHECK(p->options.rdzv_host == "gpu01");
  CHECK(p->options.rdzv_port == 29400);
  CHECK(p->options.job_id == "slurm-4242-0");
  CHECK(Notice(*p) ==
        "ddprun: placed by slurm: node rank 2 (SLURM_NODEID=2), 4 nodes "
        "(SLURM_STEP_NUM_NODES=4), rendezvous at gpu01:29400 (first_node: SLURM_STEP_NODELIST "
        "(first host)), job id slurm-4242-0; --scheduler=none turns this off");

  // Given values win; Slurm fills the rest.
  auto f = Parse({"--rdzv_endpoint=ctl:1234", "--rdzv_id=mine"}, SrunStep("gpu[01-04]", 4, 1));
  REQUIRE(f.ok());
  CHECK(f->options.node_rank == 1);
  CHECK(f->options.rdzv_host == "ctl");
  CHECK(f->options.rdzv_port == 1234);
  CHECK(f->options.job_id == "mine");
  // An agreeing --nnodes is fine.
  CHECK(Parse({"--nnodes=4"}, SrunStep("gpu[01-04]", 4, 1)).ok());
  CHECK(Parse({"--nnodes=2:8"}, SrunStep("gpu[01-04]", 4, 1)).ok());
}

TEST_CASE("a single-node step, the batch script, --standalone and --scheduler=none are unchanged", "[unit]") {
  for (const Env& env : {SrunStep("gpu01", 1, 0), Env{{"SLURM_JOB_ID", "7"},
                                                      {"SLURM_JOB_NODELIST", "gpu[01-02]"},
                                                      {"SLURM_NNODES", "2"},
                                                      {"SLURM_NODEID", "0"}}}) {
    auto p = Parse({}, env);
    REQUIRE(p.ok());
    CHECK(p->options.mode == RendezvousMode::kEmbedded);
    CHECK(p->options.min_nodes == 1);
    CHECK(Notice(*p).empty());
  }
  Env env = SrunStep("gpu[01-04]", 4, 2);
  auto none = Parse({"--scheduler=none"}, env);
  REQUIRE(none.ok());
  CHECK(none->options.mode == RendezvousMode::kEmbedded);
  CHECK(Notice(*none).empty());
  // --standalone: one single-node job per node (a sweep), as before.
  auto standalone = Parse({"--standalone"}, env);
  REQUIRE(standalone.ok());
  CHECK(standalone->options.mode == RendezvousMode::kEmbedded);
  CHECK(Notice(*standalone).empty());
  env["PET_SCHEDULER"] = "NONE";
  auto pet = Parse({}, env);
  REQUIRE(pet.ok());
  CHECK(pet->options.mode == RendezvousMode::kEmbedded);
  // The flag wins over PET_SCHEDULER.
  auto flag = Parse({"--scheduler=auto"}, env);
  REQUIRE(flag.ok());
  CHECK(flag->options.mode == RendezvousMode::kRemote);
}

TEST_CASE("--scheduler=slurm forces Slurm; outside Slurm it is an error", "[unit]") {
  auto one = Parse({"--scheduler=slurm"}, SrunStep("gpu01", 1, 0));
  REQUIRE(one.ok());
  CHECK(one->options.job_id == "slurm-4242-0");
  CHECK(Err({"--scheduler=slurm"}, {{"PATH", "/bin"}}) ==
        "ddprun: scheduler: slurm, but SLURM_JOB_ID and SLURM_NODEID are not set; run ddprun "
        "under srun, or set scheduler: auto");
  CHECK(Err({"--scheduler=pbs"}, {{"PATH", "/bin"}}) ==
        "ddprun: --scheduler must be auto, slurm, mpi or none, got 'pbs'; auto detects Slurm and "
        "OpenMPI/PMIx, none turns detection off");
}

TEST_CASE("what Slurm contradicts is one line, never a fallback to localhost", "[unit]") {
  const Env step = SrunStep("gpu[01-04]", 4, 2);
  CHECK(Err({"--nnodes=2"}, step) ==
        "ddprun: --nnodes asks for 2 nodes but slurm runs this job on 4 "
        "(SLURM_STEP_NUM_NODES=4); make them agree: allocate 2 nodes, or change the count (--scheduler=none "
        "ignores slurm)");

  Env tasks = step;
  tasks["SLURM_STEP_NUM_TASKS"] = "8";
  CHECK(Err({}, tasks) ==
        "ddprun: srun started 8 tasks (SLURM_STEP_NUM_TASKS) on 4 nodes "
        "(SLURM_STEP_NUM_NODES=4); ddprun starts the workers itself, so run one per node: srun "
        "--ntasks-per-node=1 ddprun ...");

  Env unparsable = step;
  unparsable["SLURM_STEP_NODELIST"] = "gpu[01-04";
  CHECK(Err({}, unparsable) ==
        "ddprun: SLURM_STEP_NODELIST: host list 'gpu[01-04' has a '[' without ']'");

  Env longer = step;
  longer["SLURM_STEP_NODELIST"] = "gpu[01-05]";
  CHECK(Err({}, longer) ==
        "ddprun: Slurm's counts disagree: SLURM_STEP_NUM_NODES=4 but SLURM_STEP_NODELIST lists 5 "
        "hosts; check the allocation (srun --nodes) or unset the stale variable");

  Env count = step;
  count["SLURM_STEP_NUM_NODES"] = "four";
  CHECK(Err({}, count) ==
        "ddprun: SLURM_STEP_NUM_NODES='four' is not an integer >= 1; the scheduler's environment "
        "looks damaged, or unset it");
}

TEST_CASE("PET_NODE_RANK beyond PET_NNODES is one line", "[unit]") {
  const std::string msg = Err({"--rdzv_backend=static"}, {{"PATH", "/bin"},
                                                          {"PET_NNODES", "2"},
                                                          {"PET_NODE_RANK", "2"},
                                                          {"PET_MASTER_ADDR", "127.0.0.1"}});
  CHECK_THAT(msg, Catch::Contains("PET_NODE_RANK"));
  CHECK_THAT(msg, Catch::Contains("2"));
  const std::string c10d = Err({"--rdzv_endpoint=127.0.0.1:29400"},
                               {{"PATH", "/bin"}, {"PET_NNODES", "2"}, {"PET_NODE_RANK", "5"}});
  CHECK_THAT(c10d, Catch::Contains("PET_NODE_RANK"));
}

TEST_CASE("SchedulerPlacesJob: multi-node steps and MPI worlds only, unless forced", "[unit]") {
  CHECK(SchedulerPlacesJob(SrunStep("a[1-2]", 2, 0), SchedulerMode::kAuto));
  CHECK_FALSE(SchedulerPlacesJob(SrunStep("a1", 1, 0), SchedulerMode::kAuto));
  CHECK_FALSE(SchedulerPlacesJob(SrunStep("a[1-2]", 2, 0), SchedulerMode::kNone));
  CHECK(SchedulerPlacesJob({}, SchedulerMode::kSlurm));
  CHECK(SchedulerPlacesJob({{"OMPI_COMM_WORLD_SIZE", "2"}}, SchedulerMode::kAuto));
  CHECK_FALSE(SchedulerPlacesJob({{"OMPI_COMM_WORLD_SIZE", "1"}}, SchedulerMode::kAuto));
  // Without the job id the step variables are not Slurm's.
  CHECK_FALSE(SchedulerPlacesJob({{"SLURM_STEP_NUM_NODES", "2"}}, SchedulerMode::kAuto));
}

}  // namespace
}  // namespace ddprun::launcher
