#include "ddprun/agent/checkpoint_replica_wire.h"

#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "ddprun/rendezvous/common/checkpoint_layout.h"
#include "ddprun/rendezvous/common/sha256.h"

namespace ddprun::agent::replica {
namespace {

template <typename T>
void Put(std::string* out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian hosts only (as the checkpoint layout)
  out->append(b, sizeof(T));
}

void PutString(std::string* out, std::string_view s) {
  Put<std::uint32_t>(out, static_cast<std::uint32_t>(s.size()));
  out->append(s);
}

// Reads from a bounded view; any read past its end fails the whole parse.
class Reader {
 public:
  explicit Reader(std::string_view s) : s_(s) {}
  template <typename T>
  bool Get(T* v) {
    if (s_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(v, s_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool GetString(std::string* v, std::uint32_t max) {
    std::uint32_t n = 0;
    if (!Get(&n) || n > max || s_.size() - pos_ < n) return false;
    v->assign(s_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool done() const { return pos_ == s_.size(); }

 private:
  std::string_view s_;
  std::size_t pos_ = 0;
};

std::string ReadableBytes(std::uint64_t n) {
  if (n >= (1ull << 30)) return absl::StrCat(n / double(1ull << 30), " GiB");
  if (n >= (1ull << 20)) return absl::StrCat(n / double(1ull << 20), " MiB");
  return absl::StrCat(n, " bytes");
}

}  // namespace

std::uint64_t Header::data_bytes() const {
  std::uint64_t total = 0;
  for (std::uint64_t s : sizes) total += s;
  return total;
}

std::string NewNonce() {
  std::random_device rd;  // the kernel's random source (as the job's store token)
  std::string n(kNonceBytes, '\0');
  for (std::size_t i = 0; i < n.size(); i += 4) {
    const std::uint32_t v = rd();
    std::memcpy(n.data() + i, &v, 4);
  }
  return n;
}

std::string EncodeChallenge(std::string_view server_nonce, bool encrypt,
                            std::string_view server_public) {
  std::string out = std::string(encrypt ? kChallengeMagicEncrypted : kChallengeMagic, 8) +
                    std::string(server_nonce);
  if (encrypt) out += server_public;
  return out;
}

absl::StatusOr<std::string> ParseChallenge(std::string_view bytes, bool* encrypt) {
  if (bytes.size() != kChallengeBytes) {
    return absl::InvalidArgumentError("not a ddprun replica server (no challenge)");
  }
  if (std::memcmp(bytes.data(), kChallengeMagic, 8) == 0) {
    *encrypt = false;
  } else if (std::memcmp(bytes.data(), kChallengeMagicEncrypted, 8) == 0) {
    *encrypt = true;
  } else if (std::memcmp(bytes.data(), kChallengeMagicEncryptedOlder, 8) == 0) {
    return absl::InvalidArgumentError(
        "an older ddprun's replica server (it encrypts without the X25519 exchange); run the "
        "same ddprun on every node");
  } else {
    return absl::InvalidArgumentError("not a ddprun replica server (no challenge)");
  }
  return std::string(bytes.substr(sizeof kChallengeMagic));
}

std::string Proof(std::string_view role, std::string_view token, std::string_view job_id,
                  std::string_view server_nonce, std::string_view client_nonce, bool encrypt) {
  std::string msg = "ddprun replica " + std::string(role);
  msg.push_back('\0');
  PutString(&msg, job_id);
  PutString(&msg, server_nonce);
  PutString(&msg, client_nonce);
  if (encrypt) PutString(&msg, "aes-256-gcm");
  const rendezvous::Sha256Digest mac = rendezvous::HmacSha256(token, msg);
  return std::string(reinterpret_cast<const char*>(mac.data()), mac.size());
}

std::string KeyProof(std::string_view role, std::string_view token, std::string_view job_id,
                     const Transcript& t) {
  std::string msg = "ddprun replica x25519 " + std::string(role);
  msg.push_back('\0');
  PutString(&msg, job_id);
  PutString(&msg, t.server_nonce);
  PutString(&msg, t.client_nonce);
  PutString(&msg, t.server_public);
  PutString(&msg, t.client_public);
  const rendezvous::Sha256Digest mac = rendezvous::HmacSha256(token, msg);
  return std::string(reinterpret_cast<const char*>(mac.data()), mac.size());
}

std::string KeyExchangeAltered(std::string_view client, std::string_view server) {
  return absl::StrCat(
      "the X25519 key exchange between ", std::string(client), " and ", std::string(server),
      " was altered on the way (the public keys that arrived are not the ones the job's secret "
      "proved: someone on the path changed them); the connection is refused and no request or "
      "snapshot crossed it");
}

std::string EncodeHello(std::string_view client_nonce, std::string_view proof, bool encrypt) {
  return std::string(encrypt ? kHelloMagicEncrypted : kMagic, 8) + std::string(client_nonce) +
         std::string(proof);
}

absl::Status ParseHello(std::string_view bytes, std::string* client_nonce, std::string* proof,
                        bool* encrypt) {
  const bool plain = bytes.size() == kHelloBytes && std::memcmp(bytes.data(), kMagic, 8) == 0;
  const bool sealed =
      bytes.size() == kHelloBytes && std::memcmp(bytes.data(), kHelloMagicEncrypted, 8) == 0;
  if (!plain && !sealed) {
    return absl::InvalidArgumentError("not a ddprun replica client of this version (bad magic)");
  }
  *encrypt = sealed;
  *client_nonce = std::string(bytes.substr(sizeof kMagic, kNonceBytes));
  *proof = std::string(bytes.substr(sizeof kMagic + kNonceBytes));
  return absl::OkStatus();
}

std::string EncryptionMismatch(std::string_view plain_end, std::string_view encrypting_end) {
  return absl::StrCat(std::string(plain_end), " does not encrypt the replica channel and ",
                      std::string(encrypting_end),
                      " does (--ckpt_encrypt 1); run the same ddprun on every node (an older one "
                      "does not encrypt), or start the job with --ckpt_encrypt 0");
}

bool ProofHolds(std::string_view want, std::string_view got) {
  return rendezvous::DigestsEqual(want, got);
}

std::string EncodeRequest(const Header& h) {
  std::string body;
  PutString(&body, h.job_id);
  Put<std::int64_t>(&body, h.round);
  Put<std::int32_t>(&body, h.seat.base_rank);
  Put<std::int32_t>(&body, h.seat.local_ranks);
  Put<std::int32_t>(&body, h.seat.world_size);
  Put<std::int64_t>(&body, h.step);
  if (h.op == Op::kPut) {
    for (std::size_t j = 0; j < h.sizes.size(); ++j) {
      Put<std::uint64_t>(&body, h.sizes[j]);
      Put<std::uint32_t>(&body, j < h.crcs.size() ? h.crcs[j] : 0);
      Put<std::uint32_t>(&body, j < h.kinds.size() ? h.kinds[j] : 0);
    }
  }
  std::string out(kMagic, sizeof kMagic);
  Put<std::uint32_t>(&out, static_cast<std::uint32_t>(h.op));
  Put<std::uint32_t>(&out, static_cast<std::uint32_t>(body.size()));
  return out + body;
}

absl::StatusOr<std::uint32_t> ParsePrefix(std::string_view prefix, Op* op) {
  if (prefix.size() != kPrefixBytes || std::memcmp(prefix.data(), kMagic, sizeof kMagic) != 0) {
    return absl::InvalidArgumentError("not a ddprun replica request (bad magic)");
  }
  std::uint32_t raw = 0, len = 0;
  std::memcpy(&raw, prefix.data() + 8, 4);
  std::memcpy(&len, prefix.data() + 12, 4);
  if (raw != static_cast<std::uint32_t>(Op::kPut) && raw != static_cast<std::uint32_t>(Op::kGet)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown replica op ", raw));
  }
  if (len > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a replica header of ", len, " bytes (at most ", kMaxHeaderBytes, ")"));
  }
  *op = static_cast<Op>(raw);
  return len;
}

absl::StatusOr<Header> ParseHeader(Op op, std::string_view body, std::uint64_t limit_bytes) {
  Header h;
  h.op = op;
  Reader r(body);
  std::int32_t base = 0, local = 0, world = 0;
  if (!r.GetString(&h.job_id, kMaxIdBytes) || !r.Get(&h.round) || !r.Get(&base) || !r.Get(&local) ||
      !r.Get(&world) || !r.Get(&h.step)) {
    return absl::InvalidArgumentError("a replica header that does not parse");
  }
  if (local < 1 || local > kMaxLocalRanks || base < 0 || world < 1 ||
      static_cast<std::int64_t>(base) + local > world) {
    return absl::InvalidArgumentError(absl::StrCat("a replica header with ranks ", base, "+", local,
                                                   " of ", world, " (not a seat)"));
  }
  h.seat = Seat{base, local, world};
  if (op == Op::kPut) {
    for (int j = 0; j < local; ++j) {
      std::uint64_t size = 0;
      std::uint32_t crc = 0, kind = 0;
      if (!r.Get(&size) || !r.Get(&crc) || !r.Get(&kind)) {
        return absl::InvalidArgumentError("a replica header that does not parse");
      }
      if (kind != checkpoint_layout::kChecksumCrc32 && kind != checkpoint_layout::kChecksumCrc32c) {
        return absl::InvalidArgumentError(
            absl::StrCat("a replica header with an unknown checksum kind ", kind));
      }
      if (size > limit_bytes) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "the replica of step ", h.step, " of rank ", base + j, " needs ", ReadableBytes(size),
            " (", size, " bytes), more than this node's --ckpt_shm_limit (", limit_bytes,
            " bytes per worker); raise --ckpt_shm_limit on this node"));
      }
      h.sizes.push_back(size);
      h.crcs.push_back(crc);
      h.kinds.push_back(kind);
    }
  }
  if (!r.done()) return absl::InvalidArgumentError("a replica header with trailing bytes");
  return h;
}

std::string EncodeReply(bool ok, std::string_view message) {
  std::string out;
  Put<std::uint32_t>(&out, ok ? 0 : 1);
  PutString(&out, message.substr(0, kMaxHeaderBytes));
  return out;
}

absl::StatusOr<std::uint32_t> ParseReplyFixed(std::string_view fixed, bool* ok) {
  std::uint32_t status = 0, len = 0;
  if (fixed.size() != kReplyFixedBytes) return absl::InvalidArgumentError("a short reply");
  std::memcpy(&status, fixed.data(), 4);
  std::memcpy(&len, fixed.data() + 4, 4);
  if (status > 1 || len > kMaxHeaderBytes) {
    return absl::InvalidArgumentError("not a ddprun replica reply");
  }
  *ok = status == 0;
  return len;
}

}  // namespace ddprun::agent::replica
