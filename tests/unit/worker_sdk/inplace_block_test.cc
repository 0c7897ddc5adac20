// The worker's side of the in-place control block (worker_sdk/src/
// inplace_block.h) over a real memfd that the test writes as the agent
// would (inplace_layout.h), and ddp::Reconfigure outside --restart_policy=inplace.
#include "inplace_block.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "ddp/ddp.h"
#include "ddprun/rendezvous/common/inplace_layout.h"
#include "support/inplace_agent_block.h"

namespace {

namespace layout = ddprun::inplace_layout;
using ddp::detail::InplaceBlock;
using ddprun::test::AgentBlock;
using namespace std::chrono_literals;

}  // namespace

TEST_CASE("inplace block: Register writes the pid and the can-re-form flag", "[unit]") {
  AgentBlock agent;
  auto block = InplaceBlock::Map(agent.fd(), "test");
  REQUIRE(block.ok());
  (*block)->Register();
  REQUIRE(agent.At<std::uint32_t>(layout::kWorkerPidOffset).load() ==
          static_cast<std::uint32_t>(::getpid()));
  REQUIRE((agent.At<std::uint32_t>(layout::kWorkerFlagsOffset).load() & layout::kFlagCanReform));
}

TEST_CASE("inplace block: WaitReady returns the published round once it is newer than the ack",
          "[unit]") {
  AgentBlock agent;
  auto block = InplaceBlock::Map(agent.fd(), "test");
  REQUIRE(block.ok());
  // Running, generation 0 = ack 0: nothing to re-form into.
  auto none = (*block)->WaitReady(20ms);
  REQUIRE(absl::IsDeadlineExceeded(none.status()));
  REQUIRE(std::string(none.status().message()).find(layout::kEnvReadyTimeout) != std::string::npos);
  // Broken, then published from another thread while the worker waits.
  std::thread agent_side([&] {
    agent.Break();
    std::this_thread::sleep_for(30ms);
    agent.Publish(std::string("RANK=3\0WORLD_SIZE=4\0DDPRUN_ROUND=2\0", 35), 2);
  });
  auto round = (*block)->WaitReady(10s);
  agent_side.join();
  REQUIRE(round.ok());
  REQUIRE(round->generation == 1);
  REQUIRE(round->round == 2);
  REQUIRE(round->env.size() == 3);
  REQUIRE(round->env[0] == std::make_pair(std::string("RANK"), std::string("3")));
  REQUIRE(round->env[2] == std::make_pair(std::string("DDPRUN_ROUND"), std::string("2")));
  (*block)->Ack(round->generation);
  REQUIRE(agent.At<std::uint64_t>(layout::kWorkerAckOffset).load() == 1);
  // Acknowledged: the same round is not returned again.
  REQUIRE(absl::IsDeadlineExceeded((*block)->WaitReady(20ms).status()));
}

TEST_CASE("inplace block: a descriptor that is not a block is refused, naming it", "[unit]") {
  const int fd = ::memfd_create("not-a-block", 0);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, layout::kBlockBytes) == 0);
  auto block = InplaceBlock::Map(fd, "7");
  ::close(fd);
  REQUIRE(absl::IsInvalidArgument(block.status()));
  const std::string msg(block.status().message());
  INFO(msg);
  REQUIRE(msg.find("DDPRUN_INPLACE_FD='7'") != std::string::npos);
  REQUIRE(msg.find("--restart_policy=inplace") != std::string::npos);
}

TEST_CASE("inplace block: a blob entry without '=' is an error, empty entries are skipped",
          "[unit]") {
  auto ok = ddp::detail::ParseEnvBlob("A=1\0\0B=\0", 8);
  REQUIRE(ok.ok());
  REQUIRE(ok->size() == 2);
  REQUIRE((*ok)[1].second.empty());
  REQUIRE(absl::IsInvalidArgument(ddp::detail::ParseEnvBlob("A=1\0garbage\0", 12).status()));
}

TEST_CASE("Reconfigure outside --restart_policy=inplace says how to get it", "[unit]") {
  ::unsetenv(layout::kEnvFd);
  try {
    ddp::Reconfigure(nullptr);
    FAIL("Reconfigure worked without a control block");
  } catch (const ddp::StateError& e) {
    INFO(e.what());
    REQUIRE(std::string(e.what()).find("--restart_policy=inplace") != std::string::npos);
    REQUIRE(std::string(e.what()).find("DDPRUN_INPLACE_FD is unset") != std::string::npos);
  }
}
