// One agent's run in a simulated world (agent_fakes.h), the way the agent
// unit tests drive the real round loop: its exit code, the simulated time it
// took and what it wrote to stderr.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "agent_fakes.h"
#include "ddprun/agent/agent.h"
#include "support/capture_stderr.h"

namespace ddprun::agent::testing {

struct Result {
  int rc;
  double seconds;  // simulated
  std::string err;
};

// Runs one agent with `o` in `world` until Run() returns; `setup` may script
// the session and the queue before the agent runs.
inline Result RunAgent(SimWorld& world, AgentOptions o,
                       const std::function<void(InProcessSession&)>& setup = {}) {
  BlockAgentSignals();
  auto session = std::make_unique<InProcessSession>(o.job_id, world.clock, world.queue);
  if (setup) setup(*session);
  ::ddprun::test::CaptureStderr cap;
  const TimePoint t0 = world.clock.Now();
  int rc;
  {
    AgentDeps deps;
    deps.launcher = std::make_unique<LauncherRef>(world.launcher);
    deps.session = std::move(session);
    deps.clock = &world.clock;
    deps.events = &world.queue;
    Agent agent(std::move(o), std::move(deps));
    rc = agent.Run();
  }
  const double s = std::chrono::duration<double>(world.clock.Now() - t0).count();
  return Result{rc, s, cap.text()};
}

}  // namespace ddprun::agent::testing
