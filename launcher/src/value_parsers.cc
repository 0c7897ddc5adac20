// The value parsers of the knob table; see value_parsers.h for the message
// contract.
#include "ddprun/launcher/value_parsers.h"

#include <signal.h>
#include <string.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "ddprun/agent/cpu_binding.h"
#include "ddprun/rendezvous/common/job_id.h"
#include "ddprun/rendezvous/common/status_macros.h"
#include "ddprun/rendezvous/common/suggest.h"

namespace ddprun::launcher {
namespace {

absl::Status Bad(absl::string_view message) {
  return absl::InvalidArgumentError(std::string(message));
}

// The whole text is the integer, nothing before or after.
std::optional<std::int64_t> Int(absl::string_view s) {
  std::int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

// A finite decimal number ("1.5", "1e3").
std::optional<double> Double(absl::string_view text) {
  const std::string s(text);
  if (s.empty() || std::isspace(static_cast<unsigned char>(s[0]))) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || end != s.c_str() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

constexpr std::int64_t kMaxNodes = 1'000'000;

}  // namespace

absl::Status UsageError(absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("ddprun: ", message));
}

absl::StatusOr<NodeRange> ParseNodeRange(absl::string_view text) {
  const std::vector<absl::string_view> parts = absl::StrSplit(text, ':');
  std::optional<std::int64_t> lo, hi;
  if (parts.size() == 1) {
    lo = hi = Int(parts[0]);
  } else if (parts.size() == 2) {
    lo = Int(parts[0]);
    hi = Int(parts[1]);
  }
  if (!lo || !hi || *lo <= 0 || *lo > *hi || *hi > kMaxNodes) {
    return Bad(
        absl::StrCat("must be N or MIN:MAX with 0 < MIN <= MAX (e.g. 2 or 1:4), got '", text, "'"));
  }
  return NodeRange{static_cast<int>(*lo), static_cast<int>(*hi)};
}

std::string FormatNodeRange(NodeRange r) {
  return r.min == r.max ? std::to_string(r.max) : absl::StrCat(r.min, ":", r.max);
}

absl::StatusOr<NprocSpec> ParseNproc(absl::string_view text) {
  const std::string v = absl::AsciiStrToLower(text);
  if (v == "cpu") return NprocSpec{NprocSpec::Kind::kCpu};
  if (v == "gpu") return NprocSpec{NprocSpec::Kind::kGpu};
  if (v == "xpu") return NprocSpec{NprocSpec::Kind::kXpu};
  if (v == "auto") return NprocSpec{NprocSpec::Kind::kAuto};
  auto n = Int(v);
  if (!n || *n <= 0 || *n > kMaxNodes) {
    return Bad(absl::StrCat(
        "must be a positive number of workers, 'cpu', 'gpu', 'xpu' or 'auto', got '", text, "'"));
  }
  return NprocSpec{NprocSpec::Kind::kNumber, static_cast<int>(*n)};
}

std::string FormatNproc(const NprocSpec& spec) {
  switch (spec.kind) {
    case NprocSpec::Kind::kCpu:
      return "cpu";
    case NprocSpec::Kind::kGpu:
      return "gpu";
    case NprocSpec::Kind::kXpu:
      return "xpu";
    case NprocSpec::Kind::kAuto:
      return "auto";
    case NprocSpec::Kind::kNumber:
      break;
  }
  return std::to_string(spec.number);
}

absl::StatusOr<long> ParseCount(absl::string_view text, long min, long max,
                                absl::string_view what) {
  auto v = Int(text);
  if (!v || *v < min || *v > max) return Bad(absl::StrCat("must be ", what, ", got '", text, "'"));
  return static_cast<long>(*v);
}

absl::StatusOr<Seconds> ParseSeconds(absl::string_view text, bool allow_zero) {
  auto v = Double(text);
  if (!v || *v < 0 || (!allow_zero && *v == 0)) {
    return Bad(absl::StrCat("must be a ", allow_zero ? "non-negative" : "positive",
                            " number of seconds, got '", text, "'"));
  }
  return Seconds(*v);
}

absl::StatusOr<agent::StdStreams> ParseStreams(absl::string_view text) {
  std::string compact(text);
  compact.erase(std::remove_if(compact.begin(), compact.end(),
                               [](unsigned char c) { return std::isspace(c); }),
                compact.end());
  auto streams = agent::ParseStdStreams(compact);
  // The agent's message names the value only, as this file's contract asks.
  if (!streams.ok()) return Bad(streams.status().message());
  return streams;
}

std::string FormatStreams(const agent::StdStreams& s) {
  if (s.per_rank.empty()) return std::to_string(s.all);
  std::vector<std::string> parts;
  for (const auto& [rank, v] : s.per_rank) parts.push_back(absl::StrCat(rank, ":", v));
  return absl::StrJoin(parts, ",");
}

absl::StatusOr<std::uint64_t> ParseBytes(absl::string_view text) {
  constexpr double kMaxBytes = static_cast<double>(1ULL << 50);
  auto bad = [&text] {
    return Bad(
        absl::StrCat("must be a number of bytes such as 512MiB, 16GiB or 0, got '", text, "'"));
  };
  absl::string_view number = absl::StripAsciiWhitespace(text);
  double scale = 1;
  if (absl::ConsumeSuffix(&number, "iB") || absl::ConsumeSuffix(&number, "B")) {
    if (number.empty()) return bad();
  }
  if (!number.empty()) {
    const char unit = absl::ascii_toupper(number.back());
    const double scales[] = {0x1p10, 0x1p20, 0x1p30, 0x1p40};
    const absl::string_view units = "KMGT";
    if (const std::size_t u = units.find(unit); u != absl::string_view::npos) {
      scale = scales[u];
      number.remove_suffix(1);
    }
  }
  double value = 0;
  if (number.empty() || !absl::SimpleAtod(number, &value) || !(value >= 0) ||
      value * scale > kMaxBytes) {
    return bad();
  }
  return static_cast<std::uint64_t>(value * scale);
}

absl::StatusOr<std::vector<int>> ParseRankList(absl::string_view text) {
  std::vector<int> ranks;
  if (absl::StripAsciiWhitespace(text).empty()) return ranks;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    auto r = Int(absl::StripAsciiWhitespace(item));
    if (!r || *r < 0 || *r > kMaxNodes) {
      return Bad(
          absl::StrCat("must be a comma-separated list of local ranks like 0,1; got '", text, "'"));
    }
    ranks.push_back(static_cast<int>(*r));
  }
  return ranks;
}

absl::StatusOr<rendezvous::HostPort> ParseEndpoint(absl::string_view text, int default_port,
                                                   bool allow_zero_port) {
  auto bad = [&](absl::string_view why) {
    return Bad(absl::StrCat("must be HOST[:PORT] (e.g. node0:29400), ", why, "; got '", text, "'"));
  };
  if (!text.empty() && text.front() != '[' && std::count(text.begin(), text.end(), ':') > 1) {
    return bad("write an IPv6 address as [ADDR]:PORT");
  }
  auto hp =
      rendezvous::ParseHostPort(std::string_view(text.data(), text.size()),
                                {.default_port = default_port, .allow_zero_port = allow_zero_port});
  if (!hp.ok() && allow_zero_port) {
    // The message of the usual rule (1..65535): port 0 is the exception.
    return ParseEndpoint(text, default_port, /*allow_zero_port=*/false);
  }
  if (!hp.ok()) return bad(hp.status().message());
  return hp;
}

absl::StatusOr<std::vector<rendezvous::HostPort>> ParseEndpointList(absl::string_view text,
                                                                    int default_port) {
  std::vector<rendezvous::HostPort> out;
  for (absl::string_view entry : absl::StrSplit(text, ',')) {
    if (entry.empty()) {
      return Bad(
          absl::StrCat("must be HOST[:PORT] entries separated by commas, one per ddprund "
                       "replica; an entry is empty in '",
                       text, "'"));
    }
    DDPRUN_ASSIGN_OR_RETURN(rendezvous::HostPort hp, ParseEndpoint(entry, default_port));
    if (std::find(out.begin(), out.end(), hp) != out.end()) {
      return Bad(absl::StrCat("lists ", rendezvous::FormatHostPort(hp),
                              " twice; name each ddprund "
                              "replica once"));
    }
    out.push_back(std::move(hp));
  }
  return out;
}

absl::StatusOr<int> ParsePort(absl::string_view text) {
  auto v = Int(text);
  if (!v || *v < 1 || *v > rendezvous::kMaxPort) {
    return Bad(absl::StrCat("must be a port in 1..", rendezvous::kMaxPort, ", got '", text, "'"));
  }
  return static_cast<int>(*v);
}

absl::StatusOr<int> ParsePortOrOff(absl::string_view text) {
  if (text == "off") return rendezvous::kDashboardOff;
  auto v = Int(text);
  if (!v || *v < 0 || *v > rendezvous::kMaxPort) {
    return Bad(absl::StrCat("must be a port in 0..", rendezvous::kMaxPort,
                            " (0: the OS picks) or off, got '", text, "'"));
  }
  return static_cast<int>(*v);
}

absl::StatusOr<bool> ParseBool(absl::string_view text) {
  const std::string l = absl::AsciiStrToLower(text);
  if (l == "true" || l == "yes" || l == "on" || l == "1") return true;
  if (l == "false" || l == "no" || l == "off" || l == "0") return false;
  return Bad(absl::StrCat("must be true or false, got '", text, "'"));
}

absl::StatusOr<std::string> ParseText(absl::string_view text) {
  if (text.empty()) return Bad("must not be empty");
  return std::string(text);
}

absl::StatusOr<std::string> ParseToken(absl::string_view text) {
  if (text.empty()) return Bad("must not be empty");
  if (text.find(',') != absl::string_view::npos) {
    return Bad("must not contain ',' (it separates --rdzv_conf keys); pick a token without it");
  }
  return std::string(text);
}

absl::StatusOr<std::string> ParseJobIdValue(absl::string_view text) {
  if (absl::Status st = rendezvous::ValidateJobId(std::string_view(text.data(), text.size()));
      !st.ok()) {
    return Bad(absl::StrCat("is not a valid job id: ", st.message()));
  }
  return std::string(text);
}

absl::StatusOr<std::string> ParseBackend(absl::string_view text) {
  const std::string b = absl::AsciiStrToLower(text);
  if (b == "etcd" || b == "etcd-v2") {
    return Bad(
        absl::StrCat("'", text, "' is not supported; use c10d (ddprund or single node) or static"));
  }
  if (b == "c10d" || b == "ddprun") return std::string("c10d");
  if (b == "static") return b;
  return Bad(absl::StrCat("must be c10d (alias ddprun) or static, got '", text, "'"));
}

namespace {
// Whether `name` ("SIGALRM") is one of this system's signals (glibc's names).
bool IsSignalName(const std::string& name) {
  for (int sig = 1; sig < NSIG; ++sig) {
    const char* abbrev = ::sigabbrev_np(sig);
    if (abbrev != nullptr && name == absl::StrCat("SIG", abbrev)) return true;
  }
  return false;
}
}  // namespace

absl::StatusOr<SignalSet> ParseSignals(absl::string_view text) {
  SignalSet out;
  for (absl::string_view name : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    std::string n(absl::StripAsciiWhitespace(name));
    if (n.rfind("SIG", 0) != 0) n = "SIG" + n;
    if (n == "SIGUSR1") {
      out.usr1 = true;
    } else if (n == "SIGUSR2") {
      out.usr2 = true;
    } else if (n == "SIGTERM" || n == "SIGINT" || n == "SIGHUP" || n == "SIGQUIT") {
      out.terminating.push_back(n);
    } else if (IsSignalName(n)) {
      out.unhandled.push_back(n);  // a real signal ddprun does not trap: a warning
    } else {
      return Bad(absl::StrCat("names '", name,
                              "', which is not a signal; use names such as "
                              "SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 or SIGUSR2"));
    }
  }
  return out;
}

absl::StatusOr<std::string> ParseStartMethod(absl::string_view text) {
  if (text != "spawn" && text != "fork" && text != "forkserver") {
    return Bad(absl::StrCat("must be spawn, fork or forkserver, got '", text, "'"));
  }
  return std::string(text);
}

absl::StatusOr<rendezvous::OnHang> ParseOnHang(absl::string_view text) {
  // The one parser (job_policy.h); "" is its "report", but not a value here.
  std::optional<rendezvous::OnHang> on_hang;
  if (!text.empty()) on_hang = rendezvous::ParseOnHang(std::string_view(text.data(), text.size()));
  if (!on_hang) return Bad(absl::StrCat("must be report, restart or abort, got '", text, "'"));
  return *on_hang;
}

absl::StatusOr<rendezvous::RestartPolicy> ParseRestartPolicy(absl::string_view text) {
  std::optional<rendezvous::RestartPolicy> policy;
  if (!text.empty()) {
    policy = rendezvous::ParseRestartPolicy(std::string_view(text.data(), text.size()));
  }
  if (!policy) return Bad(absl::StrCat("must be job or inplace, got '", text, "'"));
  return *policy;
}

absl::StatusOr<std::string> ParseCpuBind(absl::string_view text) {
  if (!agent::CpuBindFromName(text)) {
    return Bad(absl::StrCat("must be ", agent::kCpuBindChoices, ", got '", text, "'"));
  }
  return std::string(text);
}

absl::StatusOr<std::string> ParseScheduler(absl::string_view text) {
  const std::string l = absl::AsciiStrToLower(text);
  if (l == "auto" || l == "slurm" || l == "mpi" || l == "none") return l;
  return Bad(absl::StrCat("must be auto, slurm, mpi or none, got '", text,
                          "'; auto detects Slurm and OpenMPI/PMIx, none turns detection off"));
}

absl::StatusOr<std::string> NormalizeKnobValue(const Knob& knob, absl::string_view text) {
  switch (knob.type) {
    case ValueType::kNodeRange: {
      DDPRUN_ASSIGN_OR_RETURN(NodeRange r, ParseNodeRange(text));
      return FormatNodeRange(r);
    }
    case ValueType::kNproc: {
      DDPRUN_ASSIGN_OR_RETURN(NprocSpec n, ParseNproc(text));
      return FormatNproc(n);
    }
    case ValueType::kCount: {
      DDPRUN_ASSIGN_OR_RETURN(long n, ParseCount(text, knob.min, knob.max, knob.what));
      return std::to_string(n);
    }
    case ValueType::kSeconds:
    case ValueType::kPositiveSeconds:
      DDPRUN_RETURN_IF_ERROR(ParseSeconds(text, knob.type == ValueType::kSeconds));
      return std::string(text);
    case ValueType::kStreams: {
      DDPRUN_ASSIGN_OR_RETURN(agent::StdStreams s, ParseStreams(text));
      return FormatStreams(s);
    }
    case ValueType::kBytes:
      DDPRUN_RETURN_IF_ERROR(ParseBytes(text).status());
      return std::string(text);
    case ValueType::kRankList: {
      DDPRUN_ASSIGN_OR_RETURN(std::vector<int> ranks, ParseRankList(text));
      return absl::StrJoin(ranks, ",");
    }
    case ValueType::kEndpoint: {
      // first_node[:PORT] names the first listed host (placement.h).
      absl::string_view check = text;
      if (absl::StrContains(text, ',')) {
        // Several ddprund replicas (docs/ha.md): each entry HOST[:PORT].
        DDPRUN_RETURN_IF_ERROR(ParseEndpointList(text, rendezvous::kDefaultRdzvPort).status());
        return std::string(text);
      }
      std::string substituted;
      if (check == "first_node" || check.rfind("first_node:", 0) == 0) {
        substituted = absl::StrCat("first-node", check.substr(10));
        check = substituted;
      }
      // Port 0 (torchrun's localhost:0) is checked against --nnodes later.
      DDPRUN_RETURN_IF_ERROR(
          ParseEndpoint(check, rendezvous::kDefaultRdzvPort, /*allow_zero_port=*/true));
      return std::string(text);
    }
    case ValueType::kPort: {
      DDPRUN_ASSIGN_OR_RETURN(int port, ParsePort(text));
      return std::to_string(port);
    }
    case ValueType::kPortOrOff: {
      DDPRUN_ASSIGN_OR_RETURN(int port, ParsePortOrOff(text));
      return port < 0 ? std::string("off") : std::to_string(port);
    }
    case ValueType::kBool: {
      DDPRUN_ASSIGN_OR_RETURN(bool b, ParseBool(text));
      return std::string(b ? "true" : "false");
    }
    case ValueType::kText:
      return ParseText(text);
    case ValueType::kToken:
      return ParseToken(text);
    case ValueType::kJobId:
      return ParseJobIdValue(text);
    case ValueType::kBackend:
      return ParseBackend(text);
    case ValueType::kSignals:
      DDPRUN_RETURN_IF_ERROR(ParseSignals(text));
      return std::string(text);
    case ValueType::kStartMethod:
      return ParseStartMethod(text);
    case ValueType::kOnHang: {
      DDPRUN_ASSIGN_OR_RETURN(rendezvous::OnHang on_hang, ParseOnHang(text));
      return std::string(rendezvous::OnHangName(on_hang));
    }
    case ValueType::kRestartPolicy: {
      DDPRUN_ASSIGN_OR_RETURN(rendezvous::RestartPolicy policy, ParseRestartPolicy(text));
      return std::string(rendezvous::RestartPolicyName(policy));
    }
    case ValueType::kCpuBind:
      return ParseCpuBind(text);
    case ValueType::kScheduler:
      return ParseScheduler(text);
    case ValueType::kRdzvConf:
    case ValueType::kFileOnly:
      break;
  }
  return absl::InternalError(absl::StrCat("knob ", knob.Dest(), " has no single value"));
}

std::size_t EditDistance(absl::string_view a, absl::string_view b) {
  return rendezvous::EditDistance(std::string_view(a.data(), a.size()),
                                  std::string_view(b.data(), b.size()));
}

}  // namespace ddprun::launcher
