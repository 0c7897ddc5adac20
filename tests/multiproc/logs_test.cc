// Worker output with real ddprun processes: --log_dir layout (one attempt
// directory per round), -r/--redirects, -t/--tee with torchrun's [default0]:
// prefixes (ddprun's host-aware one through --log_line_prefix_template),
// --local_ranks_filter, --prefix_output, and the failure report's
// stderr tail, error-file message and log file, on one node and through the
// daemon on two.
#include <unistd.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "support/process_helpers.h"

using namespace ddprun::test;

namespace {

// A worker script: one line on each stream, then, on global rank
// $FAIL_RANK (and restart count $FAIL_RESTART when set), a torchelastic
// error file, 30 stderr lines and exit 3.
const char* kWorkerScript = R"(#!/bin/sh
echo "out of rank $RANK local $LOCAL_RANK restart $TORCHELASTIC_RESTART_COUNT"
echo "err of rank $RANK local $LOCAL_RANK" >&2
if [ "$RANK" = "${FAIL_RANK:-none}" ] && [ "${FAIL_RESTART:-$TORCHELASTIC_RESTART_COUNT}" = "$TORCHELASTIC_RESTART_COUNT" ]; then
  printf '{"message": {"message": "RuntimeError: boom on rank %s", "extraInfo": {"py_callstack": "Traceback (most recent call last):\\n  File \\"train.py\\", line 3", "timestamp": "1700000000"}}}' "$RANK" > "$TORCHELASTIC_ERROR_FILE"
  i=1
  while [ $i -le 30 ]; do echo "err line $i" >&2; i=$((i+1)); done
  exit 3
fi
exit 0
)";

std::string WriteScript(Harness& h) { return h.Script("worker.sh", kWorkerScript); }

std::string ShortHostname() {
  char buf[256] = {};
  REQUIRE(::gethostname(buf, sizeof(buf) - 1) == 0);
  std::string h = buf;
  return h.substr(0, h.find('.'));
}

bool Has(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

// The failure report: everything from its first line on.
std::string Report(const std::string& err) {
  std::size_t at = err.find(" failed: ");
  if (at == std::string::npos) return "";
  return err.substr(err.rfind('\n', at) == std::string::npos ? 0 : err.rfind('\n', at) + 1);
}

// <logs>/<id>_<8 random characters>: torchrun's run directory (mkdtemp in
// --log_dir). Exactly one per launcher; "" (and a failed check) otherwise.
std::string RunDir(const std::string& logs, const std::string& id) {
  std::vector<std::string> runs;
  for (const std::string& n : ListDir(logs))
    if (n.rfind(id + "_", 0) == 0 && n.size() == id.size() + 9) runs.push_back(n);
  CHECK(runs.size() == 1);
  return runs.size() == 1 ? logs + "/" + runs[0] : std::string();
}

}  // namespace

TEST_CASE("-r 3 --log_dir: worker output only in <log_dir>/<id>_<suffix>/attempt_<N>/<rank>/",
          "[multiproc]") {
  Harness h;
  const std::string script = WriteScript(h);
  const std::string logs = h.dir() + "/logs";
  Proc& p = h.StartDdprun(
      "ddprun", {"--nproc_per_node=2", "--rdzv_id=logjob", "-r", "3", "--log_dir", logs, script});
  REQUIRE(h.Wait(p, 20) == 0);
  INFO("stderr:\n" << p.Err());
  CHECK_FALSE(Has(p.Out(), "out of rank"));  // redirected: nothing on the console
  CHECK_FALSE(Has(p.Err(), "err of rank"));
  const std::string run = RunDir(logs, "logjob");
  const std::string a = run + "/attempt_0/";
  for (int r = 0; r < 2; ++r) {
    const std::string d = a + std::to_string(r) + "/";
    CHECK(ReadFile(d + "stdout.log") ==
          "out of rank " + std::to_string(r) + " local " + std::to_string(r) + " restart 0\n");
    CHECK(ReadFile(d + "stderr.log") ==
          "err of rank " + std::to_string(r) + " local " + std::to_string(r) + "\n");
  }
  CHECK(ListDir(run) == std::vector<std::string>{"attempt_0"});
}

TEST_CASE("-t 3: files and a prefixed console; --local_ranks_filter shows only some ranks",
          "[multiproc]") {
  Harness h;
  const std::string script = WriteScript(h);
  SECTION("tee") {
    const std::string logs = h.dir() + "/logs";
    Proc& p = h.StartDdprun("ddprun", {"--nproc_per_node=3", "--rdzv_id=teejob", "--tee=3",
                                       "--log_dir=" + logs, script});
    REQUIRE(h.Wait(p, 20) == 0);
    const std::string out = p.Out(), err = p.Err();
    INFO("stdout:\n" << out << "\nstderr:\n" << err);
    for (int r = 0; r < 3; ++r) {
      const std::string rs = std::to_string(r);
      const std::string prefix = "[default" + rs + "]:";  // torchrun's
      CHECK(Has(out, prefix + "out of rank " + rs + " local " + rs + " restart 0\n"));
      CHECK(Has(err, prefix + "err of rank " + rs + " local " + rs + "\n"));
      CHECK(Has(ReadFile(RunDir(logs, "teejob") + "/attempt_0/" + rs + "/stdout.log"),
                "out of rank " + rs));
    }
    // Every worker line on the console carries a prefix.
    for (const std::string& line : Lines(out)) CHECK(line.rfind("[default", 0) == 0);
  }
  SECTION("filter") {
    const std::string logs = h.dir() + "/logs";
    Proc& p = h.StartDdprun("ddprun", {"--nproc_per_node=3", "--rdzv_id=filtjob", "-t", "3",
                                       "--local_ranks_filter=1", "--log_dir", logs, script});
    REQUIRE(h.Wait(p, 20) == 0);
    const std::string out = p.Out(), err = p.Err();
    INFO("stdout:\n" << out << "\nstderr:\n" << err);
    CHECK(Has(out, "[default1]:out of rank 1"));
    CHECK_FALSE(Has(out, "out of rank 0"));
    CHECK_FALSE(Has(out, "out of rank 2"));
    CHECK_FALSE(Has(err, "err of rank 0"));
    // Files are unaffected by the filter.
    for (int r = 0; r < 3; ++r)
      CHECK(
          Has(ReadFile(RunDir(logs, "filtjob") + "/attempt_0/" + std::to_string(r) + "/stdout.log"),
              "out of rank " + std::to_string(r)));
  }
  SECTION("filter without redirects: hidden ranks' output goes nowhere") {
    Proc& p = h.StartDdprun("ddprun", {"--nproc_per_node=3", "--local_ranks_filter=0,2", script});
    REQUIRE(h.Wait(p, 20) == 0);
    const std::string out = p.Out(), err = p.Err();
    INFO("stdout:\n" << out << "\nstderr:\n" << err);
    CHECK(Has(out, "out of rank 0 local 0"));  // unprefixed: no -t, no --prefix_output
    CHECK(Has(out, "out of rank 2 local 2"));
    CHECK_FALSE(Has(out, "out of rank 1"));
    CHECK_FALSE(Has(err, "err of rank 1"));
    CHECK(Has(err, "err of rank 2"));
  }
}

TEST_CASE("--prefix_output prefixes console lines without any file", "[multiproc]") {
  Harness h;
  const std::string script = WriteScript(h);
  const std::string host = ShortHostname();
  const std::string tmp = h.MakeDir("tmp");
  Proc& p =
      h.StartDdprun("ddprun", {"--nproc_per_node=2", "--prefix_output", script}, {{"TMPDIR", tmp}});
  REQUIRE(h.Wait(p, 20) == 0);
  const std::string out = p.Out(), err = p.Err();
  INFO("stdout:\n" << out << "\nstderr:\n" << err);
  CHECK(Has(out, "[default0]:out of rank 0 local 0 restart 0\n"));
  CHECK(Has(out, "[default1]:out of rank 1 local 1 restart 0\n"));
  CHECK(Has(err, "[default1]:err of rank 1 local 1\n"));
  // ddprun's host-aware prefix, one template away; the flag beats the variable.
  Proc& q =
      h.StartDdprun("ddprun2",
                    {"--nproc_per_node=2", "--prefix_output",
                     "--log-line-prefix-template=[${hostname}:${rank}:${local_rank}]:", script},
                    {{"TMPDIR", tmp}, {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "env:"}});
  REQUIRE(h.Wait(q, 20) == 0);
  CHECK(Has(q.Out(), "[" + host + ":1:1]:out of rank 1 local 1 restart 0\n"));
  Proc& e = h.StartDdprun("ddprun3", {"--nproc_per_node=1", "--prefix_output", script},
                          {{"TMPDIR", tmp}, {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "$rank>"}});
  REQUIRE(h.Wait(e, 20) == 0);
  CHECK(Has(e.Out(), "0>out of rank 0"));
  // The temporary directory of the error files is gone: it held no logs.
  CHECK(ListDir(tmp).empty());
}

TEST_CASE("default output: raw console, workers' error files in a temporary directory",
          "[multiproc]") {
  Harness h;
  const std::string script = WriteScript(h);
  const std::string tmp = h.MakeDir("tmp");
  Proc& p = h.StartDdprun("ddprun", {"--nproc_per_node=2", script}, {{"TMPDIR", tmp}});
  REQUIRE(h.Wait(p, 20) == 0);
  const std::string out = p.Out(), err = p.Err();
  INFO("stdout:\n" << out << "\nstderr:\n" << err);
  REQUIRE(Lines(out).size() == 2);
  for (const std::string& line : Lines(out)) CHECK(line.rfind("out of rank", 0) == 0);
  CHECK(Has(err, "err of rank 0 local 0\n"));
  CHECK(Has(err, "err of rank 1 local 1\n"));
  CHECK(ListDir(tmp).empty());
}

TEST_CASE("failure report: stderr tail, error-file message and the log file", "[multiproc]") {
  Harness h;
  const std::string script = WriteScript(h);
  const std::string logs = h.dir() + "/logs";
  Proc& p = h.StartDdprun(
      "ddprun", {"--nproc_per_node=3", "--rdzv_id=failjob", "-r", "2", "--log_dir", logs, script},
      {{"FAIL_RANK", "1"}});
  REQUIRE(h.Wait(p, 20) == 1);
  const std::string err = p.Err();
  INFO("stderr:\n" << err);
  const std::string report = Report(err);
  REQUIRE_FALSE(report.empty());
  CHECK(Has(report, "worker rank 1 (local rank 1) on 127.0.0.1 exited with exit code 3"));
  CHECK(Has(report, "ddprun:   error: RuntimeError: boom on rank 1\n"));
  const std::string log_file = RunDir(logs, "failjob") + "/attempt_0/1/stderr.log";
  CHECK(Has(report, "ddprun:   log: " + log_file + "\n"));
  CHECK(Has(report, "ddprun:   stderr (last 20 lines):\n"));
  CHECK(Has(report, "ddprun:   | err line 11\n"));
  CHECK(Has(report, "ddprun:   | err line 30\n"));
  CHECK_FALSE(Has(report, "err line 10\n"));
  // stderr was redirected (-r 2): not on the console, all of it in the file.
  CHECK_FALSE(Has(err.substr(0, err.size() - report.size()), "err line"));
  CHECK(Has(ReadFile(log_file), "err line 1\n"));
  CHECK(Has(ReadFile(log_file), "err line 30\n"));
  CHECK(Has(ReadFile(RunDir(logs, "failjob") + "/attempt_0/1/error.json"),
            "RuntimeError: boom on rank 1"));
}

TEST_CASE("failure report without any log flag still has the tail and the error message",
          "[multiproc]") {
  Harness h;
  const std::string script = WriteScript(h);
  Proc& p = h.StartDdprun("ddprun", {"--nproc_per_node=2", script}, {{"FAIL_RANK", "0"}});
  REQUIRE(h.Wait(p, 20) == 1);
  const std::string err = p.Err();
  INFO("stderr:\n" << err);
  const std::string report = Report(err);
  CHECK(Has(report, "ddprun:   error: RuntimeError: boom on rank 0\n"));
  CHECK(Has(report, "ddprun:   | err line 30\n"));
  CHECK_FALSE(Has(report, "ddprun:   log: "));  // no log file to point at
  // The worker's stderr also reached the console, before the report.
  CHECK(err.find("err line 30\n") < err.find(" failed: "));
}

TEST_CASE("--stderr_tail_lines=0: stderr unpiped, no tail in the report", "[multiproc]") {
  Harness h;
  const std::string script = WriteScript(h);
  Proc& p = h.StartDdprun("ddprun", {"--nproc_per_node=2", "--stderr_tail_lines=0", script},
                          {{"FAIL_RANK", "1"}});
  REQUIRE(h.Wait(p, 20) == 1);
  const std::string err = p.Err();
  INFO("stderr:\n" << err);
  const std::string report = Report(err);
  CHECK(Has(report, "ddprun:   error: RuntimeError: boom on rank 1\n"));
  CHECK_FALSE(Has(report, "stderr (last"));
  CHECK(Has(err, "err line 30\n"));
}

TEST_CASE("one attempt directory per restart count, attempt_<TORCHELASTIC_RESTART_COUNT>",
          "[multiproc]") {
  Harness h;
  const std::string script = WriteScript(h);
  const std::string logs = h.dir() + "/logs";
  Proc& p = h.StartDdprun("ddprun",
                          {"--nproc_per_node=2", "--max_restarts=1", "--rdzv_id=rjob", "-t", "1",
                           "--log_dir", logs, script},
                          {{"FAIL_RANK", "1"}, {"FAIL_RESTART", "0"}});
  REQUIRE(h.Wait(p, 30) == 0);
  INFO("stderr:\n" << p.Err());
  const std::string run = RunDir(logs, "rjob");
  std::vector<std::string> attempts = ListDir(run);
  std::sort(attempts.begin(), attempts.end());
  // As torchrun: attempt_<TORCHELASTIC_RESTART_COUNT>.
  CHECK(attempts == std::vector<std::string>{"attempt_0", "attempt_1"});
  for (int r = 0; r < 2; ++r) {
    const std::string rs = std::to_string(r);
    CHECK(Has(ReadFile(run + "/attempt_0/" + rs + "/stdout.log"), "restart 0"));
    CHECK(Has(ReadFile(run + "/attempt_1/" + rs + "/stdout.log"), "restart 1"));
  }
  CHECK(Has(ReadFile(run + "/attempt_0/1/error.json"), "boom on rank 1"));
}

TEST_CASE("two nodes through ddprund: every node's report has the failed worker's tail",
          "[multiproc]") {
  Harness h;
  const std::string script = WriteScript(h);
  const int port = h.StartDaemon("ddprund");
  std::vector<Proc*> nodes;
  for (int i = 0; i < 2; ++i) {
    const std::string logs = h.dir() + "/logs" + std::to_string(i);
    nodes.push_back(
        &h.StartDdprun("node" + std::to_string(i),
                       {"--nnodes=2", "--nproc_per_node=2", "--node_rank=" + std::to_string(i),
                        "--local_addr=127.0.0." + std::to_string(i + 1),
                        "--rdzv_endpoint=127.0.0.1:" + std::to_string(port), "--rdzv_id=twonode",
                        "--tee=3", "--log_dir=" + logs,
                        "--log_line_prefix_template=[${hostname}:${rank}:${local_rank}]:", script},
                       {{"FAIL_RANK", "3"}}));
  }
  for (Proc* n : nodes) {
    REQUIRE(h.Wait(*n, 30) == 1);
  }
  // Node 1 runs global ranks 2-3 and, with the host-aware template, prefixes
  // with its --local_addr. (Node
  // 0's workers may be stopped by the job's end before they print.)
  CHECK(Has(nodes[1]->Out(), "[127.0.0.2:3:1]:out of rank 3 local 1"));
  for (Proc* n : nodes) {
    const std::string report = Report(n->Err());
    INFO(n->name << " stderr:\n" << n->Err());
    CHECK(Has(report, "worker rank 3 (local rank 1) on 127.0.0.2 exited with exit code 3"));
    CHECK(Has(report, "ddprun:   error: RuntimeError: boom on rank 3\n"));
    CHECK(Has(report, "ddprun:   | err line 30\n"));
    CHECK(Has(report, "ddprun:   log: " + RunDir(h.dir() + "/logs1", "twonode") + "/attempt_"));
  }
}
