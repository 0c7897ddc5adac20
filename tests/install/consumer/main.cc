// A program that embeds the installed worker SDK (tests/install/install_test.sh builds it
// with pkg-config and with find_package(ddprun)). Under ddprun it prints its rank; outside,
// the SDK's error for the missing environment. Exit 0 under ddprun, 3 outside.
#include <cstdio>

#include "ddp/ddp.h"

int main() {
  try {
    const ddp::WorkerInfo info = ddp::ReadWorkerEnvironment();
    std::printf("consumer: rank %d of %d\n", info.rank, info.world_size);
    return 0;
  } catch (const ddp::Error& e) {
    std::printf("consumer: ddp::Error: %s\n", e.what());
    return 3;
  }
}
