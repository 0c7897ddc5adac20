#include "gloo_store_adapter.h"

#include <algorithm>

#include "ddprun/rendezvous/store/store.h"
#include "gloo/common/error.h"

namespace ddp::detail {

GlooStoreAdapter::GlooStoreAdapter(std::shared_ptr<ddprun::rendezvous::Store> base,
                                   std::string prefix, Duration timeout)
    : base_(std::move(base)), prefix_(std::move(prefix)), timeout_(timeout) {}

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  Check(base_->Set(prefix_ + key, std::string(data.begin(), data.end())));
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  auto v = base_->Get(prefix_ + key, timeout_);
  Check(v.status());
  return std::vector<char>(v->begin(), v->end());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void GlooStoreAdapter::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& t) {
  std::vector<std::string> full;
  for (const auto& k : keys) full.push_back(prefix_ + k);
  Check(base_->Wait(full, std::min<Duration>(t, timeout_)));
}

void GlooStoreAdapter::Check(const absl::Status& s) {
  if (s.ok()) return;
  if (error_.ok()) error_ = s;
  throw gloo::IoException(std::string(s.message()));
}

}  // namespace ddp::detail
