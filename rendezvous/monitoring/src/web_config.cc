// The exporter toolkit's web configuration file (web_config.h).
#include "ddprun/rendezvous/monitoring/web_config.h"

#include <sys/stat.h>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ddprun/rendezvous/common/suggest.h"

namespace ddprun::rendezvous {
namespace {

// Keys of the toolkit's format that ddprun does not implement: named, not
// ignored, so that a file written for an exporter never means less here.
const std::vector<std::string>& Unsupported() {
  static const std::vector<std::string> kKeys{"cert",
                                              "key",
                                              "client_ca",
                                              "client_allowed_sans",
                                              "cipher_suites",
                                              "curve_preferences",
                                              "prefer_server_cipher_suites",
                                              "headers",
                                              "rate_limit"};
  return kKeys;
}

class Parser {
 public:
  Parser(std::string file, const std::string& source)
      : file_(std::move(file)), prefix_(absl::StrCat(source, " ", file_, ": ")) {
    const auto slash = file_.rfind('/');
    dir_ = slash == std::string::npos ? "." : file_.substr(0, slash == 0 ? 1 : slash);
  }

  absl::StatusOr<WebConfig> Parse(const std::string& text) {
    YAML::Node root;
    try {
      root = YAML::Load(text);
    } catch (const YAML::Exception& e) {
      return Bad(e.mark, absl::StrCat("not YAML (", e.msg, ")"), "fix the YAML syntax");
    }
    WebConfig out;
    if (root.IsNull()) return out;
    if (!root.IsMap()) {
      return Bad(root.Mark(), "the document is not a mapping",
                 "write the keys tls_server_config, http_server_config, basic_auth_users");
    }
    for (const auto& kv : root) {
      const std::string key = kv.first.Scalar();
      if (absl::Status s =
              CheckKey(kv.first, key, "the top level",
                       {"tls_server_config", "http_server_config", "basic_auth_users"});
          !s.ok()) {
        return s;
      }
      absl::Status st;
      if (key == "tls_server_config") st = Tls(kv.second, out);
      if (key == "http_server_config") st = HttpServer(kv.second);
      if (key == "basic_auth_users") st = Users(kv.second, out);
      if (!st.ok()) return st;
    }
    if (absl::Status st = Check(root, out); !st.ok()) return st;
    return out;
  }

 private:
  absl::Status Bad(const YAML::Mark& mark, const std::string& problem, const std::string& fix) {
    const std::string line = mark.is_null() ? "" : absl::StrCat("line ", mark.line + 1, ": ");
    return absl::InvalidArgumentError(absl::StrCat(prefix_, line, problem, "; ", fix));
  }

  absl::Status CheckKey(const YAML::Node& node, const std::string& key, const std::string& where,
                        const std::vector<std::string>& known) {
    for (const std::string& k : known) {
      if (k == key) return absl::OkStatus();
    }
    for (const std::string& k : Unsupported()) {
      if (k == key) {
        return Bad(node.Mark(),
                   absl::StrCat("'", key, "' (under ", where, ") is not supported by ddprun"),
                   "remove it; docs/security.md lists the keys ddprun reads");
      }
    }
    return Bad(node.Mark(),
               absl::StrCat("unknown key '", key, "' under ", where, DidYouMean(key, known)),
               absl::StrCat("the keys there are ", absl::StrJoin(known, ", ")));
  }

  absl::StatusOr<std::string> Text(const YAML::Node& v, const std::string& key) {
    if (!v.IsScalar() || v.Scalar().empty()) {
      return Bad(v.Mark(), absl::StrCat(key, " is not a non-empty string"),
                 absl::StrCat("write ", key, ": <value>"));
    }
    return v.Scalar();
  }

  std::string Resolve(const std::string& path) const {
    return path.front() == '/' ? path : absl::StrCat(dir_, "/", path);
  }

  absl::StatusOr<int> Version(const YAML::Node& v, const std::string& key) {
    auto t = Text(v, key);
    if (!t.ok()) return t.status();
    static const std::vector<std::pair<std::string, int>> kVersions{
        {"TLS10", kTls10}, {"TLS11", kTls11}, {"TLS12", kTls12}, {"TLS13", kTls13}};
    std::vector<std::string> names;
    for (const auto& [name, version] : kVersions) {
      if (*t == name) return version;
      names.push_back(name);
    }
    return Bad(v.Mark(), absl::StrCat(key, " '", *t, "' is not a TLS version"),
               absl::StrCat("write one of ", absl::StrJoin(names, ", ")));
  }

  absl::Status Tls(const YAML::Node& node, WebConfig& out) {
    if (node.IsNull()) return absl::OkStatus();
    if (!node.IsMap()) {
      return Bad(node.Mark(), "tls_server_config is not a mapping",
                 "write cert_file and key_file under it");
    }
    static const std::vector<std::string> kKeys{"cert_file",        "key_file",    "client_ca_file",
                                                "client_auth_type", "min_version", "max_version"};
    for (const auto& kv : node) {
      const std::string key = kv.first.Scalar();
      if (absl::Status s = CheckKey(kv.first, key, "tls_server_config", kKeys); !s.ok()) return s;
      const YAML::Node& v = kv.second;
      if (key == "min_version" || key == "max_version") {
        auto ver = Version(v, key);
        if (!ver.ok()) return ver.status();
        (key == "min_version" ? out.min_version : out.max_version) = *ver;
        continue;
      }
      auto t = Text(v, key);
      if (!t.ok()) return t.status();
      if (key == "cert_file") out.cert_file = Resolve(*t);
      if (key == "key_file") out.key_file = Resolve(*t);
      if (key == "client_ca_file") out.client_ca_file = Resolve(*t);
      if (key == "client_auth_type") {
        static const std::vector<std::pair<std::string, ClientAuth>> kTypes{
            {"NoClientCert", ClientAuth::kNone},
            {"RequestClientCert", ClientAuth::kRequest},
            {"RequireAnyClientCert", ClientAuth::kRequireAny},
            {"VerifyClientCertIfGiven", ClientAuth::kVerifyIfGiven},
            {"RequireAndVerifyClientCert", ClientAuth::kRequireAndVerify}};
        std::vector<std::string> names;
        bool found = false;
        for (const auto& [name, type] : kTypes) {
          names.push_back(name);
          if (*t == name) {
            out.client_auth = type;
            found = true;
          }
        }
        if (!found) {
          return Bad(v.Mark(),
                     absl::StrCat("client_auth_type '", *t, "' is not a client auth type",
                                  DidYouMean(*t, names)),
                     absl::StrCat("write one of ", absl::StrJoin(names, ", ")));
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status HttpServer(const YAML::Node& node) {
    if (node.IsNull()) return absl::OkStatus();
    if (!node.IsMap()) {
      return Bad(node.Mark(), "http_server_config is not a mapping", "write http2: false under it");
    }
    for (const auto& kv : node) {
      const std::string key = kv.first.Scalar();
      if (absl::Status s = CheckKey(kv.first, key, "http_server_config", {"http2"}); !s.ok()) {
        return s;
      }
      const std::string v = kv.second.IsScalar() ? kv.second.Scalar() : "";
      if (v != "true" && v != "false") {
        return Bad(kv.second.Mark(), "http2 is not true or false", "write http2: false");
      }
    }
    return absl::OkStatus();
  }

  absl::Status Users(const YAML::Node& node, WebConfig& out) {
    if (node.IsNull()) return absl::OkStatus();
    if (!node.IsMap()) {
      return Bad(node.Mark(), "basic_auth_users is not a mapping of user: bcrypt hash",
                 "write one `user: $2b$...` line per user (htpasswd -nbBC 10 USER PASS)");
    }
    for (const auto& kv : node) {
      const std::string user = kv.first.Scalar();
      if (user.empty() || user.find(':') != std::string::npos) {
        return Bad(kv.first.Mark(), "a basic_auth_users name is empty or holds ':'",
                   "name each user with letters, digits, '-' or '_'");
      }
      // The hash is never repeated in a message: a file may be shared.
      const std::string hash = kv.second.IsScalar() ? kv.second.Scalar() : "";
      const bool bcrypt = hash.size() == 60 && hash[0] == '$' && hash[1] == '2' &&
                          (hash[2] == 'a' || hash[2] == 'b' || hash[2] == 'y') && hash[3] == '$' &&
                          hash[6] == '$';
      if (!bcrypt) {
        return Bad(kv.second.Mark(),
                   absl::StrCat("the password of basic_auth_users '", user,
                                "' is not a bcrypt hash ($2a$, $2b$ or $2y$, 60 characters)"),
                   "write its bcrypt hash, e.g. from `htpasswd -nbBC 10 USER PASS`, never the "
                   "password itself");
      }
      out.users[user] = hash;
    }
    return absl::OkStatus();
  }

  // Rules across keys, as the toolkit's (tls_config.go).
  absl::Status Check(const YAML::Node& root, const WebConfig& c) {
    const YAML::Mark mark =
        root["tls_server_config"] ? root["tls_server_config"].Mark() : root.Mark();
    const bool any_tls = !c.cert_file.empty() || !c.key_file.empty() || !c.client_ca_file.empty() ||
                         c.client_auth != ClientAuth::kNone;
    if (any_tls && c.cert_file.empty()) {
      return Bad(mark, "tls_server_config has no cert_file",
                 "give cert_file and key_file (the server's PEM certificate and key)");
    }
    if (any_tls && c.key_file.empty()) {
      return Bad(mark, "tls_server_config has no key_file", "give the PEM key of cert_file");
    }
    const bool verifies = c.client_auth == ClientAuth::kVerifyIfGiven ||
                          c.client_auth == ClientAuth::kRequireAndVerify;
    if (verifies && c.client_ca_file.empty()) {
      return Bad(mark,
                 "client_auth_type verifies client certificates but client_ca_file is missing",
                 "give client_ca_file, the PEM CA that signs the clients' certificates");
    }
    if (!c.client_ca_file.empty() && c.client_auth == ClientAuth::kNone) {
      return Bad(mark, "client_ca_file is given without a client_auth_type",
                 "add client_auth_type: RequireAndVerifyClientCert (or remove client_ca_file)");
    }
    if (c.max_version != 0 && c.max_version < c.min_version) {
      return Bad(mark, "max_version is older than min_version", "raise max_version or drop it");
    }
    return absl::OkStatus();
  }

  std::string file_;
  std::string prefix_;
  std::string dir_;
};

}  // namespace

absl::StatusOr<WebConfig> ParseWebConfig(const std::string& text, const std::string& file,
                                         const std::string& source) {
  return Parser(file, source).Parse(text);
}

absl::StatusOr<WebConfig> ReadWebConfig(const std::string& file, const std::string& source) {
  struct stat st {};
  if (::stat(file.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, " ", file, ": not a regular file; give the path of a YAML web configuration"));
  }
  std::ifstream in(file);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, " ", file, ": cannot read: ", std::strerror(errno),
                     "; check the path and that this user can read it"));
  }
  std::stringstream text;
  text << in.rdbuf();
  return ParseWebConfig(text.str(), file, source);
}

}  // namespace ddprun::rendezvous
