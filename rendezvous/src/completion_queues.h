// The plumbing of gRPC's async API for the server's long-lived Join streams:
// a tag is an object whose OnComplete runs when its operation completes, and
// each completion queue is drained by one thread of its own.
//
// Why not the callback API: Debian's libgrpc is built without NDEBUG, so
// every queue records each outstanding operation's tag in one array and every
// completion searches that array linearly under the queue's lock
// (grpc_cq_begin_op / cq_check_tag). The callback API runs every call of a
// server on one queue, so with N open streams each completion cost O(N) and a
// round of N agents O(N^2) (perf: 21 % of all samples at 16k agents). Streams
// spread over K queues cost O(N/K) each.
#pragma once

#include <grpcpp/completion_queue.h>

namespace ddprun::rendezvous {

// What a completed operation does; `ok` is gRPC's success bit for it.
class QueueTag {
 public:
  virtual void OnComplete(bool ok) = 0;

 protected:
  ~QueueTag() = default;
};

// A tag that calls (object->*Fn)(ok); a member of the object it serves.
template <class T, void (T::*Fn)(bool)>
class MemberTag final : public QueueTag {
 public:
  explicit MemberTag(T* object) : object_(object) {}
  void OnComplete(bool ok) override { (object_->*Fn)(ok); }

 private:
  T* object_;
};

// Dispatches every event of `cq` to its QueueTag until the queue is shut down
// and drained. Every tag put on the queue must be a QueueTag.
inline void DrainQueue(grpc::CompletionQueue* cq) {
  void* tag = nullptr;
  bool ok = false;
  while (cq->Next(&tag, &ok)) static_cast<QueueTag*>(tag)->OnComplete(ok);
}

}  // namespace ddprun::rendezvous
