// Builds a TCPStore request byte by byte (native byte order, as torch writes
// it), independently of the codec in rendezvous/src/c10d_wire.cc, so tests
// check the codec and the server against bytes written by hand.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ddprun::test {

class Msg {
 public:
  explicit Msg(std::uint8_t type) { U8(type); }
  Msg& U8(std::uint8_t v) { return Raw(&v, 1); }
  Msg& U32(std::uint32_t v) { return Raw(&v, 4); }
  Msg& U64(std::uint64_t v) { return Raw(&v, 8); }
  Msg& I64(std::int64_t v) { return Raw(&v, 8); }
  Msg& Str(const std::string& s) {
    U64(s.size());
    bytes_ += s;
    return *this;
  }
  operator std::string() const { return bytes_; }

 private:
  Msg& Raw(const void* p, std::size_t n) {
    bytes_.append(static_cast<const char*>(p), n);
    return *this;
  }
  std::string bytes_;
};

}  // namespace ddprun::test
