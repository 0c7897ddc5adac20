// The TCPStore's semantics, apart from sockets (as c10d's TCPStoreBackend
// query handlers): a decoded request (c10d_wire.h) served against a KvEngine,
// its reply appended to the connection's Session. The server loop
// (c10d_store_server.cc) owns the sockets and calls this; unit tests and the
// fuzz target call it directly.
//
// torch semantics kept: COMPARE_SET with an empty `expected` matches a
// missing key (or an empty value), and a missing key with a non-empty
// `expected` is left alone and `expected` returned; GET of a missing key is
// empty (clients WAIT first); APPEND is a compare-and-set loop; WAIT is parked
// on the engine and answered when every key exists (or a queue of that name
// holds an item); CANCEL_WAIT cancels every parked WAIT of the session and
// answers kWaitCanceled. Queues (QUEUE_PUSH/POP/LEN, torch 2.8+) are FIFO and
// apart from the keys: a push wakes one waiter, a pop answers the length
// before it and then the item (nothing more when the queue was empty: torch's
// client raises QueueEmptyError). LIST_KEYS lists the keys, not the queues.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "ddprun/rendezvous/store/c10d_wire.h"
#include "ddprun/rendezvous/store/kv_engine.h"

namespace ddprun::rendezvous::c10d {

// What one connection holds between requests.
struct Session {
  std::string out;  // replies appended, not yet sent (the server tracks what it sent)
  std::uint64_t next_token = 1;
  // Parked WAITs: token -> engine waiter (0 while WaitAsync has not returned).
  std::map<std::uint64_t, KvEngine::WaiterId> waits;
};

class RequestHandler {
 public:
  // Called, on whichever thread ends it, when a parked WAIT of a session ends:
  // OK once every key exists, else why (cancelled, or the engine went away).
  // The caller passes it back to OnWaitDone on the session's thread.
  using WaitDone = std::function<void(std::uint64_t token, absl::Status status)>;

  explicit RequestHandler(KvEngine* engine) : engine_(engine) {}

  // Serves one request. Non-OK when the store refuses it (an unsupported
  // query: Unimplemented; a wrong VALIDATE magic: InvalidArgument; an engine
  // limit): the server closes that connection with the message.
  absl::Status Handle(const Request& req, Session* session, const WaitDone& on_done);

  // A parked WAIT ended: appends kStopWaiting (OK), nothing if the session
  // cancelled it meanwhile, or returns why it failed.
  absl::Status OnWaitDone(Session* session, std::uint64_t token, const absl::Status& status);

  // Cancels every parked WAIT of the session (the client left, or sent
  // CANCEL_WAIT); their WaitDone callbacks run with `why`.
  void CancelWaits(Session* session, const absl::Status& why);

 private:
  KvEngine* engine_;
};

}  // namespace ddprun::rendezvous::c10d
