// The job file: a table of bad files with their exact one-line errors, the
// file's good forms, and its reads (missing, directory, huge).
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "ddprun/launcher/job_config.h"

namespace ddprun::launcher {
namespace {

namespace fs = std::filesystem;

struct BadFile {
  const char* name;
  const char* text;
  const char* error;
};

// Each entry: the file's text and the exact message (FILE:LINE:COL: key: problem; fix).
// A bad knob value reads as its flag's does (value_parsers.h; knobs_test.cc
// checks that the two agree).
const BadFile kBadFiles[] = {
    {"nproc_per_node 0", "nproc_per_node: 0\n",
     "job.yaml:1:17: nproc_per_node: must be a positive number of workers, 'cpu', 'gpu', 'xpu' or "
     "'auto', "
     "got '0'"},
    {"unknown top-level key", "nproc_per_nod: 4\n",
     "job.yaml:1:1: nproc_per_nod: unknown key (did you mean 'nproc_per_node'?); valid keys here "
     "are job, rendezvous, nodes, scheduler, nproc_per_node, role, command, args, module, "
     "no_python, restart, cpu_bind, logs, monitoring, environment, nccl, checkpoint"},
    {"an abbreviated key (issue 33 item 11: docs/ha.md showed rdzv:)",
     "rdzv:\n  endpoint: 127.0.0.1\n",
     "job.yaml:1:1: rdzv: unknown key (did you mean 'rendezvous'?); valid keys here are job, "
     "rendezvous, nodes, scheduler, nproc_per_node, role, command, args, module, no_python, "
     "restart, cpu_bind, logs, monitoring, environment, nccl, checkpoint"},
    {"min > max", "nodes:\n  count: 4:2\n",
     "job.yaml:2:10: nodes.count: must be N or MIN:MAX with 0 < MIN <= MAX (e.g. 2 or 1:4), got "
     "'4:2'"},
    {"duplicate host", "nodes:\n  hosts:\n    - a\n    - b\n    - a\n",
     "job.yaml:5:7: nodes.hosts[2]: duplicate host 'a' (also at job.yaml:3:7); list each host "
     "once; slots sets its number of workers"},
    {"duplicate host, different case", "nodes:\n  hosts: [gpu1, GPU1]\n",
     "job.yaml:2:17: nodes.hosts[1]: duplicate host 'GPU1' (also at job.yaml:2:11); list each host "
     "once; slots sets its number of workers"},
    {"unknown nccl key with a near match", "nccl:\n  socket_ifnam: eth0\n",
     "job.yaml:2:3: nccl.socket_ifnam: unknown NCCL setting (did you mean 'socket_ifname'?); use "
     "socket_ifname, ib_hca, debug, debug_subsys, buffsize, p2p_disable, shm_disable, or an NCCL "
     "variable verbatim (e.g. NCCL_SOCKET_IFNAM)"},
    {"unknown nccl key", "nccl:\n  algo: Ring\n",
     "job.yaml:2:3: nccl.algo: unknown NCCL setting; use socket_ifname, ib_hca, debug, "
     "debug_subsys, buffsize, p2p_disable, shm_disable, or an NCCL variable verbatim (e.g. "
     "NCCL_ALGO)"},
    {"tab indentation", "job:\n\tid: x\n",
     "job.yaml:2:1: (indentation): a tab character; indent with spaces"},
    {"top level is a list", "- a\n- b\n",
     "job.yaml:1:1: (top level): must be a mapping of keys, got a list; write key: value lines "
     "such as nproc_per_node: 4, see configs/ and docs/config.md"},
    {"top level is a scalar", "just a string\n",
     "job.yaml:1:1: (top level): must be a mapping of keys, got a value; write key: value lines "
     "such as nproc_per_node: 4, see configs/ and docs/config.md"},
    {"empty file", "",
     "job.yaml:1:1: (top level): the file has no settings; describe the job as a mapping, see "
     "configs/ and docs/config.md"},
    {"only comments", "# nothing here\n",
     "job.yaml:1:1: (top level): the file has no settings; describe the job as a mapping, see "
     "configs/ and docs/config.md"},
    {"wrong type: list for nproc", "nproc_per_node: [1, 2]\n",
     "job.yaml:1:17: nproc_per_node: must be a single value, got a list; write one value: "
     "N|cpu|gpu|xpu|auto"},
    {"nproc not a number", "nproc_per_node: many\n",
     "job.yaml:1:17: nproc_per_node: must be a positive number of workers, 'cpu', 'gpu', 'xpu' or "
     "'auto', "
     "got 'many'"},
    {"negative max_restarts", "restart:\n  max_restarts: -1\n",
     "job.yaml:2:17: restart.max_restarts: must be a non-negative integer, got '-1'"},
    {"fractional max_restarts", "restart:\n  max_restarts: 2.5\n",
     "job.yaml:2:17: restart.max_restarts: must be a non-negative integer, got '2.5'"},
    {"grace_period not a number", "restart:\n  grace_period: soon\n",
     "job.yaml:2:17: restart.grace_period: must be a non-negative number of seconds, got 'soon'"},
    {"join_timeout 0", "rendezvous:\n  join_timeout: 0\n",
     "job.yaml:2:17: rendezvous.join_timeout: must be a positive number of seconds, got '0'"},
    {"endpoint port out of range", "rendezvous:\n  endpoint: host:99999\n",
     "job.yaml:2:13: rendezvous.endpoint: must be HOST[:PORT] (e.g. node0:29400), the port must be "
     "1..65535; got 'host:99999'"},
    {"etcd backend", "rendezvous:\n  backend: etcd\n",
     "job.yaml:2:12: rendezvous.backend: 'etcd' is not supported; use c10d (ddprund or single "
     "node) or static"},
    {"node count 0", "nodes: 0\n",
     "job.yaml:1:8: nodes.count: must be N or MIN:MAX with 0 < MIN <= MAX (e.g. 2 or 1:4), got "
     "'0'"},
    {"node count not a number", "nodes:\n  count: 2:x\n",
     "job.yaml:2:10: nodes.count: must be N or MIN:MAX with 0 < MIN <= MAX (e.g. 2 or 1:4), got "
     "'2:x'"},
    {"slots 0", "nodes:\n  hosts:\n    - host: a\n      slots: 0\n",
     "job.yaml:4:14: nodes.hosts[0].slots: must be a positive integer, got '0'; write the number "
     "of workers on this host, e.g. slots: 4"},
    {"slots disagree", "nodes:\n  hosts:\n    - a slots=4\n    - b slots=2\n",
     "job.yaml:4:7: nodes.hosts: host 'b' has slots=2 but 'a' has slots=4; give every host the "
     "same slots (ddprun runs the same number of workers per node)"},
    {"nproc disagrees with slots", "nproc_per_node: 4\nnodes:\n  hosts:\n    - a slots=2\n",
     "job.yaml:1:17: nproc_per_node: is 4 but the hosts have slots=2 (job.yaml:4:7); make them "
     "agree or drop one of them"},
    {"count min above the host list", "nodes:\n  count: 3\n  hosts: [a, b]\n",
     "job.yaml:2:10: nodes.count: needs at least 3 nodes but nodes.hosts lists 2; list more hosts "
     "or lower the minimum"},
    {"empty host list", "nodes:\n  hosts: []\n",
     "job.yaml:2:10: nodes.hosts: is an empty list; list at least one host, or drop the key"},
    {"misspelt host key", "nodes:\n  hosts:\n    - {host: a, slot: 2}\n",
     "job.yaml:3:17: nodes.hosts[0].slot: unknown key (did you mean 'slots'?); valid keys here are "
     "host, slots"},
    {"bad hostfile line", "nodes:\n  hosts:\n    - a gpus=4\n",
     "job.yaml:3:7: nodes.hosts[0]: 'a gpus=4' is not 'HOST slots=N'; write a host name or "
     "address, 'HOST slots=N' or {host: HOST, slots: N}"},
    {"p2p_disable not a bool", "nccl:\n  p2p_disable: maybe\n",
     "job.yaml:2:16: nccl.p2p_disable: must be true or false, got 'maybe'; write true (disable) or "
     "false"},
    {"negative buffsize", "nccl:\n  buffsize: -4\n",
     "job.yaml:2:13: nccl.buffsize: must be a positive number of bytes, got '-4'; write e.g. "
     "4194304 (4 MiB, NCCL's default)"},
    {"unknown debug level", "nccl:\n  debug: LOUD\n",
     "job.yaml:2:10: nccl.debug: must be VERSION, WARN, INFO or TRACE, got 'LOUD'; write e.g. "
     "debug: WARN"},
    {"nccl variable twice", "nccl:\n  socket_ifname: eth0\n  NCCL_SOCKET_IFNAME: eth1\n",
     "job.yaml:3:3: nccl.NCCL_SOCKET_IFNAME: NCCL_SOCKET_IFNAME is given twice; keep one of them"},
    {"reserved environment name", "environment:\n  set:\n    RANK: \"3\"\n",
     "job.yaml:3:5: environment.set.RANK: RANK is set by ddprun for every worker; remove it; "
     "ddprun gives each worker its own value"},
    {"bad environment name", "environment:\n  set:\n    1BAD: x\n",
     "job.yaml:3:5: environment.set.1BAD: '1BAD' is not a variable name; use letters, digits and "
     "'_', not starting with a digit"},
    {"pass is not a list", "environment:\n  pass: HOME\n",
     "job.yaml:2:9: environment.pass: must be a list of names, got a value; write pass: [HF_HOME, "
     "WANDB_API_KEY]"},
    {"environment value is a list", "environment:\n  set: {A: [1, 2]}\n",
     "job.yaml:2:12: environment.set.A: must be a single value, got a list; write a single value "
     "(quote it if needed)"},
    {"variable in set and nccl", "environment:\n  set: {NCCL_DEBUG: INFO}\nnccl:\n  debug: WARN\n",
     "job.yaml:4:3: nccl.debug: NCCL_DEBUG is given twice; keep one of them"},
    {"empty command", "command: []\n",
     "job.yaml:1:10: command: is an empty list; write the script and its arguments: command: "
     "train.py, or command: [train.py, --epochs, 3]"},
    {"args without command", "args: [--x]\n",
     "job.yaml:1:7: args: is given without command; add command: SCRIPT above it"},
    {"module not a bool", "module: maybe\n",
     "job.yaml:1:9: module: must be true or false, got 'maybe'"},
    {"module and no_python", "module: true\nno_python: true\n",
     "job.yaml:2:12: no_python: cannot be combined with module: true; drop one"},
    {"redirects out of range", "logs:\n  redirects: 5\n",
     "job.yaml:2:14: logs.redirects: must be 0 (none), 1 (stdout), 2 (stderr), 3 (both) or a "
     "per-local-rank map like 0:3,1:2; got '5'"},
    {"local_ranks_filter not ranks", "logs:\n  local_ranks_filter: [a]\n",
     "job.yaml:2:23: logs.local_ranks_filter: must be a comma-separated list of local ranks like "
     "0,1; got 'a'"},
    {"unknown scheduler", "scheduler: pbs\n",
     "job.yaml:1:12: scheduler: must be auto, slurm, mpi or none, got 'pbs'; auto detects Slurm "
     "and OpenMPI/PMIx, none turns detection off"},
    {"duplicate key", "nproc_per_node: 2\nnproc_per_node: 3\n",
     "job.yaml:2:1: nproc_per_node: duplicate key; keep one of them"},
    {"two documents", "job: {id: a}\n---\njob: {id: b}\n",
     "job.yaml:3:1: (document): a second YAML document ('---'); keep one job per file"},
    {"static with a range",
     "nodes: {count: \"2:4\", hosts: [a, b]}\nrendezvous: {backend: static}\n",
     "job.yaml:1:16: nodes.count: static rendezvous needs a fixed count, got 2:4; write one "
     "number, or use backend: c10d for an elastic job"},
    {"YAML syntax error", "key: [unclosed\n",
     "job.yaml:2:1: (syntax): end of sequence flow not found; fix the YAML syntax"},
    {"misspelt nested key", "rendezvous:\n  tokn: x\n",
     "job.yaml:2:3: rendezvous.tokn: unknown key (did you mean 'token'?); valid keys here are "
     "backend, endpoint, token, join_timeout, last_call_timeout, tls_ca, tls_cert, tls_key, "
     "web_config"},
    {"nccl is not a mapping", "nccl: eth0\n",
     "job.yaml:1:7: nccl: must be a mapping, got a value; write settings such as socket_ifname: "
     "eth0 indented below it"},
    {"section is a scalar", "restart: 3\n",
     "job.yaml:1:10: restart: must be a mapping of keys, got a value; write its keys "
     "(max_restarts, policy, warm_modules, grace_period, signals_to_handle, forward_signals) "
     "indented below it"},
    {"job id with a space", "job:\n  id: has space\n",
     "job.yaml:2:7: job.id: is not a valid job id: the job id 'has space' contains a space; use "
     "1-256 letters, digits and '-', '_', '.', ':', '@', '+', not starting with '-' or '.'"},
    {"key with no value", "nproc_per_node:\n",
     "job.yaml:2:1: nproc_per_node: has no value; write one value: N|cpu|gpu|xpu|auto"},
};

TEST_CASE("job file: each bad file gives its exact one-line error", "[unit]") {
  STATIC_REQUIRE(sizeof(kBadFiles) / sizeof(kBadFiles[0]) >= 30);
  for (const BadFile& bad : kBadFiles) {
    INFO("case: " << bad.name << "\n" << bad.text);
    auto job = ParseJobConfig(bad.text, "job.yaml");
    REQUIRE_FALSE(job.ok());
    CHECK(job.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(job.status().message()) == bad.error);
    CHECK(std::string(job.status().message()).find('\n') == std::string::npos);
  }
}

TEST_CASE("job file: a full file parses into values with positions", "[unit]") {
  const std::string text =
      "job:\n"
      "  id: train-42\n"
      "  name: resnet\n"
      "rendezvous:\n"
      "  endpoint: first_node:29555\n"
      "  token: s3cret\n"
      "  join_timeout: 90\n"
      "  last_call_timeout: 5\n"
      "nodes:\n"
      "  count: 2:4\n"
      "  hosts:\n"
      "    - gpu1 slots=8\n"
      "    - {host: gpu2, slots: 8}\n"
      "    - gpu3\n"
      "command: [train.py, --epochs, \"3\"]\n"
      "args: [--lr, \"0.1\"]\n"
      "restart: {max_restarts: 3, grace_period: 5}\n"
      "logs: {log_dir: /tmp/l, redirects: {0: 3, 1: 2}, tee: 1, local_ranks_filter: [0, 1]}\n"
      "environment:\n"
      "  set: {OMP_NUM_THREADS: 4, EMPTY: }\n"
      "  pass: [HOME]\n"
      "nccl:\n"
      "  socket_ifname: eth0\n"
      "  ib_hca: mlx5_0\n"
      "  debug: info\n"
      "  debug_subsys: INIT,NET\n"
      "  buffsize: 4194304\n"
      "  p2p_disable: true\n"
      "  shm_disable: no\n"
      "  NCCL_ALGO: Ring\n";
  auto job = ParseJobConfig(text, "j.yaml");
  REQUIRE(job.ok());
  CHECK(job->name == "resnet");
  CHECK(job->values.at("job.id").text == "train-42");
  CHECK(job->values.at("job.id").location == "j.yaml:2:7");
  CHECK(job->values.at("nodes.count").text == "2:4");
  CHECK(job->values.at("rendezvous.endpoint").text == "first_node:29555");
  CHECK(job->values.at("logs.redirects").text == "0:3,1:2");
  CHECK(job->values.at("logs.local_ranks_filter").text == "0,1");
  REQUIRE(job->hosts.size() == 3);
  CHECK(job->hosts[0].host == "gpu1");
  CHECK(job->hosts[0].slots == 8);
  CHECK(job->hosts[1].host == "gpu2");
  CHECK(job->hosts[2].slots == 0);
  CHECK(job->command == std::vector<std::string>{"train.py", "--epochs", "3", "--lr", "0.1"});
  REQUIRE(job->env_set.size() == 2);
  CHECK(job->env_set[0].first == "OMP_NUM_THREADS");
  CHECK(job->env_set[0].second.text == "4");
  CHECK(job->env_set[1].second.text == "");
  REQUIRE(job->env_pass.size() == 1);
  std::map<std::string, std::string> nccl;
  for (const auto& [k, v] : job->nccl) nccl[k] = v.text;
  CHECK(nccl == std::map<std::string, std::string>{{"NCCL_SOCKET_IFNAME", "eth0"},
                                                   {"NCCL_IB_HCA", "mlx5_0"},
                                                   {"NCCL_DEBUG", "INFO"},
                                                   {"NCCL_DEBUG_SUBSYS", "INIT,NET"},
                                                   {"NCCL_BUFFSIZE", "4194304"},
                                                   {"NCCL_P2P_DISABLE", "1"},
                                                   {"NCCL_SHM_DISABLE", "0"},
                                                   {"NCCL_ALGO", "Ring"}});
  const auto flags = job->FlagValues();
  CHECK(flags.at("nnodes").value == "2:4");
  CHECK(flags.at("nnodes").origin == Origin::kFile);
  CHECK(flags.at("nnodes").source == "j.yaml:10:10: nodes.count");
  CHECK(flags.at("nproc_per_node").value == "8");  // from the hosts' slots
  CHECK(flags.at("rdzv_id").value == "train-42");
  CHECK(flags.at("rdzv_conf.join_timeout").value == "90");
  CHECK(flags.at("rdzv_conf.token").value == "s3cret");
  CHECK(flags.at("max_restarts").value == "3");
  CHECK(flags.at("log_dir").value == "/tmp/l");
}

TEST_CASE("job file: nodes as a bare list or a bare count", "[unit]") {
  auto list = ParseJobConfig("nodes: [a, b, c]\n", "j.yaml");
  REQUIRE(list.ok());
  CHECK(list->hosts.size() == 3);
  CHECK(list->FlagValues().at("nnodes").value == "3");
  auto count = ParseJobConfig("nodes: \"1:3\"\n", "j.yaml");
  REQUIRE(count.ok());
  CHECK(count->FlagValues().at("nnodes").value == "1:3");
  auto fixed = ParseJobConfig("nodes: {count: 2:2}\n", "j.yaml");
  REQUIRE(fixed.ok());
  CHECK(fixed->FlagValues().at("nnodes").value == "2");
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/ddprun_config_test_XXXXXX";
    dir_ = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string Write(const std::string& name, const std::string& text) const {
    const std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

 private:
  fs::path dir_;
};

TEST_CASE("job file: missing, a directory, huge, binary, not a regular file", "[unit]") {
  TempDir d;
  const std::string missing = d.Path("nope.yaml");
  auto r = LoadJobConfig(missing);
  REQUIRE_FALSE(r.ok());
  CHECK(std::string(r.status().message()) ==
        missing +
            ": cannot read the config file: No such file or directory; check the --config path");

  r = LoadJobConfig(d.Path(""));
  REQUIRE_FALSE(r.ok());
  CHECK(std::string(r.status().message()) ==
        d.Path("") + ": is a directory, not a config file; pass the YAML file");

  const std::string huge = d.Write("huge.yaml", std::string(kMaxConfigBytes + 1, '#'));
  r = LoadJobConfig(huge);
  REQUIRE_FALSE(r.ok());
  CHECK(std::string(r.status().message()) ==
        huge +
            ": is 1048577 bytes, over the 1048576-byte limit for a job file; keep data out of "
            "it; a job file is a few hundred bytes");

  const std::string bin = d.Write("bin.yaml", std::string("a: 1\n\0\0", 7));
  r = LoadJobConfig(bin);
  REQUIRE_FALSE(r.ok());
  CHECK(std::string(r.status().message()) ==
        bin + ": contains a NUL byte (binary data); pass the YAML job file");

  const std::string fifo = d.Path("fifo");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  r = LoadJobConfig(fifo);  // must not block on the FIFO
  REQUIRE_FALSE(r.ok());
  CHECK(std::string(r.status().message()) == fifo + ": is not a regular file; pass the YAML file");

  const std::string ok = d.Write("ok.yaml", "nproc_per_node: 2\n");
  auto good = LoadJobConfig(ok);
  REQUIRE(good.ok());
  CHECK(good->values.at("nproc_per_node").location == ok + ":1:17");

  if (::geteuid() != 0) {  // root reads anything
    const std::string locked = d.Write("locked.yaml", "nproc_per_node: 2\n");
    ::chmod(locked.c_str(), 0);
    r = LoadJobConfig(locked);
    REQUIRE_FALSE(r.ok());
    CHECK(std::string(r.status().message()).find("cannot read the config file") !=
          std::string::npos);
  }
}

TEST_CASE("job file: every example in configs/ is valid", "[unit]") {
  for (const char* name : {"single_node.yaml", "two_nodes.yaml", "elastic.yaml", "slurm.yaml"}) {
    const std::string path = std::string(DDPRUN_SOURCE_DIR) + "/configs/" + name;
    auto job = LoadJobConfig(path);
    INFO(path << ": " << job.status().message());
    CHECK(job.ok());
  }
}

}  // namespace
}  // namespace ddprun::launcher

TEST_CASE("job file: log and signal knobs added after the first schema", "[unit]") {
  char tmpl[] = "/tmp/ddprun_cfg_XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  const std::string path = std::string(tmpl) + "/job.yaml";
  std::ofstream(path) << "nproc_per_node: 2\ncommand: [true]\n"
                         "logs:\n  prefix_output: true\n  stderr_tail_lines: 5\n"
                         "restart:\n  signals_to_handle: SIGTERM,SIGUSR1\n";
  auto job = ddprun::launcher::LoadJobConfig(path);
  INFO((job.ok() ? std::string("ok") : std::string(job.status().message())));
  REQUIRE(job.ok());
  std::ofstream(path) << "nproc_per_node: 2\ncommand: [true]\nlogs:\n  stderr_tail_lines: -1\n";
  auto bad = ddprun::launcher::LoadJobConfig(path);
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(std::string(bad.status().message()), Catch::Contains("logs.stderr_tail_lines"));
  std::filesystem::remove_all(tmpl);
}
