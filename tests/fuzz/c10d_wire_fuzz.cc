// libFuzzer target: arbitrary bytes as one TCPStore connection's input.
// Decodes request after request as the server does (dialect detected from the
// first bytes), once whole and once fed in chunks as recv(2) delivers them,
// serves each decoded request against a KvEngine as the server does
// (RequestHandler), and checks the codec's contract on every step:
//  - kNeedMore asks for more than is there, and never past kMaxRequestBytes;
//  - kError carries a one-line reason;
//  - kComplete consumes what it decoded, and re-encoding the request gives
//    back exactly those bytes;
//  - however the bytes are chunked, the same requests and the same outcome;
//  - serving never crashes, and the client leaving leaves no waiter behind.
// Built by scripts/fuzz.sh (clang, -fsanitize=fuzzer,address,undefined).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ddprun/rendezvous/common/status_macros.h"
#include "ddprun/rendezvous/store/c10d_store_handler.h"
#include "ddprun/rendezvous/store/c10d_wire.h"
#include "ddprun/rendezvous/store/kv_engine.h"

using ddprun::rendezvous::KvEngine;
using ddprun::rendezvous::c10d::DecodeResult;
using ddprun::rendezvous::c10d::DecodeStatus;
using ddprun::rendezvous::c10d::EncodeRequest;
using ddprun::rendezvous::c10d::kMaxRequestBytes;
using ddprun::rendezvous::c10d::Request;
using ddprun::rendezvous::c10d::RequestDecoder;
using ddprun::rendezvous::c10d::RequestHandler;
using ddprun::rendezvous::c10d::Session;

namespace {

struct Outcome {
  std::vector<std::size_t> requests;  // the size of each decoded request
  DecodeStatus last = DecodeStatus::kNeedMore;
};

// Decodes the whole input at once, checking every step, and serves each
// request as the server would (a refused one ends the connection).
Outcome DecodeWhole(std::string_view input) {
  Outcome out;
  RequestDecoder decoder;
  Request req;
  KvEngine engine;
  RequestHandler handler(&engine);
  Session session;
  std::vector<std::pair<std::uint64_t, absl::Status>> done;
  const RequestHandler::WaitDone on_done = [&done](std::uint64_t token, absl::Status st) {
    done.emplace_back(token, std::move(st));
  };
  bool serving = true;
  auto deliver = [&] {
    std::vector<std::pair<std::uint64_t, absl::Status>> now;
    now.swap(done);
    for (auto& [token, st] : now) {
      if (serving && !handler.OnWaitDone(&session, token, st).ok()) serving = false;
    }
  };
  struct Hangup {  // the client leaves: its waits are cancelled
    std::function<void()> run;
    ~Hangup() { run(); }
  } hangup{[&] {
    handler.CancelWaits(&session, absl::CancelledError("fuzz input ended"));
    deliver();
    DDPRUN_CHECK(engine.NumWaiters() == 0) << engine.NumWaiters();
  }};
  std::size_t offset = 0;
  while (true) {
    const std::string_view rest = input.substr(offset);
    const DecodeResult r = decoder.Decode(rest, &req);
    out.last = r.status;
    if (r.status == DecodeStatus::kNeedMore) {
      DDPRUN_CHECK(r.need > rest.size()) << r.need << " <= " << rest.size();
      DDPRUN_CHECK(r.need <= kMaxRequestBytes) << r.need;
      return out;
    }
    if (r.status == DecodeStatus::kError) {
      DDPRUN_CHECK(!r.error.empty());
      DDPRUN_CHECK(r.error.find('\n') == std::string::npos) << r.error;
      return out;
    }
    DDPRUN_CHECK(r.consumed > 0 && r.consumed <= rest.size()) << r.consumed;
    std::string again;
    const absl::Status st = EncodeRequest(decoder.dialect(), req, &again);
    DDPRUN_CHECK(st.ok()) << st;
    DDPRUN_CHECK(again == rest.substr(0, r.consumed)) << "re-encoding differs";
    if (serving) {
      serving = handler.Handle(req, &session, on_done).ok();
      deliver();
    }
    out.requests.push_back(r.consumed);
    offset += r.consumed;
  }
}

// Decodes the input as the server receives it: in chunks, decoding only once
// the buffer holds what the last kNeedMore asked for.
Outcome DecodeChunked(std::string_view input, std::size_t chunk) {
  Outcome out;
  RequestDecoder decoder;
  Request req;
  std::string buffer;
  std::size_t fed = 0, need = 1;
  while (fed < input.size()) {
    const std::size_t n = std::min(chunk, input.size() - fed);
    buffer.append(input.data() + fed, n);
    fed += n;
    while (buffer.size() >= need) {
      const DecodeResult r = decoder.Decode(buffer, &req);
      out.last = r.status;
      if (r.status == DecodeStatus::kError) return out;
      if (r.status == DecodeStatus::kNeedMore) {
        need = r.need;
        break;
      }
      out.requests.push_back(r.consumed);
      buffer.erase(0, r.consumed);
      need = 1;
    }
  }
  if (out.last == DecodeStatus::kComplete) out.last = DecodeStatus::kNeedMore;  // nothing left
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const Outcome whole = DecodeWhole(input);
  const Outcome chunked = DecodeChunked(input, 1 + size % 16);  // the seeds stay plain requests
  DDPRUN_CHECK(whole.requests == chunked.requests) << "chunking changed the requests";
  DDPRUN_CHECK(whole.last == chunked.last) << "chunking changed the outcome";
  return 0;
}
