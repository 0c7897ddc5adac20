// `ddprun bench` end to end: build/bin/ddprun bench starts ddprun-bench-worker
// as the job's workers (real processes, the shared memory and Gloo TCP paths),
// every op at 1, 2 and 4 ranks with #wrong 0 and nccl-tests' table shape; the
// corruption hook makes #wrong non-zero and the exit code 4; --json parses;
// the --scaling table at 1-4 ranks. Small sizes and few iterations: the
// figures are not checked here (bench/, docs/bench.md), the shape and the
// results are.
#include <algorithm>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "ddprun/rendezvous/common/exit_codes.h"
#include "support/process_helpers.h"

using namespace ddprun::test;

namespace {

struct Result {
  int rc;
  std::string out, err;
};

Result Bench(std::vector<std::string> args, EnvList env = {}, double timeout_s = 120) {
  Harness h;
  args.insert(args.begin(), "bench");
  env.push_back({"DDP_TIMEOUT_SEC", "60"});
  Proc& p = h.StartDdprun("ddprun", args, env);
  const int rc = h.Wait(p, timeout_s);
  return Result{rc, p.Out(), p.Err()};
}

std::vector<std::string> Fields(const std::string& line) {
  std::vector<std::string> f;
  std::istringstream in(line);
  for (std::string w; in >> w;) f.push_back(w);
  return f;
}

constexpr const char* kHeader =
    "#       size         count      type   redop    root     time   algbw   busbw #wrong     "
    "time   algbw   busbw #wrong";

// Checks one op's table in `out` (title, header, `rows` rows, footer) and returns its rows.
std::vector<std::vector<std::string>> CheckTable(const std::string& out, const std::string& op,
                                                 int world, std::size_t rows) {
  const std::vector<std::string> lines = Lines(out);
  const std::string title = "# ddprun bench: " + op + ", " + std::to_string(world) + " rank(s)";
  auto it = std::find_if(lines.begin(), lines.end(),
                         [&](const std::string& l) { return l.rfind(title, 0) == 0; });
  REQUIRE(it != lines.end());
  REQUIRE(lines.end() - it >= static_cast<long>(5 + rows + 2));
  CHECK(it[2] == "#");
  CHECK(it[3].find("out-of-place") != std::string::npos);
  CHECK(it[3].find("in-place") != std::string::npos);
  CHECK(it[4] == kHeader);
  CHECK(it[5].find("(B)    (elements)") != std::string::npos);
  std::vector<std::vector<std::string>> table;
  for (std::size_t i = 0; i < rows; ++i) {
    const std::string& line = it[6 + i];
    INFO(line);
    CHECK(line.size() == std::string(kHeader).size());
    const std::vector<std::string> f = Fields(line);
    REQUIRE(f.size() == 13);
    CHECK(std::stoll(f[0]) > 0);
    CHECK(std::stod(f[5]) > 0);  // out-of-place time (us)
    CHECK(std::stod(f[9]) > 0);  // in-place time (us)
    table.push_back(f);
  }
  CHECK(it[6 + rows].rfind("# Out of bounds values : ", 0) == 0);
  CHECK(it[7 + rows].rfind("# Avg bus bandwidth    : ", 0) == 0);
  return table;
}

}  // namespace

TEST_CASE("ddprun bench: every op at 1, 2 and 4 ranks, #wrong 0, nccl-tests' table", "[sdk]") {
  for (int world : {1, 2, 4}) {
    INFO("world size " << world);
    const Result r = Bench({"--nproc_per_node=" + std::to_string(world), "--op=all",
                            "--sizes=4K:64K", "--iters=2", "--warmup=1", "--dtype=float"});
    INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
    REQUIRE(r.rc == 0);
    for (const char* op : {"allreduce", "allgather", "reducescatter", "broadcast"}) {
      const auto table = CheckTable(r.out, op, world, 5);  // 4K 8K 16K 32K 64K
      for (const auto& f : table) {
        CHECK(f[8] == "0");   // out-of-place #wrong
        CHECK(f[12] == "0");  // in-place #wrong
        CHECK(f[2] == "float");
        if (world == 1 && std::string(op) != "broadcast") CHECK(std::stod(f[7]) == 0);  // busbw
      }
    }
    CHECK(r.out.find("# Out of bounds values : 0 OK") != std::string::npos);
    CHECK(r.out.find("FAILED") == std::string::npos);
    CHECK(r.out.find("backend gloo (shared memory)") != std::string::npos);
  }
}

TEST_CASE("ddprun bench: other types and reductions, and the Gloo TCP path", "[sdk]") {
  const Result r = Bench({"--nproc_per_node=3", "--op=allreduce,reducescatter", "--sizes=4K:8K",
                          "--iters=2", "--warmup=0", "--dtype=bfloat16", "--redop=avg", "--json"},
                         {{"DDP_SHM", "0"}});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  REQUIRE(r.rc == 0);
  const nlohmann::json js = nlohmann::json::parse(r.out);
  CHECK(js["world_size"] == 3);
  CHECK(js["backend"] == "gloo (tcp)");
  CHECK(js["wrong"] == 0);
  REQUIRE(js["rows"].size() == 4);
  for (const auto& row : js["rows"]) {
    CHECK(row["type"] == "bfloat16");
    CHECK(row["redop"] == "avg");
    CHECK(row["out_of_place"]["wrong"] == 0);
    CHECK(row["in_place"]["time_us"].get<double>() > 0);
  }
  CHECK(js["avg_busbw_gbs"].get<double>() > 0);
}

TEST_CASE("ddprun bench: a corrupted result makes #wrong non-zero and the exit code 4", "[sdk]") {
  const Result r = Bench({"--nproc_per_node=2", "--op=allreduce,allgather", "--sizes=4K:8K",
                          "--iters=1", "--warmup=0"},
                         {{"DDPRUN_BENCH_CORRUPT_RANK", "1"}});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(r.rc == ddprun::kExitBenchWrong);
  for (const char* op : {"allreduce", "allgather"}) {
    for (const auto& f : CheckTable(r.out, op, 2, 2)) {
      CHECK(f[8] == "1");  // rank 1 altered one element of each checked result
      CHECK(f[12] == "1");
    }
  }
  // 2 sizes x 2 placements per op.
  CHECK(r.out.find("# Out of bounds values : 4 FAILED") != std::string::npos);
  CHECK(r.out.find("# Out of bounds values : 0 OK") == std::string::npos);
  CHECK(r.err.find("ddprun bench: 8 wrong element(s)") != std::string::npos);
}

TEST_CASE("ddprun bench --scaling: the table at 1, 2 and 4 ranks", "[sdk]") {
  const Result r = Bench({"--scaling", "--nproc_per_node=4", "--compute_ms=20", "--iters=2",
                          "--warmup=0", "--batch=16"});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  REQUIRE(r.rc == 0);
  std::vector<std::vector<std::string>> rows;
  for (const std::string& line : Lines(r.out))
    if (!line.empty() && line[0] != '#') rows.push_back(Fields(line));
  REQUIRE(rows.size() == 3);
  const int worlds[] = {1, 2, 4};
  for (int i = 0; i < 3; ++i) {
    REQUIRE(rows[i].size() == 7);
    CHECK(std::stoi(rows[i][0]) == worlds[i]);
    CHECK(std::stoi(rows[i][1]) == 16 * worlds[i]);         // global batch
    CHECK(std::stod(rows[i][2]) > 0);                       // samples/s
    CHECK(std::stod(rows[i][5]) >= 20 * 0.9);               // compute (ms) at least --compute_ms
    CHECK(std::stod(rows[i][4]) >= std::stod(rows[i][5]));  // step >= compute
  }
  CHECK(rows[0][3] == "100.0");  // one rank is the reference
  CHECK(r.out.find("ranks  global_batch   samples/s  efficiency") != std::string::npos);
}

TEST_CASE("ddprun bench: bad flags and requests are one line and exit 2", "[sdk]") {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--sizes=1M:1K"}, "ddprun bench: --sizes: '1M:1K': need 0 < MIN <= MAX"},
      {{"--op=alltoall"}, "ddprun bench: --op: unknown collective 'alltoall'"},
      {{"--nproc_per_node=2", "--op=broadcast", "--root=5", "--sizes=4K"},
       "ddprun bench: --root 5 is not a rank of this job of 2 rank(s)"},
      // Across nodes (tests/multiproc/bench_scaling_test.cc): the job's own checks.
      {{"--scaling", "--nnodes=2", "--rdzv_backend=static", "--master_addr=127.0.0.1",
        "--master_port=29999"},
       "ddprun: static rendezvous with --nnodes=2 needs this node's --node_rank"},
  };
  for (const auto& [args, want] : cases) {
    const Result r = Bench(args, {}, 60);
    INFO("stderr:\n" << r.err);
    CHECK(r.rc == ddprun::kExitUsage);
    CHECK(r.err.find(want) != std::string::npos);
  }
}
