// The worker command (cli.h: BuildWorkerCommand) and the facts about this
// machine that --nproc_per_node=cpu|gpu|auto depend on.
#include <dlfcn.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "ddprun/launcher/cli.h"
#include "ddprun/launcher/placement.h"
#include "ddprun/launcher/value_parsers.h"
#include "ddprun/rendezvous/common/status_macros.h"

#ifndef DDPRUN_VERSION
#define DDPRUN_VERSION "unknown"
#endif
#ifndef DDPRUN_BUILD_COMPILER
#define DDPRUN_BUILD_COMPILER "unknown"
#define DDPRUN_BUILD_GRPC "unknown"
#define DDPRUN_BUILD_NCCL "NCCL backend: unknown"
#define DDPRUN_BUILD_LOADS_NCCL 0
#endif

namespace ddprun::launcher {
namespace {

bool IsExecutableFile(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

bool PathExists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::optional<std::string> FindOnPath(const std::string& name, const Env& env) {
  auto it = env.find("PATH");
  const std::string path =
      it != env.end() ? it->second : std::string("/usr/local/bin:/usr/bin:/bin");
  for (absl::string_view dir : absl::StrSplit(path, ':')) {
    const std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", name);
    if (IsExecutableFile(candidate)) return candidate;
  }
  return std::nullopt;
}

std::string PythonExec(const Env& env) { return ChoosePython(env, SelfExe()).path; }

absl::Status CheckPython(const std::string& python, const Env& env) {
  const bool found = python.find('/') != std::string::npos ? IsExecutableFile(python)
                                                           : FindOnPath(python, env).has_value();
  if (found) return absl::OkStatus();
  return UsageError(absl::StrCat("Python interpreter '", python,
                                 "' not found; activate your virtual environment, or set "
                                 "PYTHON_EXEC to the interpreter that has PyTorch (Debian's: "
                                 "PYTHON_EXEC=/usr/bin/python3)"));
}

std::vector<std::string> Concat(std::vector<std::string> head,
                                const std::vector<std::string>& tail) {
  head.insert(head.end(), tail.begin(), tail.end());
  return head;
}

}  // namespace

std::string SelfExe() {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : p.string();
}

PythonChoice ChoosePython(const Env& env, const std::string& self_exe) {
  auto get = [&](const char* name) -> std::string {
    auto it = env.find(name);
    return it == env.end() ? std::string() : it->second;
  };
  if (std::string v = get("PYTHON_EXEC"); !v.empty()) return {v, "PYTHON_EXEC"};
  for (const char* var : {"VIRTUAL_ENV", "CONDA_PREFIX"}) {
    const std::string root = get(var);
    if (root.empty()) continue;
    for (const char* name : {"python", "python3"}) {
      const std::string candidate = absl::StrCat(root, "/bin/", name);
      if (IsExecutableFile(candidate)) {
        return {candidate, absl::StrCat("the environment in ", var, "=", root)};
      }
    }
  }
  // The venv ddprun is installed in: <venv>/bin/ddprun (a build installed
  // there) or the wheel's <venv>/lib/pythonX.Y/site-packages/ddprun/bin/ddprun
  // (reached through the console script <venv>/bin/ddprun, which execs it):
  // the nearest ancestor with a pyvenv.cfg, at most five levels up.
  if (!self_exe.empty()) {
    std::filesystem::path dir = std::filesystem::path(self_exe).parent_path();
    for (int up = 0; up < 5 && dir.has_relative_path(); ++up, dir = dir.parent_path()) {
      const std::filesystem::path root = dir.parent_path();
      const std::string candidate = (root / "bin" / "python3").string();
      if (PathExists((root / "pyvenv.cfg").string()) && IsExecutableFile(candidate)) {
        return {candidate, absl::StrCat("the virtual environment ddprun is installed in (",
                                        root.string(), ")")};
      }
    }
  }
  return {kDefaultPythonExec, "python3 on PATH (no PYTHON_EXEC, VIRTUAL_ENV or CONDA_PREFIX)"};
}

int CountNvidiaGpus(const std::string& dev_dir, const std::string& proc_gpus_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  int n = 0;
  for (fs::directory_iterator it(proc_gpus_dir, ec), end; !ec && it != end; it.increment(ec)) ++n;
  if (n > 0) return n;
  for (fs::directory_iterator it(dev_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() > 6 && absl::StartsWith(name, "nvidia") &&
        std::all_of(name.begin() + 6, name.end(), [](char c) { return std::isdigit(c); })) {
      ++n;
    }
  }
  return n;
}

int CountAmdGpus(const std::string& kfd_nodes_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  int n = 0;
  for (fs::directory_iterator it(kfd_nodes_dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::ifstream in(it->path() / "properties");
    std::string key;
    long value = 0;
    while (in >> key >> value) {
      if (key == "simd_count") {
        if (value > 0) ++n;
        break;
      }
    }
  }
  return n;
}

int CountIntelGpus(const std::string& drm_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  int n = 0;
  for (fs::directory_iterator it(drm_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() <= 4 || !absl::StartsWith(name, "card") ||
        !std::all_of(name.begin() + 4, name.end(), [](char c) { return std::isdigit(c); })) {
      continue;  // a connector (card0-DP-1), a render node, version
    }
    std::string vendor;
    std::ifstream(it->path() / "device" / "vendor") >> vendor;
    if (absl::AsciiStrToLower(vendor) != "0x8086") continue;
    bool render = false;
    std::error_code ec2;
    for (fs::directory_iterator d(it->path() / "device" / "drm", ec2), dend; !ec2 && d != dend;
         d.increment(ec2)) {
      render = render || absl::StartsWith(d->path().filename().string(), "renderD");
    }
    if (render) ++n;
  }
  return n;
}

int ZeAffinityDevices(int physical, const std::string& mask) {
  if (absl::StripAsciiWhitespace(mask).empty()) return physical;
  int n = 0;
  for (absl::string_view entry : absl::StrSplit(mask, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    int card = 0;
    if (absl::SimpleAtoi(entry.substr(0, entry.find('.')), &card) && card >= 0 && card < physical) {
      ++n;
    }
  }
  return n;
}

int VisibleDevices(int physical, const std::string& list) {
  int n = 0;
  for (absl::string_view entry : absl::StrSplit(list, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    if (entry.empty() || entry.front() == '-') break;
    if (std::isdigit(static_cast<unsigned char>(entry.front()))) {
      int index = 0;
      if (!absl::SimpleAtoi(entry, &index) || index >= physical) break;
    }
    ++n;
  }
  return std::min(n, physical);
}

HostFacts ProbeHost() {
  HostFacts facts;
  facts.cpu_count = std::max(1u, std::thread::hardware_concurrency());
  facts.gpu_count = [] { return CountNvidiaGpus(); };
  facts.amd_gpu_count = [] { return CountAmdGpus(); };
  facts.intel_gpu_count = [] { return CountIntelGpus(); };
  facts.names = ProbeHostNames;
  facts.cpu_topology = agent::ReadCpuTopology;
  return facts;
}

int GpuCount(const HostFacts& host) { return host.gpu_count ? host.gpu_count() : 0; }
int AmdGpuCount(const HostFacts& host) { return host.amd_gpu_count ? host.amd_gpu_count() : 0; }
int IntelGpuCount(const HostFacts& host) {
  return host.intel_gpu_count ? host.intel_gpu_count() : 0;
}

std::vector<std::string> HostNames(const HostFacts& host) {
  return host.names ? host.names() : std::vector<std::string>{};
}

agent::CpuTopology CpuTopologyOf(const HostFacts& host) {
  return host.cpu_topology ? host.cpu_topology() : agent::CpuTopology{};
}

std::string VersionString() { return absl::StrCat("ddprun ", DDPRUN_VERSION); }

std::string BuildInfoString() {
  return absl::StrCat("compiler: ", DDPRUN_BUILD_COMPILER, "\ngRPC: ", DDPRUN_BUILD_GRPC, "\n",
                      DDPRUN_BUILD_NCCL);
}

std::string NcclRuntimeString() {
  if (!DDPRUN_BUILD_LOADS_NCCL) return "";
  // The SDK's rule (worker_sdk/src/nccl_loader.h; DDP_NCCL_LIBRARY is its
  // variable, sdk_env.cc): the variable's path, else the soname.
  const char* set = std::getenv("DDP_NCCL_LIBRARY");
  const std::string library = set != nullptr && *set != '\0' ? set : "libnccl.so.2";
  void* handle = ::dlopen(library.c_str(), RTLD_LAZY | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    return absl::StrCat("NCCL: ", library, " not found here: ", why ? why : "dlopen failed",
                        "; a PyTorch 2.x worker uses the one torch loads, else install NCCL or "
                        "pip install nvidia-nccl-cu12, or set DDP_NCCL_LIBRARY");
  }
  std::string path = library;
  link_map* map = nullptr;
  if (::dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
      *map->l_name != '\0') {
    path = map->l_name;
  }
  using GetVersion = int (*)(int*);  // ncclResult_t ncclGetVersion(int*); 0 = ncclSuccess
  auto get_version = reinterpret_cast<GetVersion>(::dlsym(handle, "ncclGetVersion"));
  int code = 0;
  if (get_version == nullptr || get_version(&code) != 0) {
    return absl::StrCat("NCCL: ", path,
                        " is not NCCL (no working ncclGetVersion); set "
                        "DDP_NCCL_LIBRARY to libnccl.so.2, or unset it");
  }
  return absl::StrCat("NCCL: ", library, " ", code / 10000, ".", code / 100 % 100, ".", code % 100,
                      " at ", path);
}

absl::StatusOr<std::vector<std::string>> BuildWorkerCommand(const ScriptSpec& spec, const Env& env,
                                                            std::vector<std::string>* warnings) {
  const std::string python = PythonExec(env);
  const std::string& script = spec.script;
  if (spec.module && spec.no_python) {
    return UsageError("-m/--module and --no_python cannot be used together; drop one of them");
  }
  if (script.empty()) {
    return UsageError("the training script is empty; usage: ddprun [OPTIONS] SCRIPT [ARGS...]");
  }
  if (spec.module) {
    DDPRUN_RETURN_IF_ERROR(CheckPython(python, env));
    return Concat({python, "-u", "-m", script}, spec.args);
  }
  const bool has_slash = script.find('/') != std::string::npos;
  const bool exists = PathExists(script);
  // A file in the working directory is run through its path: argv[0] without
  // '/' would be looked up on PATH instead.
  const std::string as_path = has_slash ? script : "./" + script;
  auto not_found = [&] {
    return UsageError(absl::StrCat("training script '", script, "' not found",
                                   has_slash ? "" : " (in the working directory or on PATH)",
                                   "; check the path"));
  };

  if (spec.no_python) {
    if (exists) {
      if (IsExecutableFile(script)) return Concat({as_path}, spec.args);
      return UsageError(absl::StrCat("'", script,
                                     "' is not an executable file; chmod +x it, "
                                     "or drop --no_python to run it with ",
                                     python));
    }
    if (!has_slash && FindOnPath(script, env)) return Concat({script}, spec.args);
    return not_found();
  }
  if (exists && std::filesystem::is_directory(script)) {
    // Python runs a directory by its __main__.py (as torchrun's `python -u DIR`);
    // any other directory is a mistake worth one line, not a failed job.
    if (PathExists(script + "/__main__.py")) {
      DDPRUN_RETURN_IF_ERROR(CheckPython(python, env));
      return Concat({python, "-u", script}, spec.args);
    }
    return UsageError(absl::StrCat("'", script,
                                   "' is a directory without a __main__.py; give the "
                                   "training script in it (e.g. ",
                                   (std::filesystem::path(script) / "train.py").string(), ")"));
  }
  if (absl::EndsWith(script, ".py")) {
    if (!exists) return not_found();
    DDPRUN_RETURN_IF_ERROR(CheckPython(python, env));
    return Concat({python, "-u", script}, spec.args);
  }
  if (exists) {
    if (IsExecutableFile(script)) return Concat({as_path}, spec.args);
    if (warnings != nullptr) {
      warnings->push_back(absl::StrCat("ddprun: '", script, "' is not executable; running it as ",
                                       python, " -u ", script,
                                       " (chmod +x it to run it directly)"));
    }
    DDPRUN_RETURN_IF_ERROR(CheckPython(python, env));
    return Concat({python, "-u", script}, spec.args);
  }
  if (!has_slash && FindOnPath(script, env)) return Concat({script}, spec.args);
  return not_found();
}

}  // namespace ddprun::launcher
