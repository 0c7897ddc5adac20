// The ResNet-50 gradient set the SDK benchmarks all-reduce: torchvision's
// resnet50().parameters() sizes, in registration order (161 tensors,
// 25,557,032 values).
#pragma once

#include <cstddef>
#include <vector>

namespace ddprun::bench {

inline std::vector<std::size_t> ResNet50() {
  std::vector<std::size_t> p;
  auto conv = [&](std::size_t out, std::size_t in, std::size_t k) { p.push_back(out * in * k * k); };
  auto bn = [&](std::size_t c) {
    p.push_back(c);
    p.push_back(c);
  };
  conv(64, 3, 7);
  bn(64);
  std::size_t in = 64;
  const int blocks[4] = {3, 4, 6, 3};
  for (int layer = 0; layer < 4; ++layer) {
    const std::size_t planes = 64u << layer;
    for (int b = 0; b < blocks[layer]; ++b) {
      conv(planes, in, 1);
      bn(planes);
      conv(planes, planes, 3);
      bn(planes);
      conv(planes * 4, planes, 1);
      bn(planes * 4);
      if (b == 0) {
        conv(planes * 4, in, 1);
        bn(planes * 4);
      }
      in = planes * 4;
    }
  }
  p.push_back(1000 * 2048);
  p.push_back(1000);
  return p;
}

}  // namespace ddprun::bench
