// --cpu_bind on real workers: each worker's affinity as the kernel reports it
// (/proc/self/status). The plan's arithmetic is unit-tested
// (tests/unit/agent/cpu_binding_test.cc); bad values are in bad_input_test.cc.
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "ddprun/agent/cpu_binding.h"
#include "support/process_helpers.h"
#include "support/skip.h"

using namespace ddprun::test;

namespace {

// Runs 2 workers that write their Cpus_allowed_list to <out>/<local rank>;
// returns {rank 0's list, rank 1's list}.
std::pair<std::string, std::string> WorkerAffinity(const std::vector<std::string>& flags,
                                                   const EnvList& env) {
  Harness h;
  const std::string out = h.MakeDir("out");
  std::vector<std::string> args = flags;
  for (const char* a :
       {"--nproc_per_node=2", "--no_python", "/bin/sh", "-c",
        "sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status > \"$OUT/$LOCAL_RANK\""})
    args.push_back(a);
  EnvList e = env;
  e.emplace_back("OUT", out);
  Proc& p = h.StartDdprun("ddprun", args, e);
  const int rc = h.Wait(p, 20);
  INFO("stderr: " << p.Err());
  REQUIRE(rc == 0);
  auto read = [&](int r) {
    std::ifstream f(out + "/" + std::to_string(r));
    std::string s;
    std::getline(f, s);
    return s;
  };
  return {read(0), read(1)};
}

std::string AllCpus() {
  std::vector<int> all;
  for (const auto& c : ddprun::agent::ReadCpuTopology().cores)
    all.insert(all.end(), c.begin(), c.end());
  std::sort(all.begin(), all.end());
  return ddprun::agent::FormatCpuList(all);
}

}  // namespace

TEST_CASE("--cpu_bind=core: two workers on disjoint cores; none: both inherit", "[multiproc]") {
  const auto topo = ddprun::agent::ReadCpuTopology();
  if (topo.cores.size() < 2) return SkipCase("multiproc", "fewer than 2 usable cores");
  const auto plan = *ddprun::agent::PlanCpuBinding(ddprun::agent::CpuBind::kCore, 2, topo);
  const std::string want0 = ddprun::agent::FormatCpuList(plan[0]);
  const std::string want1 = ddprun::agent::FormatCpuList(plan[1]);

  auto [c0, c1] = WorkerAffinity({"--cpu_bind=core"}, {});
  CHECK(c0 == want0);
  CHECK(c1 == want1);
  CHECK(c0 != c1);
  // auto binds as core here (2 workers, >= 2 cores), also through PET_CPU_BIND; the
  // default (none, as torchrun) leaves the workers on every CPU ddprun may use.
  auto [a0, a1] = WorkerAffinity({}, {{"PET_CPU_BIND", "auto"}});
  CHECK(a0 == want0);
  CHECK(a1 == want1);
  auto [n0, n1] = WorkerAffinity({}, {});
  CHECK(n0 == AllCpus());
  CHECK(n1 == AllCpus());
}
