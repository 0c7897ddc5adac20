// libFuzzer target: arbitrary bytes as one TCPStore connection's input.
// Decodes request after request as the server does (dialect detected from the
// first bytes) and checks the codec's contract on every step:
//  - kNeedMore asks for more than is there, and never past kMaxRequestBytes;
//  - kError carries a one-line reason;
//  - kComplete consumes what it decoded, and re-encoding the request gives
//    back exactly those bytes.
// Built by scripts/fuzz.sh (clang, -fsanitize=fuzzer,address,undefined).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "ddprun/rendezvous/c10d_wire.h"
#include "ddprun/rendezvous/status_macros.h"

using ddprun::rendezvous::c10d::DecodeResult;
using ddprun::rendezvous::c10d::DecodeStatus;
using ddprun::rendezvous::c10d::kMaxRequestBytes;
using ddprun::rendezvous::c10d::Request;
using ddprun::rendezvous::c10d::RequestDecoder;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  RequestDecoder decoder;
  Request req;
  std::size_t offset = 0;
  while (true) {
    const std::string_view rest = input.substr(offset);
    const DecodeResult r = decoder.Decode(rest, &req);
    if (r.status == DecodeStatus::kNeedMore) {
      DDPRUN_CHECK(r.need > rest.size()) << r.need << " <= " << rest.size();
      DDPRUN_CHECK(r.need <= kMaxRequestBytes) << r.need;
      return 0;
    }
    if (r.status == DecodeStatus::kError) {
      DDPRUN_CHECK(!r.error.empty());
      DDPRUN_CHECK(r.error.find('\n') == std::string::npos) << r.error;
      return 0;
    }
    DDPRUN_CHECK(r.consumed > 0 && r.consumed <= rest.size()) << r.consumed;
    std::string again;
    const absl::Status st = EncodeRequest(decoder.dialect(), req, &again);
    DDPRUN_CHECK(st.ok()) << st;
    DDPRUN_CHECK(again == rest.substr(0, r.consumed)) << "re-encoding differs";
    offset += r.consumed;
  }
}
