// The slurm_cluster tier: ddprun on a real multi-node Slurm (slurmctld and a
// slurmd per node, each node its own network and UTS namespace,
// tests/slurm/slurm_cluster.h), running a real PyTorch DDP script on Gloo.
// Each case builds its own cluster and tears it down, also when it fails;
// without root, namespaces or the packages it skips (support/skip.h).
#include "slurm/slurm_cluster.h"

#include <string>
#include <vector>

#include "support/process_helpers.h"
#include "support/skip.h"

using namespace ddprun::test;

namespace {

const std::string kPython = "/usr/bin/python3";  // Debian's torch lives here (this-machine.md)

// Why the tier cannot run here, or "" when it can.
std::string WhyNot(const SlurmCluster& c) {
  if (!c.ok()) return c.why();
  if (std::system((kPython + " -c 'import torch.distributed' >/dev/null 2>&1").c_str()) != 0)
    return kPython + " cannot import torch";
  return "";
}

// The job's environment: the workers' interpreter (Debian's torch).
const EnvList kJobEnv = {{"PYTHON_EXEC", kPython}};

std::string JobOutput(const SlurmCluster& c, int job) {
  return ReadFile(c.dir() + "/job-" + std::to_string(job) + ".out");
}

}  // namespace

TEST_CASE("slurm cluster: sbatch -N2 with srun ddprun and no rendezvous flag trains on both nodes",
          "[slurm_cluster]") {
  Harness h;
  SlurmCluster c(h);
  if (const std::string why = WhyNot(c); !why.empty()) return SkipCase("slurm_cluster", why);
  c.Up();
  const std::string out = h.MakeDir("ranks");
  // The batch script of docs/schedulers.md, with the test's paths.
  const std::string script =
      h.Script("train.sbatch", "#!/bin/bash\n#SBATCH -N2\n#SBATCH --ntasks-per-node=1\nsrun " +
                                   Ddprun() + " --nproc_per_node=2 " + DDPRUN_SOURCE_DIR +
                                   "/examples/ddp_train.py --steps 5 --out " + out + "\n");
  const int job =
      c.Submit({"--output=" + c.dir() + "/job-%j.out", "--chdir=" + c.dir(), script}, kJobEnv);
  const std::string state = c.WaitJobEnd(job, 180);
  const std::string text = JobOutput(c, job);
  INFO("job output:\n" << text);
  CHECK(state == "COMPLETED");
  CHECK(c.JobField(job, "ExitCode") == "0:0");
  CHECK(c.JobField(job, "NodeList") == "n[1-2]");
  // Each ddprun placed itself from the step's variables, node 0 (n1) hosting.
  const std::string id = "job id slurm-" + std::to_string(job) + "-0";
  for (const char* rank : {"node rank 0 (SLURM_NODEID=0)", "node rank 1 (SLURM_NODEID=1)"}) {
    CHECK(text.find(std::string("ddprun: placed by slurm: ") + rank +
                    ", 2 nodes (SLURM_STEP_NUM_NODES=2), rendezvous at n1:29400") !=
          std::string::npos);
  }
  CHECK(text.find(id) != std::string::npos);
  CHECK(text.find("ranks 0-1 of 4, node 0 of 2") != std::string::npos);
  CHECK(text.find("ranks 2-3 of 4, node 1 of 2") != std::string::npos);
  // Every rank trained in one world of 4 and ends with the same parameters.
  std::string digest;
  for (int r = 0; r < 4; ++r) {
    const std::string line = ReadFile(out + "/rank" + std::to_string(r) + ".txt");
    INFO("rank " << r << ": " << line);
    REQUIRE_FALSE(line.empty());
    const std::string d = line.substr(0, line.find(' '));
    CHECK(line.substr(d.size() + 1, 2) == "4 ");
    if (digest.empty()) digest = d;
    CHECK(d == digest);
  }
  CHECK(text.find("identical across ranks: True") != std::string::npos);
}
