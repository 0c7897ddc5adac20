#include "ddprun/rendezvous/store/c10d_wire.h"

#include <cstring>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "ddprun/rendezvous/common/status_macros.h"
#include "ddprun/rendezvous/store/kv_engine.h"  // the limits (constants only)

namespace ddprun::rendezvous::c10d {
namespace {

constexpr Op kLegacyOps[] = {Op::kSet,       Op::kCompareSet, Op::kGet,        Op::kAdd,
                             Op::kCheck,     Op::kWait,       Op::kGetNumKeys, Op::kWatchKey,
                             Op::kDeleteKey, Op::kAppend,     Op::kMultiGet,   Op::kMultiSet,
                             Op::kCancelWait};
constexpr Op kModernOps[] = {
    Op::kValidate,   Op::kSet,        Op::kCompareSet, Op::kGet,      Op::kAdd,      Op::kCheck,
    Op::kWait,       Op::kGetNumKeys, Op::kDeleteKey,  Op::kAppend,   Op::kMultiGet, Op::kMultiSet,
    Op::kCancelWait, Op::kPing,       Op::kQueuePush,  Op::kQueuePop, Op::kQueueLen, Op::kListKeys};

// The fields of each op, in wire order after the query type.
enum class Shape {
  kNone,          // GETNUMKEYS, CANCEL_WAIT, LIST_KEYS
  kU32,           // VALIDATE, PING
  kKey,           // GET, DELETE_KEY, WATCH_KEY, QUEUE_POP, QUEUE_LEN
  kKeyValue,      // SET, APPEND, QUEUE_PUSH
  kKeyTwoValues,  // COMPARE_SET
  kKeyI64,        // ADD
  kKeys,          // CHECK, WAIT, MULTI_GET: count, keys
  kKeyValuePairs  // MULTI_SET: count, (key, value) pairs
};

Shape ShapeOf(Op op) {
  switch (op) {
    case Op::kValidate:
    case Op::kPing:
      return Shape::kU32;
    case Op::kSet:
    case Op::kAppend:
    case Op::kQueuePush:
      return Shape::kKeyValue;
    case Op::kCompareSet:
      return Shape::kKeyTwoValues;
    case Op::kGet:
    case Op::kDeleteKey:
    case Op::kWatchKey:
    case Op::kQueuePop:
    case Op::kQueueLen:
      return Shape::kKey;
    case Op::kAdd:
      return Shape::kKeyI64;
    case Op::kCheck:
    case Op::kWait:
    case Op::kMultiGet:
      return Shape::kKeys;
    case Op::kMultiSet:
      return Shape::kKeyValuePairs;
    case Op::kGetNumKeys:
    case Op::kCancelWait:
    case Op::kListKeys:
    case Op::kUnknown:
      break;
  }
  return Shape::kNone;
}

template <typename T>
void AppendValue(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// A bounds-checked cursor over one request. The first failed read records
// what went wrong: a short buffer (need_ = the size it must reach) or a field
// over its limit (error_).
class Reader {
 public:
  // Reads `data` from offset `pos` on.
  Reader(std::string_view data, std::size_t pos, Op op) : data_(data), op_(op), pos_(pos) {}

  template <typename T>
  bool Value(T* out) {
    if (!Need(sizeof(T))) return false;
    std::memcpy(out, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool Key(std::vector<std::string_view>* out) { return Bytes("key", kMaxKeyBytes, out); }
  bool Val(std::vector<std::string_view>* out) { return Bytes("value", kMaxValueBytes, out); }
  bool Count(std::uint64_t* n) {
    if (!Value(n)) return false;
    if (*n > kMaxWaitKeys) {
      error_ = absl::StrCat(OpName(op_), " sent a count of ", *n, " keys, over the limit of ",
                            kMaxWaitKeys);
      return false;
    }
    return true;
  }

  DecodeResult Done() const {
    DecodeResult r;
    if (pos_ > kMaxRequestBytes) {
      // Arrived whole, but the limit holds however the bytes were chunked.
      r.status = DecodeStatus::kError;
      r.error = TooBig(pos_);
      return r;
    }
    r.status = DecodeStatus::kComplete;
    r.consumed = pos_;
    return r;
  }
  // The result of a failed read.
  DecodeResult Failed() const {
    DecodeResult r;
    if (!error_.empty()) {
      r.status = DecodeStatus::kError;
      r.error = error_;
    } else if (need_ > kMaxRequestBytes) {
      r.status = DecodeStatus::kError;
      r.error = TooBig(need_);
    } else {
      r.status = DecodeStatus::kNeedMore;
      r.need = need_;
    }
    return r;
  }

 private:
  std::string TooBig(std::size_t bytes) const {
    return absl::StrCat(OpName(op_), " is a request of at least ", bytes,
                        " bytes, over the limit of ", kMaxRequestBytes);
  }
  bool Bytes(const char* what, std::size_t limit, std::vector<std::string_view>* out) {
    std::uint64_t len = 0;
    if (!Value(&len)) return false;
    if (len > limit) {
      error_ = absl::StrCat(OpName(op_), " sent a ", what, " of ", len,
                            " bytes, over the limit of ", limit);
      return false;
    }
    if (!Need(static_cast<std::size_t>(len))) return false;
    out->push_back(data_.substr(pos_, len));
    pos_ += len;
    return true;
  }
  bool Need(std::size_t n) {
    if (data_.size() - pos_ >= n) return true;
    need_ = pos_ + n;
    return false;
  }

  std::string_view data_;
  Op op_;
  std::size_t pos_;
  std::size_t need_ = 0;
  std::string error_;
};

// Checks that req's fields fit its op and the limits, for EncodeRequest.
absl::Status CheckShape(const Request& req) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("cannot encode ", OpName(req.op), ": ", why));
  };
  std::size_t keys = 0, values = 0;
  switch (ShapeOf(req.op)) {
    case Shape::kNone:
    case Shape::kU32:
      break;
    case Shape::kKey:
    case Shape::kKeyI64:
      keys = 1;
      break;
    case Shape::kKeyValue:
      keys = values = 1;
      break;
    case Shape::kKeyTwoValues:
      keys = 1;
      values = 2;
      break;
    case Shape::kKeys:
      keys = req.keys.size();
      break;
    case Shape::kKeyValuePairs:
      keys = values = req.keys.size();
      break;
  }
  if (req.keys.size() != keys || req.values.size() != values) {
    return bad(absl::StrCat("it takes ", keys, " key(s) and ", values, " value(s), not ",
                            req.keys.size(), " and ", req.values.size()));
  }
  if (keys > kMaxWaitKeys) {
    return bad(absl::StrCat(keys, " keys are over the limit of ", kMaxWaitKeys));
  }
  for (std::string_view k : req.keys) {
    if (k.size() > kMaxKeyBytes) {
      return bad(absl::StrCat("a key of ", k.size(), " bytes is over the limit of ", kMaxKeyBytes));
    }
  }
  for (std::string_view v : req.values) {
    if (v.size() > kMaxValueBytes) {
      return bad(
          absl::StrCat("a value of ", v.size(), " bytes is over the limit of ", kMaxValueBytes));
    }
  }
  return absl::OkStatus();
}

}  // namespace

const char* DialectName(Dialect dialect) {
  switch (dialect) {
    case Dialect::kLegacy:
      return "torch 1.13";
    case Dialect::kModern:
      return "torch 2.x";
    case Dialect::kUnknown:
      break;
  }
  return "unknown";
}

const char* OpName(Op op) {
  switch (op) {
    case Op::kValidate:
      return "VALIDATE";
    case Op::kSet:
      return "SET";
    case Op::kCompareSet:
      return "COMPARE_SET";
    case Op::kGet:
      return "GET";
    case Op::kAdd:
      return "ADD";
    case Op::kCheck:
      return "CHECK";
    case Op::kWait:
      return "WAIT";
    case Op::kGetNumKeys:
      return "GETNUMKEYS";
    case Op::kWatchKey:
      return "WATCH_KEY";
    case Op::kDeleteKey:
      return "DELETE_KEY";
    case Op::kAppend:
      return "APPEND";
    case Op::kMultiGet:
      return "MULTI_GET";
    case Op::kMultiSet:
      return "MULTI_SET";
    case Op::kCancelWait:
      return "CANCEL_WAIT";
    case Op::kPing:
      return "PING";
    case Op::kQueuePush:
      return "QUEUE_PUSH";
    case Op::kQueuePop:
      return "QUEUE_POP";
    case Op::kQueueLen:
      return "QUEUE_LEN";
    case Op::kListKeys:
      return "LIST_KEYS";
    case Op::kUnknown:
      break;
  }
  return "UNKNOWN";
}

Op OpOf(Dialect dialect, std::uint8_t type) {
  if (dialect == Dialect::kLegacy && type < std::size(kLegacyOps)) return kLegacyOps[type];
  if (dialect == Dialect::kModern && type < std::size(kModernOps)) return kModernOps[type];
  return Op::kUnknown;
}

std::optional<std::uint8_t> QueryType(Dialect dialect, Op op) {
  auto find = [op](const auto& table) -> std::optional<std::uint8_t> {
    for (std::size_t i = 0; i < std::size(table); ++i) {
      if (table[i] == op) return static_cast<std::uint8_t>(i);
    }
    return std::nullopt;
  };
  if (dialect == Dialect::kLegacy) return find(kLegacyOps);
  if (dialect == Dialect::kModern) return find(kModernOps);
  return std::nullopt;
}

DecodeResult DecodeRequest(Dialect dialect, std::string_view data, Request* req) {
  *req = Request{};
  if (data.empty()) {
    DecodeResult r;
    r.need = 1;
    return r;
  }
  const auto type = static_cast<std::uint8_t>(data[0]);
  req->op = OpOf(dialect, type);
  if (req->op == Op::kUnknown) {
    DecodeResult r;
    r.status = DecodeStatus::kError;
    r.error = absl::StrCat("unknown query type ", static_cast<int>(type),
                           dialect == Dialect::kModern
                               ? " (queries newer than torch 2.11's LIST_KEYS are not supported)"
                               : " (torch 1.13 dialect)");
    return r;
  }
  Reader r(data, 1, req->op);
  bool ok = true;
  std::uint64_t n = 0;
  switch (ShapeOf(req->op)) {
    case Shape::kNone:
      break;
    case Shape::kU32:
      ok = r.Value(&req->u32);
      break;
    case Shape::kKey:
      ok = r.Key(&req->keys);
      break;
    case Shape::kKeyValue:
      ok = r.Key(&req->keys) && r.Val(&req->values);
      break;
    case Shape::kKeyTwoValues:
      ok = r.Key(&req->keys) && r.Val(&req->values) && r.Val(&req->values);
      break;
    case Shape::kKeyI64:
      ok = r.Key(&req->keys) && r.Value(&req->delta);
      break;
    case Shape::kKeys:
      ok = r.Count(&n);
      for (std::uint64_t i = 0; ok && i < n; ++i) ok = r.Key(&req->keys);
      break;
    case Shape::kKeyValuePairs:
      ok = r.Count(&n);
      for (std::uint64_t i = 0; ok && i < n; ++i) ok = r.Key(&req->keys) && r.Val(&req->values);
      break;
  }
  return ok ? r.Done() : r.Failed();
}

DecodeResult RequestDecoder::Decode(std::string_view data, Request* req) {
  if (dialect_ == Dialect::kUnknown) {
    if (data.empty() || (data[0] == 0 && data.size() < 1 + sizeof(std::uint32_t))) {
      *req = Request{};
      DecodeResult r;
      r.need = data.empty() ? 1 : 1 + sizeof(std::uint32_t);
      return r;
    }
    std::uint32_t magic = 0;
    if (data[0] == 0) std::memcpy(&magic, data.data() + 1, sizeof(magic));
    dialect_ = magic == kValidationMagic ? Dialect::kModern : Dialect::kLegacy;
  }
  return DecodeRequest(dialect_, data, req);
}

absl::Status EncodeRequest(Dialect dialect, const Request& req, std::string* out) {
  const std::optional<std::uint8_t> type = QueryType(dialect, req.op);
  if (!type) {
    return absl::InvalidArgumentError(absl::StrCat("cannot encode ", OpName(req.op), ": the ",
                                                   DialectName(dialect),
                                                   " dialect has no such query"));
  }
  DDPRUN_RETURN_IF_ERROR(CheckShape(req));
  AppendU8(out, *type);
  switch (ShapeOf(req.op)) {
    case Shape::kNone:
      break;
    case Shape::kU32:
      AppendU32(out, req.u32);
      break;
    case Shape::kKey:
    case Shape::kKeyValue:
    case Shape::kKeyTwoValues:
      AppendString(out, req.keys[0]);
      for (std::string_view v : req.values) AppendString(out, v);
      break;
    case Shape::kKeyI64:
      AppendString(out, req.keys[0]);
      AppendI64(out, req.delta);
      break;
    case Shape::kKeys:
      AppendValue<std::uint64_t>(out, req.keys.size());
      for (std::string_view k : req.keys) AppendString(out, k);
      break;
    case Shape::kKeyValuePairs:
      AppendValue<std::uint64_t>(out, req.keys.size());
      for (std::size_t i = 0; i < req.keys.size(); ++i) {
        AppendString(out, req.keys[i]);
        AppendString(out, req.values[i]);
      }
      break;
  }
  return absl::OkStatus();
}

void AppendU8(std::string* out, std::uint8_t v) { AppendValue(out, v); }
void AppendU32(std::string* out, std::uint32_t v) { AppendValue(out, v); }
void AppendI64(std::string* out, std::int64_t v) { AppendValue(out, v); }
void AppendString(std::string* out, std::string_view bytes) {
  AppendValue<std::uint64_t>(out, bytes.size());
  out->append(bytes.data(), bytes.size());
}

}  // namespace ddprun::rendezvous::c10d
