// A Gloo TCP device on 127.0.0.1, for tests of the SDK's Gloo pieces that run
// ranks as threads (tests only use loopback addresses).
#pragma once

#include <memory>

#include "gloo/transport/tcp/device.h"

namespace ddprun::test {

inline std::shared_ptr<gloo::transport::Device> LoopbackDevice() {
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  return gloo::transport::tcp::CreateDevice(attr);
}

}  // namespace ddprun::test
