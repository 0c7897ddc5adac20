#include "ddprun/agent/log_spec.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ddprun::agent {
namespace {

std::optional<int> SmallInt(absl::string_view s) {
  s = absl::StripAsciiWhitespace(s);
  int v = 0;
  if (s.empty() || !absl::SimpleAtoi(s, &v)) return std::nullopt;
  return v;
}

// A minimal JSON reader: enough to pull strings out of nested objects.
class Json {
 public:
  explicit Json(absl::string_view text) : s_(text) {}

  // Parses an object and returns the value of `key` (a string, or the raw
  // text of an object for a further parse). Only top-level keys of it.
  struct Value {
    bool is_string = false;
    std::string text;  // the decoded string, or the raw JSON of another value
  };
  std::optional<std::map<std::string, Value>> Object() {
    Ws();
    if (!Eat('{')) return std::nullopt;
    std::map<std::string, Value> out;
    Ws();
    if (Eat('}')) return out;
    while (true) {
      Ws();
      auto key = String();
      if (!key) return std::nullopt;
      Ws();
      if (!Eat(':')) return std::nullopt;
      Ws();
      Value v;
      if (Peek() == '"') {
        auto str = String();
        if (!str) return std::nullopt;
        v.is_string = true;
        v.text = std::move(*str);
      } else {
        const std::size_t start = i_;
        if (!Skip()) return std::nullopt;
        v.text = std::string(s_.substr(start, i_ - start));
      }
      out[*key] = std::move(v);
      Ws();
      if (Eat(',')) continue;
      if (Eat('}')) return out;
      return std::nullopt;
    }
  }

 private:
  char Peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  bool Eat(char c) {
    if (Peek() != c) return false;
    ++i_;
    return true;
  }
  void Ws() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  static void AppendUtf8(std::string& out, std::uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  std::optional<std::uint32_t> Hex4() {
    if (i_ + 4 > s_.size()) return std::nullopt;
    std::uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      char c = s_[i_++];
      v <<= 4;
      if (c >= '0' && c <= '9')
        v |= c - '0';
      else if (c >= 'a' && c <= 'f')
        v |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F')
        v |= c - 'A' + 10;
      else
        return std::nullopt;
    }
    return v;
  }
  std::optional<std::string> String() {
    if (!Eat('"')) return std::nullopt;
    std::string out;
    while (i_ < s_.size()) {
      char c = s_[i_++];
      if (c == '"') return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) return std::nullopt;
      char e = s_[i_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          auto cp = Hex4();
          if (!cp) return std::nullopt;
          if (*cp >= 0xD800 && *cp < 0xDC00 && i_ + 6 <= s_.size() && s_[i_] == '\\' &&
              s_[i_ + 1] == 'u') {
            i_ += 2;
            auto lo = Hex4();
            if (!lo) return std::nullopt;
            *cp = 0x10000 + ((*cp - 0xD800) << 10) + (*lo - 0xDC00);
          }
          AppendUtf8(out, *cp);
          break;
        }
        default:
          return std::nullopt;
      }
    }
    return std::nullopt;
  }
  // Skips one value of any type.
  bool Skip() {
    Ws();
    char c = Peek();
    if (c == '"') return String().has_value();
    if (c == '{' || c == '[') {
      const char close = c == '{' ? '}' : ']';
      ++i_;
      Ws();
      if (Eat(close)) return true;
      while (true) {
        if (c == '{') {
          Ws();
          if (!String()) return false;
          Ws();
          if (!Eat(':')) return false;
        }
        if (!Skip()) return false;
        Ws();
        if (Eat(',')) continue;
        return Eat(close);
      }
    }
    // A number, true, false or null.
    const std::size_t start = i_;
    while (i_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[i_])) || s_[i_] == '-' ||
                              s_[i_] == '+' || s_[i_] == '.')) {
      ++i_;
    }
    return i_ > start;
  }

  absl::string_view s_;
  std::size_t i_ = 0;
};

}  // namespace

int StdStreams::ForLocalRank(int local_rank) const {
  if (per_rank.empty()) return all;
  auto it = per_rank.find(local_rank);
  return it == per_rank.end() ? 0 : it->second;
}

bool StdStreams::Any() const {
  if (all != 0) return true;
  return std::any_of(per_rank.begin(), per_rank.end(), [](const auto& kv) { return kv.second; });
}

absl::StatusOr<StdStreams> ParseStdStreams(absl::string_view value) {
  auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "must be 0 (none), 1 (stdout), 2 (stderr), 3 (both) or a per-local-rank map like "
        "0:3,1:2; got '",
        value, "'"));
  };
  StdStreams out;
  if (value.find(':') == absl::string_view::npos) {
    auto v = SmallInt(value);
    if (!v || *v < 0 || *v > 3) return bad();
    out.all = *v;
    return out;
  }
  for (absl::string_view item : absl::StrSplit(value, ',')) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(item, absl::MaxSplits(':', 1));
    auto rank = SmallInt(kv.first);
    auto v = SmallInt(kv.second);
    if (!rank || !v || *rank < 0 || *v < 0 || *v > 3) return bad();
    out.per_rank[*rank] = *v;
  }
  return out;
}

bool LogSpec::ShowsOnConsole(int local_rank) const {
  return local_ranks_filter.empty() ||
         std::find(local_ranks_filter.begin(), local_ranks_filter.end(), local_rank) !=
             local_ranks_filter.end();
}

StreamPlan PlanStream(const LogSpec& spec, int local_rank, StdStream stream) {
  const int bit = static_cast<int>(stream);
  const bool redirect = (spec.redirects.ForLocalRank(local_rank) & bit) != 0;
  const bool tee = (spec.tee.ForLocalRank(local_rank) & bit) != 0;
  StreamPlan p;
  p.file = redirect || tee;
  // -r alone keeps a stream off the console; -t (which implies -r) shows it.
  p.console = (tee || !redirect) && spec.ShowsOnConsole(local_rank);
  p.prefix = p.console && (tee || spec.prefix_output);
  if (stream == StdStream::kStderr) p.tail_lines = std::max(0, spec.stderr_tail_lines);
  return p;
}

std::string LinePrefix(const std::string& tmpl, const std::string& host, const std::string& role,
                       int rank, int local_rank) {
  if (tmpl.empty()) return absl::StrCat("[", host, ":", rank, ":", local_rank, "]:");
  return absl::StrReplaceAll(tmpl, {{"${host}", host},
                                    {"${role_name}", role},
                                    {"${rank}", std::to_string(rank)},
                                    {"${local_rank}", std::to_string(local_rank)}});
}

std::optional<std::string> ParseErrorFileMessage(absl::string_view json) {
  auto top = Json(json).Object();
  if (!top) return std::nullopt;
  auto it = top->find("message");
  if (it == top->end()) return std::nullopt;
  if (it->second.is_string) return it->second.text;
  auto inner = Json(it->second.text).Object();
  if (!inner) return std::nullopt;
  auto m = inner->find("message");
  if (m == inner->end() || !m->second.is_string) return std::nullopt;
  return m->second.text;
}

std::string ReadErrorMessage(const std::string& path) {
  if (path.empty()) return "";
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  // Tracebacks in extraInfo can be long; the message comes first but JSON
  // needs the whole object, so read up to 1 MiB.
  std::string data(1 << 20, '\0');
  in.read(data.data(), static_cast<std::streamsize>(data.size()));
  data.resize(static_cast<std::size_t>(in.gcount()));
  if (auto msg = ParseErrorFileMessage(data)) return *msg;
  std::string raw = data.substr(0, 500);
  while (!raw.empty() && std::isspace(static_cast<unsigned char>(raw.back()))) raw.pop_back();
  return raw;
}

}  // namespace ddprun::agent
