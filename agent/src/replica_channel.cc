#include "ddprun/agent/replica_channel.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ddprun::agent::replica {

namespace net = ::ddprun::rendezvous::net;

Channel::Channel(net::UniqueFd fd, std::string peer) : fd_(std::move(fd)), peer_(std::move(peer)) {}

absl::Status Channel::Encrypt(std::string_view send_key, std::string_view recv_key) {
  auto sealer = RecordSealer::Create(send_key);
  if (!sealer.ok()) return sealer.status();
  auto opener = RecordOpener::Create(recv_key);
  if (!opener.ok()) return opener.status();
  sealer_ = *std::move(sealer);
  opener_ = *std::move(opener);
  return absl::OkStatus();
}

absl::Status Channel::Send(std::string_view data, TimePoint deadline) {
  if (!encrypted()) return net::SendAll(fd_.get(), data, deadline);
  for (std::size_t at = 0; at < data.size();) {
    const std::size_t n = std::min<std::size_t>(kMaxRecordBytes, data.size() - at);
    // Grown to the largest record sent yet: a connection of small messages
    // (a handshake's reply, a refusal) never touches a whole record's room.
    if (out_.size() < kRecordHeaderBytes + n + kTagBytes) {
      out_.resize(kRecordHeaderBytes + n + kTagBytes);
    }
    if (absl::Status st = sealer_->Seal(data.data() + at, n, out_.data()); !st.ok()) return st;
    const std::string_view record(out_.data(), kRecordHeaderBytes + n + kTagBytes);
    if (absl::Status st = net::SendAll(fd_.get(), record, deadline); !st.ok()) return st;
    at += n;
  }
  return absl::OkStatus();
}

absl::Status Channel::Recv(char* out, std::size_t n, TimePoint deadline) {
  if (!encrypted()) return net::RecvExact(fd_.get(), out, n, deadline);
  while (n > 0) {
    if (in_pos_ < in_.size()) {
      const std::size_t k = std::min(n, in_.size() - in_pos_);
      std::memcpy(out, in_.data() + in_pos_, k);
      in_pos_ += k;
      out += k;
      n -= k;
      continue;
    }
    std::size_t got = 0;
    if (absl::Status st = NextRecord(out, n, &got, deadline); !st.ok()) return st;
    out += got;
    n -= got;
  }
  return absl::OkStatus();
}

absl::Status Channel::NextRecord(char* out, std::size_t room, std::size_t* got,
                                 TimePoint deadline) {
  char header[kRecordHeaderBytes];
  if (absl::Status st = net::RecvExact(fd_.get(), header, sizeof header, deadline); !st.ok()) {
    return st;
  }
  absl::StatusOr<std::uint32_t> len = RecordOpener::Length(header);
  if (!len.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--ckpt_encrypt: ", peer_, " sent ",
                                                   len.status().message(),
                                                   "; the connection is dropped"));
  }
  // A record that fits the caller's buffer is received and opened in place
  // (a replica's bytes cross memory once); else in in_, served from there.
  char* dst = nullptr;
  if (*len <= room) {
    dst = out;
    *got = *len;
  } else {
    in_.resize(*len);
    in_pos_ = 0;
    dst = in_.data();
    *got = 0;
  }
  char tag[kTagBytes];
  if (absl::Status st = net::RecvExact(fd_.get(), dst, *len, deadline); !st.ok()) return st;
  if (absl::Status st = net::RecvExact(fd_.get(), tag, sizeof tag, deadline); !st.ok()) return st;
  if (absl::Status st = opener_->Open(header, dst, *len, tag); !st.ok()) {
    if (dst == in_.data()) in_.clear();
    if (!absl::IsDataLoss(st)) return st;
    return absl::DataLossError(absl::StrCat(
        "--ckpt_encrypt: a record from ", peer_,
        " failed its authentication (altered on the way, or not sealed by this job's agent for "
        "this connection); the connection is dropped and none of its bytes is used"));
  }
  return absl::OkStatus();
}

}  // namespace ddprun::agent::replica
