// The wire codec of PyTorch's c10d TCPStore protocol: bytes in, a decoded
// request (or "need more bytes", or a one-line error) out; requests and
// replies encoded. Pure: no sockets, no threads, no clock. The server loop
// (c10d_store_server.h) and the client (c10d_store_client.h) move the bytes.
//
// Wire format (both dialects; little-endian, as torch sends host order on x86/arm):
//   request  = u8 query type, then the query's fields
//   string   = u64 length, then that many bytes (keys and values alike)
//   count    = u64 (number of keys that follow, for CHECK/WAIT/MULTI_*)
//   int      = i64 (ADD delta and replies, GETNUMKEYS, DELETE_KEY replies)
//
// Dialects, detected per connection from its first bytes (RequestDecoder):
//   legacy (torch 1.13 and 2.0): no handshake. Query types
//     SET=0 COMPARE_SET=1 GET=2 ADD=3 CHECK=4 WAIT=5 GETNUMKEYS=6 WATCH_KEY=7
//     DELETE_KEY=8 APPEND=9 MULTI_GET=10 MULTI_SET=11 CANCEL_WAIT=12.
//     torch 1.13 also opens a second "callback" connection that stays silent
//     unless watch_key() is called.
//   modern (torch 2.2+): the first query is VALIDATE (u8 0, u32 0x3C85F7CE),
//     usually followed by PING (u32 nonce, echoed back). Query types
//     VALIDATE=0 SET=1 COMPARE_SET=2 GET=3 ADD=4 CHECK=5 WAIT=6 GETNUMKEYS=7
//     DELETE_KEY=8 APPEND=9 MULTI_GET=10 MULTI_SET=11 CANCEL_WAIT=12 PING=13
//     QUEUE_PUSH=14 QUEUE_POP=15 QUEUE_LEN=16 LIST_KEYS=17 (as torch 2.11
//     sends them: captured on a GPU machine, tests/gpu/store_dialect.py).
//   A first byte 0 followed by the magic is VALIDATE; anything else is legacy
//   (a legacy SET follows the 0 with a u64 key length, whose low four bytes
//   can never equal the magic for a key within kMaxKeyBytes).
//   The torch 2.1-era numbering (no VALIDATE, no WATCH_KEY: DELETE_KEY=7 ...)
//   cannot be told apart from the legacy one on the wire and is not spoken.
//
// Replies: SET/APPEND/MULTI_SET/VALIDATE none; GET/COMPARE_SET a string;
// ADD/GETNUMKEYS/DELETE_KEY an i64; CHECK u8 kCheckReady/kCheckNotReady; WAIT
// u8 kStopWaiting once every key exists; CANCEL_WAIT u8 kWaitCanceled;
// MULTI_GET one string per key; PING the nonce (u32); QUEUE_LEN an i64;
// QUEUE_POP an i64 (the queue's length before the pop), then the popped value
// as a string when that length was not 0; LIST_KEYS an i64 count, then one
// string per key.
//
// Limits (kv_engine.h): a key is at most kMaxKeyBytes, a value kMaxValueBytes,
// a key count kMaxWaitKeys, a whole request kMaxRequestBytes. A request over
// a limit is an error as soon as its length field arrives: the decoder never
// asks for more than kMaxRequestBytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace ddprun::rendezvous::c10d {

inline constexpr std::uint32_t kValidationMagic = 0x3C85F7CE;
// The largest request buffered whole (MULTI_SET can carry many values).
inline constexpr std::size_t kMaxRequestBytes = 64u << 20;

// One-byte replies.
inline constexpr std::uint8_t kCheckReady = 0;
inline constexpr std::uint8_t kCheckNotReady = 1;
inline constexpr std::uint8_t kStopWaiting = 0;
inline constexpr std::uint8_t kWaitCanceled = 1;

enum class Dialect { kUnknown, kLegacy, kModern };
const char* DialectName(Dialect dialect);  // "unknown", "torch 1.13", "torch 2.x"

enum class Op {
  kValidate,
  kSet,
  kCompareSet,
  kGet,
  kAdd,
  kCheck,
  kWait,
  kGetNumKeys,
  kWatchKey,
  kDeleteKey,
  kAppend,
  kMultiGet,
  kMultiSet,
  kCancelWait,
  kPing,
  kQueuePush,
  kQueuePop,
  kQueueLen,
  kListKeys,
  kUnknown,
};
const char* OpName(Op op);  // "SET", "MULTI_GET", ...

// The op a query-type byte means in `dialect` (kUnknown for none, and for
// Dialect::kUnknown).
Op OpOf(Dialect dialect, std::uint8_t type);
// The query-type byte of `op` in `dialect`; nullopt when the dialect lacks it.
std::optional<std::uint8_t> QueryType(Dialect dialect, Op op);

// One request. The views point into the decoded buffer (or, to encode, into
// the caller's strings) and live as long as it.
//   keys:   SET, COMPARE_SET, GET, ADD, DELETE_KEY, APPEND, WATCH_KEY and the
//           queue queries one; CHECK, WAIT, MULTI_GET, MULTI_SET any number;
//           GETNUMKEYS, CANCEL_WAIT, LIST_KEYS none.
//   values: SET, APPEND, QUEUE_PUSH one; COMPARE_SET two (expected, desired);
//           MULTI_SET one per key.
struct Request {
  Op op = Op::kUnknown;
  std::vector<std::string_view> keys;
  std::vector<std::string_view> values;
  std::int64_t delta = 0;  // ADD
  std::uint32_t u32 = 0;   // VALIDATE: the magic; PING: the nonce
};

enum class DecodeStatus {
  kComplete,  // *req holds one request of `consumed` bytes
  kNeedMore,  // the buffer must hold at least `need` bytes (<= kMaxRequestBytes)
  kError,     // the bytes are not a request we can serve; `error` says why
};

struct DecodeResult {
  DecodeStatus status = DecodeStatus::kNeedMore;
  std::size_t consumed = 0;
  std::size_t need = 0;
  std::string error;  // one line, e.g. "SET sent a key of 5000 bytes, over the limit of 4096"
};

// Decodes one request of `dialect` (kLegacy or kModern) from the front of
// `data`. Never reads past data.size(); a short buffer is kNeedMore.
DecodeResult DecodeRequest(Dialect dialect, std::string_view data, Request* req);

// The decoder of one connection: detects its dialect from the first bytes
// (then keeps it), and decodes request after request.
class RequestDecoder {
 public:
  explicit RequestDecoder(Dialect dialect = Dialect::kUnknown) : dialect_(dialect) {}
  // As DecodeRequest; the front of `data` is the connection's next request.
  DecodeResult Decode(std::string_view data, Request* req);
  Dialect dialect() const { return dialect_; }

 private:
  Dialect dialect_;
};

// Appends the wire form of `req` in `dialect`. InvalidArgument when the
// dialect has no such query, or req's keys/values do not fit its op or the
// limits; nothing is appended then. DecodeRequest reads back what this writes.
absl::Status EncodeRequest(Dialect dialect, const Request& req, std::string* out);

// Reply (and field) encoders.
void AppendU8(std::string* out, std::uint8_t v);
void AppendU32(std::string* out, std::uint32_t v);
void AppendI64(std::string* out, std::int64_t v);
void AppendString(std::string* out, std::string_view bytes);  // u64 length, bytes

}  // namespace ddprun::rendezvous::c10d
