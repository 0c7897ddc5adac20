#include "ddprun/agent/checkpoint_file.h"

#include <cstring>
#include <map>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "ddprun/rendezvous/common/checkpoint_layout.h"
#include "nlohmann/json.hpp"

namespace ddprun::agent {
namespace {

using Json = nlohmann::json;
namespace layout = checkpoint_layout;

constexpr std::uint64_t kMaxHeaderBytes = 100 << 20;  // safetensors' own limit

std::uint64_t AlignUp(std::uint64_t n) {
  return (n + layout::kDataAlign - 1) / layout::kDataAlign * layout::kDataAlign;
}

// safetensors' dtype of a tree node's array, or "" when it has none.
std::string SafetensorsDtype(const Json& node) {
  static const std::map<std::string, std::string> kTorch = {
      {"float64", "F64"},        {"float32", "F32"},
      {"float16", "F16"},        {"bfloat16", "BF16"},
      {"int64", "I64"},          {"int32", "I32"},
      {"int16", "I16"},          {"int8", "I8"},
      {"uint8", "U8"},           {"bool", "BOOL"},
      {"uint16", "U16"},         {"uint32", "U32"},
      {"uint64", "U64"},         {"float8_e4m3fn", "F8_E4M3"},
      {"float8_e5m2", "F8_E5M2"}};
  static const std::map<std::string, std::string> kNumpy = {
      {"f8", "F64"}, {"f4", "F32"}, {"f2", "F16"}, {"i8", "I64"}, {"i4", "I32"}, {"i2", "I16"},
      {"i1", "I8"},  {"u8", "U64"}, {"u4", "U32"}, {"u2", "U16"}, {"u1", "U8"},  {"b1", "BOOL"}};
  const std::string t = node.value("t", "");
  const std::string dtype =
      node.contains("dtype") && node["dtype"].is_string() ? node["dtype"].get<std::string>() : "";
  if (t == "torch") {
    auto it = kTorch.find(dtype);
    return it == kTorch.end() ? "" : it->second;
  }
  if (t == "numpy" && dtype.size() >= 2 && (dtype[0] == '<' || dtype[0] == '|')) {
    auto it = kNumpy.find(dtype.substr(1));
    return it == kNumpy.end() ? "" : it->second;
  }
  return "";
}

bool IsBlob(const std::string& t) {
  return t == "torch" || t == "numpy" || t == "bytes" || t == "bytearray";
}

std::string KeyText(const Json& key) {
  return key.is_string() ? key.get<std::string>() : key.dump();
}

// Walks the tree, calling blob(node, name) on each array in order.
template <class F>
absl::Status Walk(Json& node, const std::string& path, F& blob) {
  if (!node.is_object() || !node.contains("t") || !node["t"].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat("the entry at '", path, "' has no type"));
  }
  const std::string t = node["t"].get<std::string>();
  auto join = [&path](const std::string& part) { return path.empty() ? part : path + "." + part; };
  if (t == "dict") {
    if (!node.contains("items") || !node["items"].is_array()) {
      return absl::InvalidArgumentError(absl::StrCat("the dict at '", path, "' has no items"));
    }
    for (Json& item : node["items"]) {
      if (!item.is_array() || item.size() != 2) {
        return absl::InvalidArgumentError(absl::StrCat("a bad item in the dict at '", path, "'"));
      }
      if (absl::Status st = Walk(item[1], join(KeyText(item[0])), blob); !st.ok()) return st;
    }
    return absl::OkStatus();
  }
  if (t == "list" || t == "tuple") {
    if (!node.contains("v") || !node["v"].is_array()) {
      return absl::InvalidArgumentError(absl::StrCat("the list at '", path, "' has no values"));
    }
    for (std::size_t i = 0; i < node["v"].size(); ++i) {
      if (absl::Status st = Walk(node["v"][i], join(std::to_string(i)), blob); !st.ok()) return st;
    }
    return absl::OkStatus();
  }
  if (t == "v") return absl::OkStatus();
  if (IsBlob(t)) return blob(node, path.empty() ? std::string("state") : path);
  return absl::InvalidArgumentError(absl::StrCat("unknown entry type '", t, "' at '", path, "'"));
}

std::uint64_t ReadU64(const char* p) {
  std::uint64_t v;
  std::memcpy(&v, p, sizeof v);  // little-endian hosts only (x86-64, aarch64)
  return v;
}

std::string U64Bytes(std::uint64_t v) {
  std::string s(8, '\0');
  std::memcpy(s.data(), &v, sizeof v);
  return s;
}

}  // namespace

absl::StatusOr<CheckpointFilePlan> PlanCheckpointFile(const std::string& snapshot,
                                                      std::int64_t step, int rank, int world_size) {
  if (snapshot.size() < 8)
    return absl::InvalidArgumentError("the snapshot is shorter than 8 bytes");
  const std::uint64_t tree_len = ReadU64(snapshot.data());
  if (tree_len > snapshot.size() - 8) {
    return absl::InvalidArgumentError("the snapshot's tree is longer than the snapshot");
  }
  Json tree = Json::parse(snapshot.begin() + 8, snapshot.begin() + 8 + static_cast<long>(tree_len),
                          nullptr, false);
  if (tree.is_discarded() || !tree.is_object() || !tree.contains("state")) {
    return absl::InvalidArgumentError("the snapshot's tree is not JSON of format 1");
  }
  const std::uint64_t data_start = AlignUp(8 + tree_len);
  CheckpointFilePlan plan;
  Json header = Json::object();
  std::set<std::string> names;
  std::uint64_t end = 0;
  auto blob = [&](Json& node, const std::string& path) -> absl::Status {
    if (!node.contains("off") || !node.contains("n") || !node["off"].is_number_unsigned() ||
        !node["n"].is_number_unsigned()) {
      return absl::InvalidArgumentError(absl::StrCat("the array at '", path, "' has no offset"));
    }
    const std::uint64_t off = node["off"].get<std::uint64_t>();
    const std::uint64_t n = node["n"].get<std::uint64_t>();
    if (data_start + off < data_start || data_start + off + n > snapshot.size() ||
        data_start + off + n < data_start + off) {
      return absl::InvalidArgumentError(
          absl::StrCat("the array at '", path, "' ends past the snapshot"));
    }
    std::string name = path;
    for (int k = 1; !names.insert(name).second; ++k) name = absl::StrCat(path, "#", k);
    std::string dtype = SafetensorsDtype(node);
    Json shape = node.contains("shape") ? node["shape"] : Json::array();
    if (dtype.empty() || !shape.is_array()) {
      dtype = "U8";
      shape = Json::array({n});
    }
    header[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {end, end + n}}};
    plan.pieces.push_back({data_start + off, n});
    end += n;
    node.erase("off");
    node["tensor"] = name;
    return absl::OkStatus();
  };
  if (absl::Status st = Walk(tree["state"], "", blob); !st.ok()) return st;
  header["__metadata__"] = {{"format", "pt"},
                            {"ddprun.format", kCheckpointFileFormat},
                            {"ddprun.step", std::to_string(step)},
                            {"ddprun.rank", std::to_string(rank)},
                            {"ddprun.world_size", std::to_string(world_size)},
                            {"ddprun.tree", tree.dump()}};
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');
  plan.head = U64Bytes(text.size()) + text;
  plan.file_size = plan.head.size() + end;
  return plan;
}

absl::StatusOr<LoadedCheckpoint> ParseCheckpointFile(const std::string& file) {
  if (file.size() < 8) return absl::InvalidArgumentError("not safetensors: shorter than 8 bytes");
  const std::uint64_t n = ReadU64(file.data());
  if (n > kMaxHeaderBytes || n > file.size() - 8) {
    return absl::InvalidArgumentError("not safetensors: the header length is past the file's end");
  }
  Json header =
      Json::parse(file.begin() + 8, file.begin() + 8 + static_cast<long>(n), nullptr, false);
  if (header.is_discarded() || !header.is_object()) {
    return absl::InvalidArgumentError("not safetensors: the header is not a JSON object");
  }
  const Json meta = header.value("__metadata__", Json::object());
  if (!meta.is_object() || meta.value("ddprun.format", "") != kCheckpointFileFormat) {
    return absl::InvalidArgumentError(
        "not a ddprun checkpoint: no \"ddprun.format\": \"1\" in its __metadata__");
  }
  LoadedCheckpoint out;
  if (!meta.contains("ddprun.tree") || !meta["ddprun.tree"].is_string() ||
      !absl::SimpleAtoi(meta.value("ddprun.step", ""), &out.step) ||
      !absl::SimpleAtoi(meta.value("ddprun.rank", ""), &out.rank) ||
      !absl::SimpleAtoi(meta.value("ddprun.world_size", ""), &out.world_size)) {
    return absl::InvalidArgumentError("a ddprun checkpoint without its step, rank, size or tree");
  }
  Json tree = Json::parse(meta["ddprun.tree"].get<std::string>(), nullptr, false);
  if (tree.is_discarded() || !tree.is_object() || !tree.contains("state")) {
    return absl::InvalidArgumentError("its ddprun.tree is not JSON");
  }
  const std::uint64_t data_begin = 8 + n;
  const std::uint64_t data_size = file.size() - data_begin;
  struct Copy {
    std::uint64_t from, to, size;
  };
  std::vector<Copy> copies;
  std::uint64_t end = 0;
  auto blob = [&](Json& node, const std::string& path) -> absl::Status {
    const std::string name = node.value("tensor", "");
    if (name.empty() || !header.contains(name) || !header[name].is_object() ||
        !header[name].contains("data_offsets") || !node.contains("n") ||
        !node["n"].is_number_unsigned()) {
      return absl::InvalidArgumentError(absl::StrCat("the array at '", path, "' has no tensor"));
    }
    const Json& offs = header[name]["data_offsets"];
    if (!offs.is_array() || offs.size() != 2 || !offs[0].is_number_unsigned() ||
        !offs[1].is_number_unsigned()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has bad data_offsets"));
    }
    const std::uint64_t b = offs[0].get<std::uint64_t>(), e = offs[1].get<std::uint64_t>();
    const std::uint64_t size = node["n"].get<std::uint64_t>();
    if (e < b || e > data_size || e - b != size) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' lies outside the data"));
    }
    copies.push_back({data_begin + b, end, size});
    node.erase("tensor");
    node["off"] = end;
    end = AlignUp(end + size);
    return absl::OkStatus();
  };
  if (absl::Status st = Walk(tree["state"], "", blob); !st.ok()) return st;
  const std::string text = tree.dump();
  const std::uint64_t data_start = AlignUp(8 + text.size());
  out.snapshot.assign(data_start + end, '\0');
  std::memcpy(out.snapshot.data(), U64Bytes(text.size()).data(), 8);
  std::memcpy(out.snapshot.data() + 8, text.data(), text.size());
  for (const Copy& c : copies) {
    std::memcpy(out.snapshot.data() + data_start + c.to, file.data() + c.from, c.size);
  }
  return out;
}

}  // namespace ddprun::agent
