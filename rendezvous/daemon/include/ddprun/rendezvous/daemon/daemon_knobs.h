// ddprund's settings, each defined once (like the launcher's knobs.h): its
// flag (--name, and --na-me follows), its DDPRUND_<NAME> variable, its key in
// the --config YAML file (the flag's name), its default as --help and the
// docs show it, its help, and the parser that checks the text and stores it
// in DaemonSettings.
//
// Everything else derives from this table: ddprund's CLI11 flags and --help
// (main.cc), the keys a --config file accepts (an unknown key is one line
// naming it and the valid ones), the variables read, and a unit test that
// docs/cli.md shows every knob with this default.
//
// Precedence, stated once: flag > DDPRUND_<NAME> > --config file > default.
//
// To add a setting: one entry in DaemonKnobs() (daemon_knobs.cc) with its
// parser and, if it has a default, the typed constant that ServerOptions'
// field starts from (server.h); a row in docs/cli.md's ddprund table.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ddprun/rendezvous/common/tls.h"
#include "ddprun/rendezvous/daemon/server.h"

namespace ddprun::rendezvous {

// What the knobs fill: the server's options, and the server's TLS files
// (loaded and checked by LoadServerTls once every source was applied).
struct DaemonSettings {
  ServerOptions server;
  TlsOptions tls;
  // --web_config: a file in the exporter toolkit's format, or
  // kWebConfigPlaintext; "" = none. Read by main (web_config.h), which names
  // it by web_config_source.
  std::string web_config;
  std::string web_config_source = "--web_config";
};

struct DaemonKnob {
  const char* name;  // "etcd_endpoints": --etcd_endpoints, its YAML key
  // What the parser gets when nothing sets it, written from the typed
  // constant the server uses (kDefaultLeaseTimeout: "4"); empty: none, and
  // ServerOptions' own value stands.
  std::string default_value;
  // As --help and docs/cli.md show it: default_value, or what having none
  // means ("none (in memory)").
  std::string default_text;
  const char* metavar;  // "H:P,H:P,..."
  const char* help;
  // Checks `text` and stores it in `out`. Errors are InvalidArgument
  // "problem; fix"; the caller prefixes where the text came from. `source`
  // names it for later messages (TLS files: "--tls_cert",
  // "DDPRUND_TLS_CERT", "tls_cert in FILE").
  absl::Status (*apply)(const std::string& text, const std::string& source, DaemonSettings& out);
};

// Every knob, in --help's order.
const std::vector<DaemonKnob>& DaemonKnobs();
const DaemonKnob* FindDaemonKnob(const std::string& name);
// "DDPRUND_ETCD_ENDPOINTS".
std::string DaemonEnvName(const std::string& name);

// A --config file's settings: key -> text (a YAML list is joined with ',',
// for etcd_endpoints), with the "FILE:LINE:COL" of each value for messages.
struct DaemonConfigFile {
  std::string path;
  std::map<std::string, std::string> values;
  std::map<std::string, std::string> where;
};

// Parses a --config file's text (`path` only names it in messages). One-line
// InvalidArgument errors: "FILE:LINE:COL: (syntax): ...; fix the YAML
// syntax", "FILE:LINE:COL: key: unknown key; ddprund knows host, port, ...",
// a key without a single value. No file access, for unit tests.
absl::StatusOr<DaemonConfigFile> ParseDaemonConfig(const std::string& text,
                                                   const std::string& path);
// Reads and parses the file; an unreadable one names the path and --config.
absl::StatusOr<DaemonConfigFile> ReadDaemonConfig(const std::string& path);

// Applies every source to `out` by the precedence above: `flags` holds the
// flags given (name -> text), `getenv` looks a variable up (nullptr: unset),
// `file` the --config file (or none). The first bad value is one line:
// "--port=x: ...", "DDPRUND_PORT=x: ...", "FILE:L:C: port: ...".
absl::Status ResolveDaemonSettings(const std::map<std::string, std::string>& flags,
                                   const std::function<const char*(const char*)>& getenv,
                                   const DaemonConfigFile* file, DaemonSettings& out);

}  // namespace ddprun::rendezvous
