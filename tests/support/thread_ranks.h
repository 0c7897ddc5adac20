// W ranks of one ddp group as W threads of this process, bootstrapped through
// one InMemoryStore with ConnectBackend (worker_sdk/src/group_factory.h), the
// way gloo's tests run ranks as threads over a HashStore. No ddprun, no
// environment, no other process:
//   options.shared_memory = true   every rank is on this host, so the group
//                                  takes the shared memory path (memfd): no
//                                  socket; the unit tier uses it.
//   options.shared_memory = false  Gloo's TCP transport over loopback: the
//                                  integration tier (tests/integration/worker_sdk).
//
// Catch2's assertions are not thread-safe: the function a rank runs returns
// what it observed, and the test checks the results on the main thread.
#pragma once

#include <csignal>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ddp/ddp.h"
#include "ddprun/rendezvous/store/store.h"
#include "group_factory.h"
#include "status.h"

namespace ddprun::test {

class ThreadRanks {
 public:
  // Connects `world` ranks, each on its own thread (the bootstrap is
  // collective). Throws the first rank's ddp::Error when one fails.
  ThreadRanks(int world, ddp::InitOptions options)
      : store_(std::make_shared<ddprun::rendezvous::InMemoryStore>()), groups_(world) {
    options.backend = ddp::Backend::kGloo;
    // A worker's ddp::Init ignores SIGPIPE (process_group.cc,
    // IgnoreSigpipeIfDefault) before Gloo writes to a socket a dead peer
    // closed; ConnectBackend does not, so the harness does it for the test
    // process: otherwise a survivor's write to a rank that left kills it.
    ::signal(SIGPIPE, SIG_IGN);
    Each([&](int r) {
      auto backend = ddp::detail::ValueOrThrow(ddp::detail::ConnectBackend(
          ddp::detail::LocalWorkerInfo(r, world), options, store_, "ddp/pg0/"));
      auto group = std::make_shared<ddp::ProcessGroup>(std::move(backend));
      std::lock_guard<std::mutex> lock(mu_);
      groups_[r] = std::move(group);
    });
  }

  int size() const { return static_cast<int>(groups_.size()); }
  const std::shared_ptr<ddp::ProcessGroup>& group(int rank) const { return groups_[rank]; }
  ddprun::rendezvous::Store& store() { return *store_; }
  // Drops this harness's reference to rank's group: a rank that leaves (its
  // connections close, as a dead process's do). Thread-safe.
  void Drop(int rank) {
    std::lock_guard<std::mutex> lock(mu_);
    groups_[rank].reset();
  }

  // Runs fn(rank) on one thread per rank and returns what each returned
  // (T default-constructible). When a rank throws, every group is aborted (so
  // that its peers stop waiting) and the first exception is rethrown here.
  template <class Fn>
  auto Run(Fn fn) -> std::vector<decltype(fn(0))> {
    std::vector<decltype(fn(0))> out(groups_.size());
    Each([&](int r) { out[r] = fn(r); });
    return out;
  }

  // Run for functions that return nothing.
  template <class Fn>
  void Each(Fn fn) {
    std::vector<std::exception_ptr> errors(groups_.size());
    std::vector<std::thread> threads;
    for (int r = 0; r < size(); ++r) {
      threads.emplace_back([&, r] {
        try {
          fn(r);
        } catch (...) {
          errors[r] = std::current_exception();
          AbortAll("rank " + std::to_string(r) + " of the test threw");
        }
      });
    }
    for (auto& t : threads) t.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
  }

 private:
  void AbortAll(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& g : groups_)
      if (g) g->Abort(why);
  }

  std::shared_ptr<ddprun::rendezvous::InMemoryStore> store_;
  std::vector<std::shared_ptr<ddp::ProcessGroup>> groups_;
  std::mutex mu_;
};

}  // namespace ddprun::test
