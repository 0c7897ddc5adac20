// `ddprun bench`'s flags, nccl-tests' arithmetic and tables (bench_options.h).
#include "ddprun/launcher/bench/bench_options.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"

namespace ddprun::launcher::bench {
namespace {

absl::Status Bad(const std::string& flag, const std::string& problem_and_fix) {
  return absl::InvalidArgumentError(absl::StrCat("ddprun bench: ", flag, ": ", problem_and_fix));
}

constexpr Op kOps[] = {Op::kAllreduce, Op::kAllgather, Op::kReduceScatter, Op::kBroadcast};
constexpr DType kDTypes[] = {DType::kFloat,    DType::kDouble, DType::kHalf,
                             DType::kBFloat16, DType::kInt32,  DType::kInt64};
constexpr RedOp kRedOps[] = {RedOp::kSum, RedOp::kAvg, RedOp::kMax, RedOp::kMin};

// The flags that take no value.
bool IsSwitch(const std::string& name) { return name == "--json" || name == "--scaling"; }

absl::StatusOr<int> ParsePositive(const std::string& flag, const std::string& v, int min) {
  int n = 0;
  if (!absl::SimpleAtoi(v, &n) || n < min) {
    return Bad(flag, absl::StrCat("'", v, "' is not an integer >= ", min, "; pass for example ",
                                  flag, "=", std::max(min, 20)));
  }
  return n;
}

absl::Status ApplyOps(BenchOptions& o, const std::string& v) {
  o.ops.clear();
  for (absl::string_view part : absl::StrSplit(v, ',')) {
    const std::string name = absl::AsciiStrToLower(part);
    if (name == "all") {
      o.ops.assign(std::begin(kOps), std::end(kOps));
      continue;
    }
    bool found = false;
    for (Op op : kOps) {
      if (name == OpName(op)) {
        o.ops.push_back(op);
        found = true;
      }
    }
    if (!found) {
      return Bad("--op", absl::StrCat("unknown collective '", part,
                                      "'; use allreduce, allgather, reducescatter, broadcast or "
                                      "all (a comma-separated list is accepted)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ApplyDType(BenchOptions& o, const std::string& v) {
  const std::string name = absl::AsciiStrToLower(v);
  // nccl-tests' and torch's other spellings of the same types.
  const std::pair<const char*, DType> aliases[] = {
      {"float32", DType::kFloat}, {"fp32", DType::kFloat},   {"float64", DType::kDouble},
      {"fp64", DType::kDouble},   {"float16", DType::kHalf}, {"fp16", DType::kHalf},
      {"bf16", DType::kBFloat16}, {"int", DType::kInt32},    {"long", DType::kInt64}};
  for (DType t : kDTypes) {
    if (name == DTypeName(t)) {
      o.dtype = t;
      return absl::OkStatus();
    }
  }
  for (const auto& [alias, t] : aliases) {
    if (name == alias) {
      o.dtype = t;
      return absl::OkStatus();
    }
  }
  const bool unsupported = name == "int8" || name == "uint8" || name == "uint32" ||
                           name == "uint64" || name == "fp8_e4m3" || name == "fp8_e5m2";
  return Bad("--dtype", absl::StrCat(unsupported ? "the worker SDK has no '" : "unknown type '", v,
                                     unsupported ? "' collectives" : "'",
                                     "; use float, double, half, bfloat16, int32 or int64"));
}

absl::Status ApplyRedOp(BenchOptions& o, const std::string& v) {
  const std::string name = absl::AsciiStrToLower(v);
  for (RedOp r : kRedOps) {
    if (name == RedOpName(r)) {
      o.redop = r;
      return absl::OkStatus();
    }
  }
  return Bad("--redop", absl::StrCat(name == "prod" ? "the worker SDK has no 'prod' reduction"
                                                    : absl::StrCat("unknown reduction '", v, "'"),
                                     "; use sum, avg, max or min"));
}

absl::Status ApplySizes(BenchOptions& o, const std::string& v) {
  std::vector<std::string> parts = absl::StrSplit(v, ':');
  if (parts.size() > 2 || parts[0].empty() || (parts.size() == 2 && parts[1].empty())) {
    return Bad("--sizes", absl::StrCat("'", v,
                                       "' is not MIN:MAX or SIZE; write for example 4K:256M "
                                       "(K, M, G = 1024, 1024^2, 1024^3 bytes)"));
  }
  auto lo = ParseByteSize(parts[0]);
  if (!lo.ok()) return Bad("--sizes", std::string(lo.status().message()));
  auto hi = parts.size() == 2 ? ParseByteSize(parts[1]) : lo;
  if (!hi.ok()) return Bad("--sizes", std::string(hi.status().message()));
  if (*lo == 0 || *lo > *hi) {
    return Bad("--sizes",
               absl::StrCat("'", v, "': need 0 < MIN <= MAX; write for example 4K:256M"));
  }
  o.min_bytes = *lo;
  o.max_bytes = *hi;
  return absl::OkStatus();
}

absl::Status ApplyCompute(BenchOptions& o, const std::string& v) {
  double ms = 0;
  if (!absl::SimpleAtod(v, &ms) || !(ms >= 0) || ms > 1e6) {
    return Bad("--compute_ms", absl::StrCat("'", v,
                                            "' is not a time in milliseconds (0 to 1e6); pass for "
                                            "example --compute_ms=100"));
  }
  o.compute_ms = ms;
  return absl::OkStatus();
}

// One bench flag with its value (already split from "=" or taken from the next argument).
absl::Status Apply(BenchOptions& o, const std::string& flag, const std::string& v) {
  if (flag == "--op") return ApplyOps(o, v);
  if (flag == "--sizes") return ApplySizes(o, v);
  if (flag == "--dtype") return ApplyDType(o, v);
  if (flag == "--redop") return ApplyRedOp(o, v);
  if (flag == "--compute_ms") return ApplyCompute(o, v);
  absl::StatusOr<int> n;
  if (flag == "--step_factor") {
    n = ParsePositive(flag, v, 2);
    if (n.ok()) o.step_factor = *n;
  } else if (flag == "--iters") {
    n = ParsePositive(flag, v, 1);
    if (n.ok()) o.iters = *n;
  } else if (flag == "--warmup") {
    n = ParsePositive(flag, v, 0);
    if (n.ok()) o.warmup = *n;
  } else if (flag == "--root") {
    n = ParsePositive(flag, v, 0);
    if (n.ok()) o.root = *n;
  } else if (flag == "--batch") {
    n = ParsePositive(flag, v, 1);
    if (n.ok()) o.batch = *n;
  }
  return n.status();
}

// "--step-factor" -> "--step_factor" (ddprun's flags take both spellings).
std::string Canonical(std::string name) {
  for (std::size_t i = 2; i < name.size(); ++i)
    if (name[i] == '-') name[i] = '_';
  return name;
}

// Walks args; bench flags go to o, the rest to rest (null: the rest is an error).
absl::Status Walk(const std::vector<std::string>& args, BenchOptions& o,
                  std::vector<std::string>* rest) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {  // the worker is ddprun's own: nothing may follow
      return Bad("--",
                 "ddprun bench runs its own worker and takes no script; remove '--' and "
                 "what follows");
    }
    const std::size_t eq = a.find('=');
    const std::string name = Canonical(a.substr(0, eq));
    const bool ours = a.rfind("--", 0) == 0 &&
                      std::find(kBenchFlags.begin(), kBenchFlags.end(), name) != kBenchFlags.end();
    if (!ours) {
      if (rest == nullptr) {
        return Bad(a, "not a ddprun bench flag; see ddprun bench --help");
      }
      rest->push_back(a);
      continue;
    }
    if (IsSwitch(name)) {
      if (eq != std::string::npos) {
        return Bad(name, absl::StrCat("takes no value; write ", name, " alone"));
      }
      (name == "--json" ? o.json : o.scaling) = true;
      continue;
    }
    std::string value;
    if (eq != std::string::npos) {
      value = a.substr(eq + 1);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return Bad(name, absl::StrCat("needs a value; write ", name, "=VALUE"));
    }
    if (absl::Status s = Apply(o, name, value); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::string FormatTime(double us) {
  if (us >= 10000.0) return absl::StrFormat("%7.0f", us);
  if (us >= 100.0) return absl::StrFormat("%7.1f", us);
  return absl::StrFormat("%7.2f", us);
}

bool HasRedOp(Op op) { return op == Op::kAllreduce || op == Op::kReduceScatter; }

}  // namespace

const std::vector<std::string> kBenchFlags = {"--op",    "--sizes",   "--step_factor", "--dtype",
                                              "--redop", "--iters",   "--warmup",      "--root",
                                              "--json",  "--scaling", "--compute_ms",  "--batch"};

const char* OpName(Op op) {
  switch (op) {
    case Op::kAllreduce:
      return "allreduce";
    case Op::kAllgather:
      return "allgather";
    case Op::kReduceScatter:
      return "reducescatter";
    case Op::kBroadcast:
      return "broadcast";
  }
  return "?";
}

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kFloat:
      return "float";
    case DType::kDouble:
      return "double";
    case DType::kHalf:
      return "half";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
  }
  return "?";
}

const char* RedOpName(RedOp op) {
  switch (op) {
    case RedOp::kSum:
      return "sum";
    case RedOp::kAvg:
      return "avg";
    case RedOp::kMax:
      return "max";
    case RedOp::kMin:
      return "min";
  }
  return "?";
}

std::size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kFloat:
    case DType::kInt32:
      return 4;
    case DType::kDouble:
    case DType::kInt64:
      return 8;
    case DType::kHalf:
    case DType::kBFloat16:
      return 2;
  }
  return 1;
}

absl::StatusOr<std::size_t> ParseByteSize(const std::string& text) {
  std::string digits = text;
  std::size_t mult = 1;
  if (!digits.empty()) {
    switch (absl::ascii_toupper(digits.back())) {
      case 'K':
        mult = std::size_t(1) << 10;
        break;
      case 'M':
        mult = std::size_t(1) << 20;
        break;
      case 'G':
        mult = std::size_t(1) << 30;
        break;
      default:
        break;
    }
    if (mult != 1) digits.pop_back();
  }
  std::uint64_t n = 0;
  if (digits.empty() || !absl::SimpleAtoi(digits, &n) ||
      n > std::numeric_limits<std::size_t>::max() / mult || n * mult > (std::size_t(64) << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text,
                     "' is not a size up to 64G; write a number of bytes with an optional K, M or "
                     "G, for example 4K:256M"));
  }
  return n * mult;
}

absl::StatusOr<SplitArgs> SplitBenchArgs(const std::vector<std::string>& args) {
  SplitArgs out;
  if (absl::Status s = Walk(args, out.options, &out.launcher_args); !s.ok()) return s;
  return out;
}

absl::StatusOr<BenchOptions> ParseBenchArgs(const std::vector<std::string>& args) {
  BenchOptions o;
  if (absl::Status s = Walk(args, o, nullptr); !s.ok()) return s;
  return o;
}

std::vector<std::string> ToWorkerArgs(const BenchOptions& o) {
  std::vector<std::string> ops;
  for (Op op : o.ops) ops.push_back(OpName(op));
  std::vector<std::string> a = {"--op=" + absl::StrJoin(ops, ","),
                                absl::StrCat("--sizes=", o.min_bytes, ":", o.max_bytes),
                                absl::StrCat("--step_factor=", o.step_factor),
                                absl::StrCat("--dtype=", DTypeName(o.dtype)),
                                absl::StrCat("--redop=", RedOpName(o.redop)),
                                absl::StrCat("--iters=", o.iters),
                                absl::StrCat("--warmup=", o.warmup),
                                absl::StrCat("--root=", o.root),
                                absl::StrCat("--compute_ms=", o.compute_ms),
                                absl::StrCat("--batch=", o.batch)};
  if (o.json) a.push_back("--json");
  if (o.scaling) a.push_back("--scaling");
  return a;
}

std::vector<std::size_t> SweepSizes(const BenchOptions& o) {
  std::vector<std::size_t> sizes;
  for (std::size_t s = o.min_bytes; s <= o.max_bytes; s *= o.step_factor) {
    sizes.push_back(s);
    if (s > o.max_bytes / o.step_factor) break;  // the next one would pass max (or overflow)
  }
  return sizes;
}

Shape ShapeFor(Op op, std::size_t bytes, DType dtype, int world) {
  const std::size_t ws = DTypeSize(dtype);
  const std::size_t n = std::max<std::size_t>(1, bytes / ws);
  const std::size_t w = static_cast<std::size_t>(std::max(1, world));
  Shape s;
  switch (op) {
    case Op::kAllreduce:
    case Op::kBroadcast:
      s.count = s.in_count = s.out_count = n;
      s.bytes = n * ws;
      break;
    case Op::kAllgather:
      s.count = s.in_count = std::max<std::size_t>(1, n / w);
      s.out_count = s.count * w;
      s.bytes = s.out_count * ws;
      break;
    case Op::kReduceScatter:
      s.count = s.out_count = std::max<std::size_t>(1, n / w);
      s.in_count = s.count * w;
      s.bytes = s.in_count * ws;
      break;
  }
  return s;
}

double BusBandwidthFactor(Op op, int world) {
  const double n = std::max(1, world);
  switch (op) {
    case Op::kAllreduce:
      return 2.0 * (n - 1) / n;
    case Op::kAllgather:
    case Op::kReduceScatter:
      return (n - 1) / n;
    case Op::kBroadcast:
      return 1.0;
  }
  return 1.0;
}

Timing MakeTiming(Op op, std::size_t bytes, int world, double seconds, std::int64_t wrong) {
  Timing t;
  t.time_us = seconds * 1e6;
  t.algbw_gbs = seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0;
  t.busbw_gbs = t.algbw_gbs * BusBandwidthFactor(op, world);
  t.wrong = wrong;
  return t;
}

std::string FormatTitle(Op op, int world, const std::string& backend, const BenchOptions& o) {
  return absl::StrFormat(
      "# ddprun bench: %s, %d rank(s), backend %s\n"
      "# minBytes %d maxBytes %d step: %d(factor) warmup iters: %d iters: %d validation: 1\n",
      OpName(op), world, backend, o.min_bytes, o.max_bytes, o.step_factor, o.warmup, o.iters);
}

std::string FormatHeader() {
  std::string h = "#\n";
  absl::StrAppendFormat(&h,
                        "# %10s  %12s  %8s  %6s  %6s           out-of-place                       "
                        "in-place          \n",
                        "", "", "", "", "");
  absl::StrAppendFormat(&h, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n",
                        "size", "count", "type", "redop", "root", "time", "algbw", "busbw",
                        "#wrong", "time", "algbw", "busbw", "#wrong");
  absl::StrAppendFormat(&h, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s\n",
                        "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)",
                        "(GB/s)", "(GB/s)", "");
  return h;
}

std::string FormatRow(const Row& r) {
  std::string line =
      absl::StrFormat("%12d  %12d  %8s  %6s  %6d", r.shape.bytes, r.shape.count, DTypeName(r.dtype),
                      HasRedOp(r.op) ? RedOpName(r.redop) : "none", r.root);
  for (const Timing* t : {&r.out_of_place, &r.in_place}) {
    absl::StrAppendFormat(&line, "  %7s  %6.2f  %6.2f  %5d", FormatTime(t->time_us), t->algbw_gbs,
                          t->busbw_gbs, t->wrong);
  }
  return line + "\n";
}

double AvgBusBandwidth(const std::vector<Row>& rows) {
  if (rows.empty()) return 0;
  double sum = 0;
  for (const Row& r : rows) sum += r.out_of_place.busbw_gbs + r.in_place.busbw_gbs;
  return sum / (2.0 * rows.size());
}

namespace {
std::int64_t TotalWrong(const std::vector<Row>& rows) {
  std::int64_t n = 0;
  for (const Row& r : rows) n += r.out_of_place.wrong + r.in_place.wrong;
  return n;
}
}  // namespace

std::string FormatFooter(const std::vector<Row>& rows) {
  const std::int64_t wrong = TotalWrong(rows);
  return absl::StrFormat("# Out of bounds values : %d %s\n# Avg bus bandwidth    : %g \n#\n", wrong,
                         wrong ? "FAILED" : "OK", AvgBusBandwidth(rows));
}

std::string FormatJson(int world, const std::string& backend, const std::vector<Row>& rows) {
  using Json = nlohmann::ordered_json;
  Json js_rows = Json::array();
  auto timing = [](const Timing& t) {
    return Json{{"time_us", t.time_us},
                {"algbw_gbs", t.algbw_gbs},
                {"busbw_gbs", t.busbw_gbs},
                {"wrong", t.wrong}};
  };
  for (const Row& r : rows) {
    js_rows.push_back({{"op", OpName(r.op)},
                       {"size", r.shape.bytes},
                       {"count", r.shape.count},
                       {"type", DTypeName(r.dtype)},
                       {"redop", HasRedOp(r.op) ? RedOpName(r.redop) : "none"},
                       {"root", r.root},
                       {"out_of_place", timing(r.out_of_place)},
                       {"in_place", timing(r.in_place)}});
  }
  Json js = {{"world_size", world},
             {"backend", backend},
             {"rows", std::move(js_rows)},
             {"wrong", TotalWrong(rows)},
             {"avg_busbw_gbs", AvgBusBandwidth(rows)}};
  return js.dump(2) + "\n";
}

std::string FormatScalingHeader(const std::string& backend, const BenchOptions& o) {
  std::string h = absl::StrFormat(
      "# ddprun bench --scaling: ResNet-50 gradients (161 tensors, 25.6 M float values), "
      "Reducer defaults, backend %s\n"
      "# compute %g ms per step, batch %d per rank, warmup %d, steps %d; each world size is its "
      "own job\n",
      backend, o.compute_ms, o.batch, o.warmup, o.iters);
  absl::StrAppendFormat(&h, "# %5s  %12s  %10s  %10s  %8s  %10s  %10s\n", "ranks", "global_batch",
                        "samples/s", "efficiency", "step", "compute", "exposed");
  absl::StrAppendFormat(&h, "# %5s  %12s  %10s  %10s  %8s  %10s  %10s\n", "", "", "", "(%)", "(ms)",
                        "(ms)", "comm (ms)");
  return h;
}

std::string FormatScalingRow(const ScalingRow& r, double one_rank) {
  const double eff = one_rank > 0 ? 100.0 * r.samples_per_s / (r.ranks * one_rank) : 0;
  return absl::StrFormat("  %5d  %12d  %10.1f  %10.1f  %8.2f  %10.2f  %10.2f\n", r.ranks,
                         r.global_batch, r.samples_per_s, eff, r.step_ms, r.compute_ms,
                         r.exposed_ms);
}

std::string FormatScalingJson(const std::string& backend, const BenchOptions& o,
                              const std::vector<ScalingRow>& rows) {
  using Json = nlohmann::ordered_json;
  const double one = rows.empty() || rows[0].ranks != 1 ? 0 : rows[0].samples_per_s;
  Json js_rows = Json::array();
  for (const ScalingRow& r : rows) {
    js_rows.push_back({{"ranks", r.ranks},
                       {"global_batch", r.global_batch},
                       {"samples_per_s", r.samples_per_s},
                       {"efficiency", one > 0 ? r.samples_per_s / (r.ranks * one) : 0.0},
                       {"step_ms", r.step_ms},
                       {"compute_ms", r.compute_ms},
                       {"exposed_comm_ms", r.exposed_ms}});
  }
  Json js = {{"backend", backend},
             {"compute_ms", o.compute_ms},
             {"batch_per_rank", o.batch},
             {"rows", std::move(js_rows)}};
  return js.dump(2) + "\n";
}

std::vector<int> ScalingWorlds(int world) {
  std::vector<int> w;
  for (int n = 1; n < world; n *= 2) w.push_back(n);
  w.push_back(std::max(1, world));
  return w;
}

std::vector<int> ScalingWorldsAcrossNodes(int nproc, int nodes) {
  std::vector<int> w = ScalingWorlds(nproc);
  for (int k = 2; k < nodes; k *= 2) w.push_back(k * std::max(1, nproc));
  if (nodes > 1) w.push_back(nodes * std::max(1, nproc));
  return w;
}

}  // namespace ddprun::launcher::bench
