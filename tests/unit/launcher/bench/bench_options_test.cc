// ddprun bench: its flags (split from the launcher's), nccl-tests' sizes,
// counts and bus bandwidth factors, the table's shape, and where the worker is.
#include "ddprun/launcher/bench/bench_options.h"

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_split.h"
#include "ddprun/launcher/bench/bench_command.h"

namespace ddprun::launcher::bench {
namespace {

std::string ErrorOf(const std::vector<std::string>& args) {
  auto r = SplitBenchArgs(args);
  REQUIRE_FALSE(r.ok());
  return std::string(r.status().message());
}

TEST_CASE("ddprun bench splits its flags from the launcher's, both spellings and forms", "[unit]") {
  auto r = SplitBenchArgs({"--nproc_per_node", "4", "--op=allgather,broadcast", "--sizes", "1K:1M",
                           "--step-factor=4", "--dtype", "bf16", "--redop=max", "--iters", "3",
                           "--warmup=0", "--root", "2", "--json", "--rdzv_id=x"});
  REQUIRE(r.ok());
  CHECK(r->launcher_args == std::vector<std::string>{"--nproc_per_node", "4", "--rdzv_id=x"});
  const BenchOptions& o = r->options;
  CHECK(o.ops == std::vector<Op>{Op::kAllgather, Op::kBroadcast});
  CHECK(o.min_bytes == 1024);
  CHECK(o.max_bytes == 1024 * 1024);
  CHECK(o.step_factor == 4);
  CHECK(o.dtype == DType::kBFloat16);
  CHECK(o.redop == RedOp::kMax);
  CHECK(o.iters == 3);
  CHECK(o.warmup == 0);
  CHECK(o.root == 2);
  CHECK(o.json);
  CHECK_FALSE(o.scaling);

  // The worker's argv parses back to the same options.
  auto back = ParseBenchArgs(ToWorkerArgs(o));
  REQUIRE(back.ok());
  CHECK(back->ops == o.ops);
  CHECK(back->min_bytes == o.min_bytes);
  CHECK(back->dtype == o.dtype);
  CHECK(back->redop == o.redop);
  CHECK(back->json);
  // The worker takes bench flags only.
  CHECK_FALSE(ParseBenchArgs({"--nproc_per_node=2"}).ok());

  auto all = SplitBenchArgs({"--op", "all", "--scaling", "--compute_ms=12.5", "--batch=8"});
  REQUIRE(all.ok());
  CHECK(all->options.ops.size() == 4);
  CHECK(all->options.scaling);
  CHECK(all->options.compute_ms == 12.5);
  CHECK(all->options.batch == 8);
}

TEST_CASE("ddprun bench: every bad flag is one line naming the flag and the fix", "[unit]") {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--sizes", "4K:"}, "--sizes: '4K:' is not MIN:MAX or SIZE; write for example 4K:256M"},
      {{"--sizes=8K:4K"}, "need 0 < MIN <= MAX"},
      {{"--sizes=4Q"}, "'4Q' is not a size up to 64G"},
      {{"--sizes=1:128G"}, "'128G' is not a size up to 64G"},
      {{"--op=alltoall"}, "--op: unknown collective 'alltoall'; use allreduce, allgather"},
      {{"--dtype=int8"}, "--dtype: the worker SDK has no 'int8' collectives; use float"},
      {{"--dtype=quad"}, "--dtype: unknown type 'quad'; use float"},
      {{"--redop=prod"}, "--redop: the worker SDK has no 'prod' reduction; use sum, avg"},
      {{"--iters=0"}, "--iters: '0' is not an integer >= 1"},
      {{"--step_factor=1"}, "--step_factor: '1' is not an integer >= 2"},
      {{"--warmup=-1"}, "--warmup: '-1' is not an integer >= 0"},
      {{"--compute_ms=abc"}, "--compute_ms: 'abc' is not a time in milliseconds"},
      {{"--json=yes"}, "--json: takes no value"},
      {{"--dtype"}, "--dtype: needs a value"},
      {{"--", "train.py"}, "takes no script"},
  };
  for (const auto& [args, want] : cases) {
    const std::string msg = ErrorOf(args);
    INFO(msg);
    CHECK(msg.rfind("ddprun bench: ", 0) == 0);
    CHECK(msg.find(want) != std::string::npos);
    CHECK(msg.find('\n') == std::string::npos);
  }
}

TEST_CASE("ddprun bench: nccl-tests' sweep, counts and bus bandwidth factors", "[unit]") {
  BenchOptions o;
  CHECK(SweepSizes(o).size() == 17);  // 4K .. 256M, factor 2
  CHECK(SweepSizes(o).front() == 4096);
  CHECK(SweepSizes(o).back() == 256u << 20);
  o.min_bytes = 1000;
  o.max_bytes = 5000;
  o.step_factor = 2;
  CHECK(SweepSizes(o) == std::vector<std::size_t>{1000, 2000, 4000});

  // allreduce: count = bytes / element size; allgather/reducescatter: per rank, bytes rounded.
  CHECK(ShapeFor(Op::kAllreduce, 4096, DType::kFloat, 3).count == 1024);
  const Shape ag = ShapeFor(Op::kAllgather, 4096, DType::kFloat, 3);
  CHECK(ag.count == 341);
  CHECK(ag.in_count == 341);
  CHECK(ag.out_count == 1023);
  CHECK(ag.bytes == 4092);
  const Shape rs = ShapeFor(Op::kReduceScatter, 4096, DType::kHalf, 4);
  CHECK(rs.count == 512);
  CHECK(rs.in_count == 2048);
  CHECK(rs.bytes == 4096);

  CHECK(BusBandwidthFactor(Op::kAllreduce, 4) == Approx(1.5));
  CHECK(BusBandwidthFactor(Op::kAllgather, 4) == Approx(0.75));
  CHECK(BusBandwidthFactor(Op::kReduceScatter, 8) == Approx(0.875));
  CHECK(BusBandwidthFactor(Op::kBroadcast, 8) == Approx(1.0));
  CHECK(BusBandwidthFactor(Op::kAllreduce, 1) == Approx(0.0));
  const Timing t = MakeTiming(Op::kAllreduce, 1000000, 2, 1e-3, 0);
  CHECK(t.time_us == Approx(1000));
  CHECK(t.algbw_gbs == Approx(1.0));
  CHECK(t.busbw_gbs == Approx(1.0));

  CHECK(ScalingWorlds(1) == std::vector<int>{1});
  CHECK(ScalingWorlds(4) == std::vector<int>{1, 2, 4});
  CHECK(ScalingWorlds(6) == std::vector<int>{1, 2, 4, 6});
  // Across nodes: node 0's sizes, then whole nodes.
  CHECK(ScalingWorldsAcrossNodes(2, 1) == std::vector<int>{1, 2});
  CHECK(ScalingWorldsAcrossNodes(2, 2) == std::vector<int>{1, 2, 4});
  CHECK(ScalingWorldsAcrossNodes(8, 2) == std::vector<int>{1, 2, 4, 8, 16});
  CHECK(ScalingWorldsAcrossNodes(8, 3) == std::vector<int>{1, 2, 4, 8, 16, 24});
  CHECK(ScalingWorldsAcrossNodes(3, 8) == std::vector<int>{1, 2, 3, 6, 12, 24});
  CHECK(ScalingWorldsAcrossNodes(1, 4) == std::vector<int>{1, 2, 4});
}

TEST_CASE("ddprun bench prints nccl-tests' table: header, rows, footer", "[unit]") {
  const std::vector<std::string> header = absl::StrSplit(FormatHeader(), '\n');
  REQUIRE(header.size() == 5);  // "#", three header lines, and the final empty piece
  CHECK(header[2] ==
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     "
        "time   algbw   busbw #wrong");
  CHECK(header[3].find("(B)    (elements)") != std::string::npos);

  Row r;
  r.op = Op::kAllreduce;
  r.shape = ShapeFor(Op::kAllreduce, 1 << 20, DType::kFloat, 2);
  r.out_of_place = MakeTiming(Op::kAllreduce, r.shape.bytes, 2, 150e-6, 0);
  r.in_place = MakeTiming(Op::kAllreduce, r.shape.bytes, 2, 12345e-6, 3);
  const std::string line = FormatRow(r);
  CHECK(line ==
        "     1048576        262144     float     sum      -1    150.0    6.99    6.99      0    "
        "12345    0.08    0.08      3\n");
  // Columns line up with the header's.
  CHECK(line.size() == header[2].size() + 1);

  const std::string footer = FormatFooter({r});
  CHECK(footer.find("# Out of bounds values : 3 FAILED\n") != std::string::npos);
  CHECK(footer.find("# Avg bus bandwidth    : ") != std::string::npos);
  CHECK(AvgBusBandwidth({r}) == Approx((6.99050667 + 0.0849397) / 2).epsilon(1e-3));

  const std::string json = FormatJson(2, "gloo (shared memory)", {r});
  CHECK(json.find("\"wrong\": 3") != std::string::npos);
  CHECK(json.find("\"op\": \"allreduce\"") != std::string::npos);
}

}  // namespace
}  // namespace ddprun::launcher::bench

namespace ddprun::launcher {
namespace {

TEST_CASE("ddprun bench finds its worker next to ddprun, else in ../libexec/ddprun", "[unit]") {
  namespace fs = std::filesystem;
  char tmpl[] = "/tmp/ddprun-benchfind-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const fs::path root = tmpl;
  fs::create_directories(root / "bin");
  fs::create_directories(root / "libexec" / "ddprun");
  const std::string self = (root / "bin" / "ddprun").string();
  auto make_exe = [](const fs::path& p, bool exec) {
    std::ofstream(p) << "#!/bin/sh\n";
    fs::permissions(p, exec ? fs::perms::owner_all : fs::perms::owner_read);
  };
  CHECK(FindBenchWorker(self).empty());
  make_exe(root / "libexec" / "ddprun" / "ddprun-bench-worker", false);
  CHECK(FindBenchWorker(self).empty());  // not executable
  make_exe(root / "libexec" / "ddprun" / "ddprun-bench-worker", true);
  CHECK(FindBenchWorker(self) == (root / "libexec" / "ddprun" / "ddprun-bench-worker").string());
  make_exe(root / "bin" / "ddprun-bench-worker", true);
  CHECK(FindBenchWorker(self) == (root / "bin" / "ddprun-bench-worker").string());
  fs::remove_all(root);
}

}  // namespace
}  // namespace ddprun::launcher
