// One replica connection's bytes (checkpoint_replicas.cc): the socket, in
// plaintext for the handshake (checkpoint_replica_wire.h), then, once both
// ends agreed to encrypt, in AES-256-GCM records both ways (replica_cipher.h).
// A record whose tag does not hold ends the connection with one line naming
// the peer; none of its bytes is used.
//
// Not thread-safe: one connection, one thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "ddprun/agent/replica_cipher.h"
#include "ddprun/rendezvous/common/socket_util.h"

namespace ddprun::agent::replica {

class Channel {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  // `peer` names the other end in errors ("127.0.0.1:4711").
  Channel(rendezvous::net::UniqueFd fd, std::string peer);
  int fd() const { return fd_.get(); }
  bool encrypted() const { return sealer_ != nullptr; }

  // From now on every byte both ways is in records: sent under `send_key`,
  // received under `recv_key` (replica::DeriveChannelKeys). An error (no
  // libcrypto: LoadCipherLibrary's line) leaves the channel unusable.
  absl::Status Encrypt(std::string_view send_key, std::string_view recv_key);

  // Sends all of `data` (as records when encrypted) by `deadline`.
  absl::Status Send(std::string_view data, TimePoint deadline);
  // Receives exactly `n` bytes into `out` by `deadline`. Encrypted: DataLoss
  // naming the peer when a record's tag does not hold; InvalidArgument when
  // a record claims a length this channel never sends. `out` may have been
  // written even then, but holds nothing to use.
  absl::Status Recv(char* out, std::size_t n, TimePoint deadline);

 private:
  // Receives and opens the next record: into `out` when it holds exactly
  // `room` bytes or fewer (then *got is its length), else into in_.
  absl::Status NextRecord(char* out, std::size_t room, std::size_t* got, TimePoint deadline);

  rendezvous::net::UniqueFd fd_;
  std::string peer_;
  std::unique_ptr<RecordSealer> sealer_;
  std::unique_ptr<RecordOpener> opener_;
  std::string out_;  // one sealed record on its way
  std::string in_;   // an opened record's plaintext, read from in_pos_
  std::size_t in_pos_ = 0;
};

}  // namespace ddprun::agent::replica
