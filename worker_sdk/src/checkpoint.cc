// ddp::checkpoint (ddp/checkpoint.h): named byte spans in the agent's
// checkpoint memory, in the layout of checkpoint_layout.h and the snapshot
// format of worker_sdk/python/ddprun/checkpoint.py, so that either side
// loads what the other saved. The tree this side writes is the subset for
// named byte blobs: {"format": 1, "state": {"t": "dict", "items":
// [[name, {"t": "bytes", "off": N, "n": bytes}], ...]}}. It reads a
// top-level dict with str keys whose values are bytes, bytearray, torch or
// numpy entries (their raw element bytes).
#include "ddp/checkpoint.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "ddp/error.h"
#include "ddprun/rendezvous/common/checkpoint_checksum.h"
#include "ddprun/rendezvous/common/checkpoint_layout.h"
#include "ddprun/rendezvous/common/errors.h"
#include "ddprun/rendezvous/common/worker_env_names.h"
#include "ddprun/rendezvous/store/c10d_store_client.h"
#include "nlohmann/json.hpp"

namespace ddp::checkpoint {
namespace {

namespace layout = ddprun::checkpoint_layout;
namespace checkpoint_checksum = ddprun::checkpoint_checksum;
using Json = nlohmann::ordered_json;

std::string Env(const char* name, const char* fallback = "") {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

std::int64_t EnvInt(const char* name, std::int64_t fallback) {
  std::int64_t v = 0;
  return absl::SimpleAtoi(Env(name), &v) ? v : fallback;
}

// "[job <id> round <n> rank <r>] " when under ddprun, else "".
std::string Fence() {
  const std::string job = Env(ddprun::kEnvJobId);
  if (job.empty()) return "";
  return ddprun::rendezvous::Fence(job, EnvInt(ddprun::kEnvRound, 0),
                                   static_cast<int>(EnvInt("RANK", 0)));
}

std::string SizeText(std::uint64_t n) {
  const std::pair<const char*, std::uint64_t> units[] = {
      {"GiB", 1ull << 30}, {"MiB", 1ull << 20}, {"KiB", 1ull << 10}};
  for (const auto& [unit, scale] : units) {
    if (n >= scale) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.1f %s", static_cast<double>(n) / scale, unit);
      return buf;
    }
  }
  return absl::StrCat(n, " bytes");
}

std::uint64_t AlignUp(std::uint64_t n) {
  return (n + layout::kDataAlign - 1) / layout::kDataAlign * layout::kDataAlign;
}

// One slot record, as checkpoint_layout.h places it.
struct Record {
  std::uint32_t state = 0;
  std::uint32_t crc = 0;
  std::uint64_t generation = 0;
  std::int64_t step = 0;
  std::uint64_t size = 0;
  std::int32_t rank = 0;
  std::int32_t world_size = 0;
  std::uint32_t checksum_kind = layout::kChecksumCrc32c;
};

// This worker's checkpoint memory, mapped once for the process (the
// mapping lives as long as the process, like Python's).
class Memory {
 public:
  static Memory& Get(const char* who) {
    static Memory* memory = nullptr;
    if (memory == nullptr) memory = new Memory(who);
    return *memory;
  }

  unsigned char* base() const { return base_; }
  int slots() const { return slots_; }
  std::uint64_t capacity() const { return capacity_; }
  std::uint64_t limit() const { return limit_; }
  unsigned char* slot_data(int slot) const {
    return base_ + layout::SlotDataOffset(slot, capacity_);
  }

  Record record(int slot) const {
    const unsigned char* r = base_ + layout::SlotRecordOffset(slot);
    Record rec;
    rec.state = StateOf(slot);
    std::memcpy(&rec.crc, r + layout::kCrcOffset, 4);
    std::memcpy(&rec.generation, r + layout::kGenerationOffset, 8);
    std::memcpy(&rec.step, r + layout::kStepOffset, 8);
    std::memcpy(&rec.size, r + layout::kSizeOffset, 8);
    std::memcpy(&rec.rank, r + layout::kRankOffset, 4);
    std::memcpy(&rec.world_size, r + layout::kWorldSizeOffset, 4);
    std::memcpy(&rec.checksum_kind, r + layout::kChecksumKindOffset, 4);
    return rec;
  }

  // The record's fields but its state, which stays as it is.
  void WriteRecord(int slot, const Record& rec) {
    unsigned char* r = base_ + layout::SlotRecordOffset(slot);
    std::memcpy(r + layout::kCrcOffset, &rec.crc, 4);
    std::memcpy(r + layout::kGenerationOffset, &rec.generation, 8);
    std::memcpy(r + layout::kStepOffset, &rec.step, 8);
    std::memcpy(r + layout::kSizeOffset, &rec.size, 8);
    std::memcpy(r + layout::kRankOffset, &rec.rank, 4);
    std::memcpy(r + layout::kChecksumKindOffset, &rec.checksum_kind, 4);
    std::memcpy(r + layout::kWorldSizeOffset, &rec.world_size, 4);
  }

  // The agent's replica gate word (checkpoint_layout.h): 0 open, else 1 +
  // the generation whose replica the next node acknowledged.
  std::uint64_t ReplicaGate() const {
    return std::atomic_ref<std::uint64_t>(
               *reinterpret_cast<std::uint64_t*>(base_ + layout::kReplicaGateOffset))
        .load(std::memory_order_acquire);
  }

  // One aligned 4-byte store, after every write before it (the commit).
  void SetState(int slot, std::uint32_t state) {
    std::atomic_ref<std::uint32_t>(*StateWord(slot)).store(state, std::memory_order_release);
  }

 private:
  explicit Memory(const char* who) {
    const std::string text = Env(ddprun::kEnvCkptFd);
    if (text.empty()) {
      throw StateError(
          absl::StrCat(Fence(), who, ": this worker has no checkpoint memory (", ddprun::kEnvCkptFd,
                       " is unset); run the program under ddprun, without --ckpt_shm_limit 0"));
    }
    int fd = -1;
    struct stat st {};
    void* p = MAP_FAILED;
    std::string why;
    if (!absl::SimpleAtoi(text, &fd) || fd < 0) {
      why = "not a descriptor number";
    } else if (::fstat(fd, &st) != 0) {
      why = std::strerror(errno);
    } else if (static_cast<std::uint64_t>(st.st_size) < layout::kHeaderBytes) {
      why = absl::StrCat("its size ", st.st_size, " is below the header's ", layout::kHeaderBytes);
    } else {
      p = ::mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) why = std::strerror(errno);
    }
    if (p == MAP_FAILED) {
      throw StateError(absl::StrCat(Fence(), who, ": ", ddprun::kEnvCkptFd, "=", text,
                                    " is not the agent's checkpoint memory (", why,
                                    "); do not set ", ddprun::kEnvCkptFd, " yourself"));
    }
    base_ = static_cast<unsigned char*>(p);
    std::uint32_t version = 0;
    std::memcpy(&version, base_ + layout::kVersionOffset, 4);
    if (std::memcmp(base_ + layout::kMagicOffset, layout::kMagic, sizeof layout::kMagic) != 0 ||
        version != layout::kVersion) {
      throw StateError(absl::StrCat(Fence(), who, ": ", ddprun::kEnvCkptFd, "=", text,
                                    " does not hold checkpoint memory of version ",
                                    layout::kVersion, "; use the ddprun this SDK came with"));
    }
    std::uint32_t slots = 0;
    std::memcpy(&slots, base_ + layout::kSlotsOffset, 4);
    std::memcpy(&capacity_, base_ + layout::kCapacityOffset, 8);
    std::memcpy(&limit_, base_ + layout::kLimitOffset, 8);
    const std::uint64_t size = st.st_size;
    if (slots < layout::kSlotsPlain || slots > layout::kMaxSlots ||
        capacity_ > (size - layout::kHeaderBytes) / slots || limit_ > capacity_) {
      throw StateError(absl::StrCat(Fence(), who, ": ", ddprun::kEnvCkptFd, "=", text,
                                    " has a header that does not fit its size; use the ddprun "
                                    "this SDK came with"));
    }
    slots_ = static_cast<int>(slots);
  }

  std::uint32_t* StateWord(int slot) const {
    return reinterpret_cast<std::uint32_t*>(base_ + layout::SlotRecordOffset(slot) +
                                            layout::kStateOffset);
  }
  std::uint32_t StateOf(int slot) const {
    return std::atomic_ref<std::uint32_t>(*StateWord(slot)).load(std::memory_order_acquire);
  }

  unsigned char* base_ = nullptr;
  int slots_ = 0;  // from the header: 2, or 3 with --ckpt_replicas 1
  std::uint64_t capacity_ = 0;
  std::uint64_t limit_ = 0;
};

// With --ckpt_replicas 1, returns once the next node acknowledged the
// replica of this rank's previous snapshot (`generation`, committed before
// the one of `step`, whose transfer overlapped this step) or a newer one, or
// the agent opened the gate (no successor, or it cannot send to it), or
// DDPRUN_CKPT_REPLICA_WAIT passed (then one line on stderr says so;
// docs/checkpoint.md, "Replica lag"). Generation 0 (no previous snapshot):
// at once.
void AwaitReplica(const Memory& mem, std::uint64_t generation, std::int64_t step) {
  auto done = [&] {
    const std::uint64_t gate = mem.ReplicaGate();
    return generation == 0 || gate == 0 || gate - 1 >= generation;
  };
  if (done()) return;
  double limit_s = layout::kDefaultReplicaWaitSeconds;
  if (const std::string t = Env(layout::kEnvReplicaWait);
      !t.empty() && (!absl::SimpleAtod(t, &limit_s) || !(limit_s >= 0))) {
    throw InvalidArgumentError(
        absl::StrCat(Fence(), "ddp::checkpoint::Save: ", layout::kEnvReplicaWait, "='", t,
                     "' is not a number of seconds >= 0; unset it (default ",
                     layout::kDefaultReplicaWaitSeconds, ") or fix it"));
  }
  if (limit_s == 0) return;  // the user chose not to wait
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  auto pause = std::chrono::microseconds(200);
  bool noticed = false;
  for (;;) {
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(2000));
    if (done()) return;
    const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
    if (waited >= limit_s) {
      std::fprintf(stderr,
                   "%sddp::checkpoint::Save: the replica of the step before %lld was not "
                   "acknowledged by the next node within %s=%g s; returning without it, so a "
                   "loss of this node now may leave no step in common (docs/checkpoint.md, "
                   "\"Replica lag\"); check the next node or raise %s\n",
                   Fence().c_str(), static_cast<long long>(step), layout::kEnvReplicaWait, limit_s,
                   layout::kEnvReplicaWait);
      return;
    }
    if (!noticed && waited >= layout::kReplicaWaitNoticeSeconds) {
      noticed = true;
      std::fprintf(stderr,
                   "%sddp::checkpoint::Save: step %lld is saved here and waits for the replica "
                   "of the step before it to reach the next node (up to %s=%g s)\n",
                   Fence().c_str(), static_cast<long long>(step), layout::kEnvReplicaWait, limit_s);
    }
  }
}

// The test hook: this rank dies (SIGKILL) halfway through copying `step`,
// on the first attempt only.
bool DieInSave(std::int64_t step) {
  const std::string spec = Env(layout::kEnvTestDieInSave);
  if (spec.empty() || Env("TORCHELASTIC_RESTART_COUNT", "0") != "0") return false;
  const std::vector<std::string> parts = absl::StrSplit(spec, absl::MaxSplits(':', 1));
  return parts.size() == 2 && parts[0] == Env("RANK") && parts[1] == std::to_string(step);
}

// The JSON text of a name; InvalidArgument when it is not UTF-8.
std::string NameJson(const std::string& name, std::size_t index) {
  try {
    return Json(name).dump();
  } catch (const Json::exception&) {
    throw InvalidArgumentError(absl::StrCat(Fence(), "ddp::checkpoint::Save: the name of span ",
                                            index, " is not valid UTF-8; name spans in UTF-8"));
  }
}

// The steps every node's ranks all committed: this node's from the agent,
// the others' through the round's TCPStore (the keys of Python's load).
std::set<std::int64_t> AgreedSteps(const std::set<std::int64_t>& local) {
  const std::int64_t world = EnvInt("WORLD_SIZE", 1);
  if (EnvInt("LOCAL_WORLD_SIZE", world) == world) return local;
  const std::int64_t nodes = EnvInt("GROUP_WORLD_SIZE", 1);
  double timeout_s = layout::kDefaultAgreeTimeoutSeconds;
  if (const std::string t = Env(layout::kEnvAgreeTimeout);
      !t.empty() && (!absl::SimpleAtod(t, &timeout_s) || timeout_s <= 0)) {
    throw InvalidArgumentError(
        absl::StrCat(Fence(), "ddp::checkpoint::Load: ", layout::kEnvAgreeTimeout, "='", t,
                     "' is not a positive number of seconds; unset it "
                     "(default ",
                     layout::kDefaultAgreeTimeoutSeconds, ") or fix it"));
  }
  std::int64_t port = 0;
  const std::string addr = Env("MASTER_ADDR");
  if (addr.empty() || !absl::SimpleAtoi(Env("MASTER_PORT"), &port)) {
    throw StateError(absl::StrCat(Fence(),
                                  "ddp::checkpoint::Load: MASTER_ADDR/MASTER_PORT are "
                                  "not set; run the program under ddprun"));
  }
  const auto timeout = std::chrono::duration_cast<ddprun::rendezvous::Duration>(
      std::chrono::duration<double>(timeout_s));
  auto client = ddprun::rendezvous::C10dStoreClient::Connect(addr, static_cast<int>(port), timeout);
  if (!client.ok()) {
    throw ConnectionError(absl::StrCat(Fence(),
                                       "ddp::checkpoint::Load: cannot reach the round's "
                                       "store to agree on a step: ",
                                       client.status().message()));
  }
  const std::string prefix = absl::StrCat(layout::kAgreeKeyPrefix, Env(ddprun::kEnvJobId), "/",
                                          Env(ddprun::kEnvRound), "/");
  if (absl::Status s = (*client)->Set(prefix + Env("GROUP_RANK", "0"), absl::StrJoin(local, ","));
      !s.ok()) {
    throw ConnectionError(absl::StrCat(Fence(),
                                       "ddp::checkpoint::Load: cannot publish this "
                                       "node's steps: ",
                                       s.message()));
  }
  std::set<std::int64_t> common = local;
  std::vector<std::string> held;  // "node <g>: <steps>", for the line below
  for (std::int64_t node = 0; node < nodes; ++node) {
    absl::StatusOr<std::string> text = (*client)->Get(absl::StrCat(prefix, node), timeout);
    if (absl::IsDeadlineExceeded(text.status())) {
      throw TimeoutError(absl::StrCat(Fence(), "ddp::checkpoint::Load: node ", node,
                                      " did not publish its checkpoint steps within ", timeout_s,
                                      " s; every rank must call Load() at start"));
    }
    if (!text.ok()) {
      throw ConnectionError(absl::StrCat(Fence(), "ddp::checkpoint::Load: cannot read node ", node,
                                         "'s steps: ", text.status().message()));
    }
    held.push_back(absl::StrCat("node ", node, ": ", text->empty() ? "none" : *text));
    std::set<std::int64_t> theirs;
    for (absl::string_view s : absl::StrSplit(*text, ',', absl::SkipEmpty())) {
      std::int64_t v = 0;
      if (absl::SimpleAtoi(s, &v)) theirs.insert(v);
    }
    std::set<std::int64_t> both;
    std::set_intersection(common.begin(), common.end(), theirs.begin(), theirs.end(),
                          std::inserter(both, both.end()));
    common = std::move(both);
  }
  // Steps exist but none is held by every node (a node restored from a peer
  // replica that was behind the others, say): the job starts over, which
  // must not pass in silence. Said once per node.
  if (common.empty() && EnvInt("LOCAL_RANK", 0) == 0 &&
      std::any_of(held.begin(), held.end(),
                  [](const std::string& h) { return !absl::EndsWith(h, ": none"); })) {
    std::fprintf(stderr, "%s\n",
                 absl::StrCat(Fence(), "ddp::checkpoint::Load: no step is held by every node (",
                              absl::StrJoin(held, "; "),
                              "); starting without a checkpoint (docs/checkpoint.md, \"No step "
                              "in common\")")
                     .c_str());
  }
  return common;
}

[[noreturn]] void Corrupt(std::int64_t step, const std::string& what) {
  throw StateError(absl::StrCat(Fence(), "ddp::checkpoint::Load: the snapshot of step ", step,
                                " is not one this API reads: ", what));
}

// The buffers of a snapshot's tree; `data` is where its data starts and
// `data_size` how many bytes follow.
std::vector<Buffer> Decode(const Json& tree, std::int64_t step, const unsigned char* data,
                           std::uint64_t data_size) {
  if (!tree.is_object() || tree.value("format", 0) != layout::kSnapshotFormat ||
      !tree.contains("state")) {
    Corrupt(step, absl::StrCat("its format is not ", layout::kSnapshotFormat,
                               "; use the ddprun this SDK came with"));
  }
  const Json& state = tree["state"];
  if (!state.is_object() || state.value("t", "") != "dict" || !state.contains("items")) {
    Corrupt(step,
            "its state is not a dict; save a dict of named tensors, arrays or bytes (from "
            "Python) to load it here");
  }
  std::vector<Buffer> out;
  for (const Json& item : state["items"]) {
    if (!item.is_array() || item.size() != 2 || !item[0].is_string()) {
      Corrupt(step, absl::StrCat("a key of state is not a str (", item.dump(),
                                 "); save a dict with str keys"));
    }
    const std::string name = item[0].get<std::string>();
    const Json& node = item[1];
    const std::string t = node.is_object() ? node.value("t", "") : "";
    if (t != "bytes" && t != "bytearray" && t != "torch" && t != "numpy") {
      Corrupt(step, absl::StrCat("state['", name, "'] is ", t == "v" ? "a scalar" : "a " + t,
                                 " entry; this API reads a dict whose values are tensors, arrays "
                                 "or bytes"));
    }
    const std::uint64_t off = node.value("off", std::uint64_t{0});
    const std::uint64_t n = node.value("n", std::uint64_t{0});
    if (off > data_size || n > data_size - off) {
      Corrupt(step, absl::StrCat("state['", name, "'] lies outside the snapshot"));
    }
    Buffer b;
    b.name = name;
    b.bytes.resize(n);
    if (n) std::memcpy(b.bytes.data(), data + off, n);
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace

const Buffer* Snapshot::Find(const std::string& name) const {
  for (const Buffer& b : buffers) {
    if (b.name == name) return &b;
  }
  return nullptr;
}

const Buffer& Snapshot::Get(const std::string& name) const {
  if (const Buffer* b = Find(name)) return *b;
  std::vector<std::string> names;
  for (const Buffer& b : buffers) names.push_back("'" + b.name + "'");
  throw InvalidArgumentError(
      absl::StrCat("ddp::checkpoint::Snapshot::Get: step ", step, " has no buffer '", name,
                   "' (it has ", names.empty() ? "none" : absl::StrJoin(names, ", "), ")"));
}

void Save(std::int64_t step, const std::vector<Span>& spans) {
  // --ckpt_every N: only multiples of N are saved.
  if (step % std::max<std::int64_t>(1, EnvInt(ddprun::kEnvCkptEvery, 1)) != 0) return;
  // The tree and each blob's place in the data, checked before any write.
  std::string items;
  std::vector<std::uint64_t> offsets;
  std::set<std::string_view> names;
  std::uint64_t end = 0;
  for (std::size_t i = 0; i < spans.size(); ++i) {
    const Span& s = spans[i];
    if (s.name.empty()) {
      throw InvalidArgumentError(absl::StrCat(Fence(), "ddp::checkpoint::Save: span ", i,
                                              " has an empty name; give every span a name"));
    }
    if (!names.insert(s.name).second) {
      throw InvalidArgumentError(absl::StrCat(Fence(), "ddp::checkpoint::Save: the name '", s.name,
                                              "' is given twice (span ", i,
                                              "); give every span its own name"));
    }
    if (s.data == nullptr && s.size != 0) {
      throw InvalidArgumentError(absl::StrCat(Fence(), "ddp::checkpoint::Save: span '", s.name,
                                              "' has null data and size ", s.size));
    }
    offsets.push_back(end);
    absl::StrAppend(&items, i ? "," : "", "[", NameJson(s.name, i),
                    ",{\"t\":\"bytes\",\"off\":", end, ",\"n\":", s.size, "}]");
    end = AlignUp(end + s.size);
  }
  const std::string tree = absl::StrCat("{\"format\":", layout::kSnapshotFormat,
                                        ",\"state\":{\"t\":\"dict\",\"items\":[", items, "]}}");
  Memory& mem = Memory::Get("ddp::checkpoint::Save");
  const std::uint64_t data_start = AlignUp(8 + tree.size());
  const std::uint64_t total = data_start + end;
  if (total > mem.limit()) {
    throw InvalidArgumentError(
        absl::StrCat(Fence(), "ddp::checkpoint::Save: the snapshot of step ", step, " needs ",
                     SizeText(total), " (", total, " bytes), more than --ckpt_shm_limit (",
                     SizeText(mem.limit()), ", ", mem.limit(),
                     " bytes per worker); raise --ckpt_shm_limit (or PET_CKPT_SHM_LIMIT) or save "
                     "less"));
  }
  // The oldest slot: one not committed (empty, or a save cut short) first,
  // else the committed one of the lowest generation; never the newest.
  int slot = -1;
  bool slot_free = false;
  std::uint64_t slot_generation = 0;
  std::uint64_t generation = 0;  // the newest committed one's
  for (int s = 0; s < mem.slots(); ++s) {
    const Record r = mem.record(s);
    if (r.state != layout::kSlotCommitted) {
      if (!slot_free) slot = s;
      slot_free = true;
      continue;
    }
    generation = std::max(generation, r.generation);
    if (!slot_free && (slot < 0 || r.generation < slot_generation)) {
      slot = s;
      slot_generation = r.generation;
    }
  }
  mem.SetState(slot, layout::kSlotWriting);  // from here the slot is not loadable
  unsigned char* base = mem.slot_data(slot);
  const std::uint64_t tree_len = tree.size();
  std::memcpy(base, &tree_len, 8);
  std::memcpy(base + 8, tree.data(), tree.size());
  const bool die = DieInSave(step);
  // One pass: each span is checksummed as it is copied; the tree and the
  // padding between spans (whatever the slot held) are read where they are.
  const int threads = checkpoint_checksum::DefaultCopyThreads();
  std::uint32_t crc = 0;
  std::uint64_t pos = 0;
  for (std::size_t i = 0; i < spans.size(); ++i) {
    const std::uint64_t at = data_start + offsets[i];
    crc = checkpoint_checksum::Crc32c(crc, base + pos, at - pos);
    crc = checkpoint_checksum::CopyCrc32c(crc, base + at, spans[i].data, spans[i].size, threads);
    pos = at + spans[i].size;
    if (die && offsets[i] + spans[i].size >= end / 2) ::raise(SIGKILL);
  }
  if (die) ::raise(SIGKILL);
  Record rec;
  rec.crc = checkpoint_checksum::Crc32c(crc, base + pos, total - pos);
  rec.checksum_kind = layout::kChecksumCrc32c;
  rec.generation = generation + 1;
  rec.step = step;
  rec.size = total;
  rec.rank = static_cast<std::int32_t>(EnvInt("RANK", 0));
  rec.world_size = static_cast<std::int32_t>(EnvInt("WORLD_SIZE", 1));
  mem.WriteRecord(slot, rec);
  mem.SetState(slot, layout::kSlotCommitted);  // the commit: last
  AwaitReplica(mem, generation, step);         // the previous snapshot's replica
}

std::optional<Snapshot> Load() {
  Memory& mem = Memory::Get("ddp::checkpoint::Load");
  std::set<std::int64_t> local;
  for (absl::string_view s : absl::StrSplit(Env(ddprun::kEnvCkptSteps), ',', absl::SkipEmpty())) {
    std::int64_t v = 0;
    if (!absl::SimpleAtoi(s, &v)) {
      throw StateError(absl::StrCat(Fence(), "ddp::checkpoint::Load: ", ddprun::kEnvCkptSteps, "='",
                                    Env(ddprun::kEnvCkptSteps),
                                    "' is not a list of steps; do not set it yourself"));
    }
    local.insert(v);
  }
  const std::set<std::int64_t> steps = AgreedSteps(local);
  if (steps.empty()) return std::nullopt;
  const std::int64_t step = *steps.rbegin();
  const std::int32_t rank = static_cast<std::int32_t>(EnvInt("RANK", 0));
  const std::int32_t world = static_cast<std::int32_t>(EnvInt("WORLD_SIZE", 1));
  int slot = -1;
  Record rec;
  for (int s = 0; s < mem.slots(); ++s) {
    const Record r = mem.record(s);
    if (r.state == layout::kSlotCommitted && r.step == step && r.rank == rank &&
        r.world_size == world && (slot < 0 || r.generation > rec.generation)) {
      slot = s;
      rec = r;
    }
  }
  if (slot < 0) {
    throw StateError(absl::StrCat(Fence(), "ddp::checkpoint::Load: the snapshot of step ", step,
                                  " is no longer in this worker's memory (saved over since the "
                                  "worker started); call Load() before Save()"));
  }
  const unsigned char* base = mem.slot_data(slot);
  if (rec.size < 8 || rec.size > mem.capacity()) Corrupt(step, "its recorded size is wrong");
  const std::uint32_t crc =
      checkpoint_checksum::SnapshotChecksum(rec.checksum_kind, base, rec.size);
  if (crc != rec.crc) {
    char text[96];
    std::snprintf(text, sizeof text, "(checksum %08x, recorded %08x)", crc, rec.crc);
    throw StateError(absl::StrCat(
        Fence(), "ddp::checkpoint::Load: the snapshot of step ", step, " in memory is corrupt ",
        text, "; something other than ddprun's checkpoint code wrote to ", ddprun::kEnvCkptFd));
  }
  std::uint64_t tree_len = 0;
  std::memcpy(&tree_len, base, 8);
  const std::uint64_t data_start = AlignUp(8 + tree_len);
  if (tree_len > rec.size - 8 || data_start > rec.size) Corrupt(step, "its tree is cut short");
  Json tree = Json::parse(base + 8, base + 8 + tree_len, nullptr, /*allow_exceptions=*/false);
  if (tree.is_discarded()) Corrupt(step, "its tree is not JSON");
  Snapshot snap;
  snap.step = step;
  try {
    snap.buffers = Decode(tree, step, base + data_start, rec.size - data_start);
  } catch (const Json::exception& e) {
    Corrupt(step, e.what());
  }
  return snap;
}

void Wait() {}

}  // namespace ddp::checkpoint
