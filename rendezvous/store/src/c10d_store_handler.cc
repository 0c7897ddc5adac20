#include "ddprun/rendezvous/store/c10d_store_handler.h"

#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ddprun/rendezvous/common/clock.h"
#include "ddprun/rendezvous/common/status_macros.h"

namespace ddprun::rendezvous::c10d {
namespace {

std::string Str(std::string_view v) { return std::string(v); }

std::vector<std::string> Strings(const std::vector<std::string_view>& views) {
  return std::vector<std::string>(views.begin(), views.end());
}

}  // namespace

absl::Status RequestHandler::Handle(const Request& req, Session* session, const WaitDone& on_done) {
  std::string* out = &session->out;
  switch (req.op) {
    case Op::kValidate:
      if (req.u32 != kValidationMagic) {
        return absl::InvalidArgumentError("VALIDATE sent a wrong magic number");
      }
      return absl::OkStatus();
    case Op::kPing:
      AppendU32(out, req.u32);
      return absl::OkStatus();
    case Op::kSet:
      return engine_->Set(Str(req.keys[0]), Str(req.values[0]));
    case Op::kCompareSet: {
      const std::string key = Str(req.keys[0]);
      const std::string_view expected = req.values[0];
      std::optional<std::string> want;
      if (!expected.empty()) want = Str(expected);
      absl::StatusOr<CompareSetResult> r = engine_->CompareSet(key, want, Str(req.values[1]));
      if (r.ok() && !r->swapped && r->exists && expected.empty() && r->current.empty()) {
        r = engine_->CompareSet(key, std::string(), Str(req.values[1]));
      }
      if (!r.ok()) return r.status();
      AppendString(out, r->exists ? std::string_view(r->current) : expected);
      return absl::OkStatus();
    }
    case Op::kGet: {
      std::optional<std::string> v = engine_->Get(Str(req.keys[0]));
      AppendString(out, v ? *v : std::string());
      return absl::OkStatus();
    }
    case Op::kAdd: {
      absl::StatusOr<std::int64_t> r = engine_->Add(Str(req.keys[0]), req.delta);
      if (!r.ok()) return r.status();
      AppendI64(out, *r);
      return absl::OkStatus();
    }
    case Op::kCheck:
      AppendU8(out, engine_->Check(Strings(req.keys)) ? kCheckReady : kCheckNotReady);
      return absl::OkStatus();
    case Op::kWait: {
      std::vector<std::string> keys = Strings(req.keys);
      if (engine_->Check(keys)) {
        AppendU8(out, kStopWaiting);
        return absl::OkStatus();
      }
      const std::uint64_t token = session->next_token++;
      session->waits[token] = 0;
      const KvEngine::WaiterId id =
          engine_->WaitAsync(std::move(keys), TimePoint::max(),
                             [on_done, token](absl::Status status) { on_done(token, status); });
      // The keys may have appeared meanwhile: then the callback already ran.
      auto it = session->waits.find(token);
      if (it != session->waits.end()) it->second = id;
      return absl::OkStatus();
    }
    case Op::kGetNumKeys:
      AppendI64(out, static_cast<std::int64_t>(engine_->NumKeys()));
      return absl::OkStatus();
    case Op::kDeleteKey:
      AppendI64(out, engine_->Delete(Str(req.keys[0])) ? 1 : 0);
      return absl::OkStatus();
    case Op::kAppend: {
      const std::string key = Str(req.keys[0]);
      // Compare-and-set until no other writer interleaves.
      for (int attempt = 0; attempt <= 1000; ++attempt) {
        std::optional<std::string> cur = engine_->Get(key);
        std::string next = cur ? *cur : std::string();
        next.append(req.values[0]);
        absl::StatusOr<CompareSetResult> r = engine_->CompareSet(key, cur, std::move(next));
        if (!r.ok()) return r.status();
        if (r->swapped) return absl::OkStatus();
      }
      return absl::AbortedError("APPEND kept racing with other writers");
    }
    case Op::kMultiGet:
      for (std::string_view key : req.keys) {
        std::optional<std::string> v = engine_->Get(Str(key));
        AppendString(out, v ? *v : std::string());
      }
      return absl::OkStatus();
    case Op::kMultiSet:
      for (std::size_t i = 0; i < req.keys.size(); ++i) {
        DDPRUN_RETURN_IF_ERROR(engine_->Set(Str(req.keys[i]), Str(req.values[i])));
      }
      return absl::OkStatus();
    case Op::kCancelWait:
      CancelWaits(session, absl::CancelledError("cancelled by the client"));
      AppendU8(out, kWaitCanceled);
      return absl::OkStatus();
    case Op::kWatchKey:
      return absl::UnimplementedError(
          "WATCH_KEY (TCPStore.watch_key of torch 1.x) is not supported by ddprun's store");
    case Op::kQueuePush:
      return engine_->QueuePush(Str(req.keys[0]), Str(req.values[0]));
    case Op::kQueuePop: {
      QueuePopResult r = engine_->QueuePop(Str(req.keys[0]));
      AppendI64(out, r.length);
      if (r.value) AppendString(out, *r.value);
      return absl::OkStatus();
    }
    case Op::kQueueLen:
      AppendI64(out, engine_->QueueLength(Str(req.keys[0])));
      return absl::OkStatus();
    case Op::kListKeys: {
      std::vector<std::string> keys = engine_->ListKeys();
      AppendI64(out, static_cast<std::int64_t>(keys.size()));
      for (const std::string& key : keys) AppendString(out, key);
      return absl::OkStatus();
    }
    case Op::kUnknown:
      break;
  }
  return absl::UnimplementedError("unknown query type");
}

absl::Status RequestHandler::OnWaitDone(Session* session, std::uint64_t token,
                                        const absl::Status& status) {
  if (session->waits.erase(token) == 0) return absl::OkStatus();  // cancelled meanwhile
  if (!status.ok()) {
    return absl::Status(status.code(),
                        absl::StrCat("a WAIT ended with an error: ", status.message()));
  }
  AppendU8(&session->out, kStopWaiting);
  return absl::OkStatus();
}

void RequestHandler::CancelWaits(Session* session, const absl::Status& why) {
  std::map<std::uint64_t, KvEngine::WaiterId> waits;
  waits.swap(session->waits);
  for (auto& [token, waiter] : waits) {
    if (waiter != 0) engine_->Cancel(waiter, why);
  }
}

}  // namespace ddprun::rendezvous::c10d
