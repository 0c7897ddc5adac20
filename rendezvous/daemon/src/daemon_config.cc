// ddprund's --config file and the precedence of its settings' sources
// (daemon_knobs.h): flag > DDPRUND_<NAME> > file > default.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ddprun/rendezvous/daemon/daemon_knobs.h"
#include "yaml-cpp/yaml.h"

namespace ddprun::rendezvous {
namespace {

std::string Where(const std::string& path, const YAML::Mark& mark) {
  return absl::StrCat(path, ":", mark.line + 1, ":", mark.column + 1);
}

std::string KnownKeys() {
  std::vector<std::string> names;
  for (const DaemonKnob& k : DaemonKnobs()) names.push_back(k.name);
  return absl::StrJoin(names, ", ");
}

}  // namespace

absl::StatusOr<DaemonConfigFile> ParseDaemonConfig(const std::string& text,
                                                   const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(path, e.mark), ": (syntax): ", e.msg, "; fix the YAML syntax"));
  }
  DaemonConfigFile file;
  file.path = path;
  if (root.IsNull()) return file;  // an empty file (or comments only) sets nothing
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path,
                     ":1:1: (top level): must be a mapping of settings; write key: value "
                     "lines such as port: 29400 (see configs/ddprund.yaml)"));
  }
  for (const auto& kv : root) {
    const std::string key = kv.first.Scalar();
    const std::string at = Where(path, kv.first.Mark());
    if (FindDaemonKnob(key) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ": ", key, ": unknown key; ddprund knows ", KnownKeys()));
    }
    if (file.values.count(key) > 0) {
      return absl::InvalidArgumentError(absl::StrCat(at, ": ", key, ": given twice; keep one"));
    }
    const YAML::Node& v = kv.second;
    std::string value;
    if (v.IsScalar()) {
      value = v.Scalar();
    } else if (v.IsSequence() && key == "etcd_endpoints") {
      std::vector<std::string> items;
      for (const auto& item : v) {
        if (!item.IsScalar()) {
          return absl::InvalidArgumentError(absl::StrCat(Where(path, item.Mark()), ": ", key,
                                                         ": each member must be one HOST:PORT"));
        }
        items.push_back(item.Scalar());
      }
      value = absl::StrJoin(items, ",");
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(path, v.Mark()), ": ", key, ": must be a single value",
                       key == "etcd_endpoints" ? " or a list of HOST:PORT" : ""));
    }
    file.values[key] = value;
    file.where[key] = Where(path, v.Mark());
  }
  return file;
}

absl::StatusOr<DaemonConfigFile> ReadDaemonConfig(const std::string& path) {
  std::string text;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot read the config file: ", std::strerror(errno),
                     "; check the --config path"));
  }
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
  std::fclose(f);
  return ParseDaemonConfig(text, path);
}

absl::Status ResolveDaemonSettings(const std::map<std::string, std::string>& flags,
                                   const std::function<const char*(const char*)>& getenv,
                                   const DaemonConfigFile* file, DaemonSettings& out) {
  out.server.etcd_tls.names.ca = "--etcd_ca";
  out.server.etcd_tls.names.cert = "--etcd_cert";
  out.server.etcd_tls.names.key = "--etcd_key";
  for (const DaemonKnob& k : DaemonKnobs()) {
    const std::string env = DaemonEnvName(k.name);
    std::string text, prefix, source;
    if (auto f = flags.find(k.name); f != flags.end()) {
      text = f->second;
      source = absl::StrCat("--", k.name);
      prefix = absl::StrCat(source, "=", text);
    } else if (const char* e = getenv ? getenv(env.c_str()) : nullptr; e != nullptr) {
      text = e;
      source = env;
      prefix = absl::StrCat(env, "=", text);
    } else if (file != nullptr && file->values.count(k.name) > 0) {
      text = file->values.at(k.name);
      source = absl::StrCat(k.name, " in ", file->path);
      prefix = absl::StrCat(file->where.at(k.name), ": ", k.name);
    } else if (!k.default_value.empty()) {
      text = k.default_value;
      source = absl::StrCat("--", k.name);
      prefix = absl::StrCat("--", k.name, " (default ", text, ")");
    } else {
      continue;
    }
    if (absl::Status s = k.apply(text, source, out); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace ddprun::rendezvous
