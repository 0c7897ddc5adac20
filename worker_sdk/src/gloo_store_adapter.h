// gloo::rendezvous::Store over our Store, for bootstrapping Gloo's pairs
// through the rendezvous (or any Store: an InMemoryStore in tests).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ddp/types.h"
#include "gloo/rendezvous/store.h"

namespace ddprun::rendezvous {
class Store;
}

namespace ddp::detail {

// Every key is prefixed with `prefix` (the group's key space in the round).
// Gloo expects exceptions: a failed call throws gloo::IoException, and the
// first failure's Status is kept for the bootstrap to report (error()).
// Waits last at most `timeout`, even when Gloo asks for longer.
class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(std::shared_ptr<ddprun::rendezvous::Store> base, std::string prefix,
                   Duration timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& t) override;

  // Ok until a call failed; then the first failure.
  const absl::Status& error() const { return error_; }

 private:
  void Check(const absl::Status& s);

  std::shared_ptr<ddprun::rendezvous::Store> base_;
  std::string prefix_;
  Duration timeout_;
  absl::Status error_;
};

}  // namespace ddp::detail
