// The replica protocol between agents (--ckpt_replicas, docs/checkpoint.md,
// "Peer replicas"): the bytes only, no sockets, so that every check on what
// a peer sends is unit-tested (checkpoint_replicas.h is the transport).
//
// Every connection opens with a handshake in which each side proves that it
// knows the job's secret (the job's store token: 128 random bits the
// rendezvous gives every agent of the job) without sending it
// (docs/security.md):
//
//   server   "DDPRAUTH", nonce Ns (16 random bytes)            on accept
//   client   "DDPREPL3", nonce Nc, Proof("client", ...)        32 bytes
//   server   a reply: refused (one line), or ok and Proof("server", ...)
//
// Proof(role) is HMAC-SHA256(token, "ddprun replica " role, job id, Ns,
// Nc). The client sends its request only once the server's proof holds, so
// a stranger's server learns nothing and gets no snapshot; a stranger's
// client is refused before it can push or read a replica.
//
// With --ckpt_encrypt 1 (the job's) the magics are "DDPRAUTX" and
// "DDPREPLX", each proof also covers "aes-256-gcm", and each end adds a
// fresh X25519 public key (RFC 7748; its private half lives only as long as
// the connection's handshake):
//
//   server   "DDPRAUTX", Ns, Ps (32 bytes)
//   client   "DDPREPLX", Nc, Proof("client", ...), Pc (32 bytes),
//            KeyProof("client", ...)
//   server   a reply: refused, or ok, Proof("server", ...),
//            KeyProof("server", ...)
//
// KeyProof(role) is HMAC-SHA256(token, "ddprun replica x25519 " role, job
// id, Ns, Nc, Ps, Pc): each end checks that the public keys it sent and
// received are the ones the other end proved with the job's secret, so
// someone on the path without the token cannot substitute their own (the
// server refuses, naming the alteration: KeyExchangeAltered). Once both
// hold, every byte both ways is in AES-256-GCM records under keys derived
// from the X25519 shared secret, the token and the whole transcript
// (replica_cipher.h, replica_channel.h): whoever records the connection and
// later learns the token still lacks the shared secret (forward secrecy).
// An end that encrypts refuses one that does not, and the other way round,
// with a line naming both settings; a client names a server of the ddprun
// before this exchange ("DDPRAUTE": encrypted without it) as older.
//
// A request is then a 16-byte prefix, a header, then (kPut) the data:
//
//   prefix   magic "DDPREPL3", u32 op (1 put, 2 get), u32 header length
//   header   u32 n + job id, i64 round,
//            i32 base rank, i32 local ranks, i32 world size, i64 step
//            (kGet: the step asked for, or kNewestStep),
//            local ranks x (u64 size, u32 checksum, u32 its kind)
//   data     the snapshots of the local ranks, back to back (kPut only)
//
// A reply is u32 status (0 ok, 1 refused), u32 n + a message (one line);
// an ok reply to a kGet is followed by a kPut request's prefix, header and
// data: the replica. Every integer is little-endian. Every message is fenced
// by the job id and the round.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace ddprun::agent::replica {

inline constexpr char kMagic[8] = {'D', 'D', 'P', 'R', 'E', 'P', 'L', '3'};
inline constexpr char kChallengeMagic[8] = {'D', 'D', 'P', 'R', 'A', 'U', 'T', 'H'};
// The magics of an end that encrypts (--ckpt_encrypt 1), with the X25519
// exchange.
inline constexpr char kChallengeMagicEncrypted[8] = {'D', 'D', 'P', 'R', 'A', 'U', 'T', 'X'};
inline constexpr char kHelloMagicEncrypted[8] = {'D', 'D', 'P', 'R', 'E', 'P', 'L', 'X'};
// The challenge of an encrypting server of the ddprun before it (keys from
// the token alone): recognised only to name it.
inline constexpr char kChallengeMagicEncryptedOlder[8] = {'D', 'D', 'P', 'R', 'A', 'U', 'T', 'E'};
inline constexpr std::size_t kNonceBytes = 16;
inline constexpr std::size_t kProofBytes = 32;
inline constexpr std::size_t kChallengeBytes = 8 + kNonceBytes;
inline constexpr std::size_t kHelloBytes = 8 + kNonceBytes + kProofBytes;
// An X25519 public key; what an encrypting end sends after its challenge
// (Ps) or its hello (Pc, then its KeyProof).
inline constexpr std::size_t kPublicKeyBytes = 32;
inline constexpr std::size_t kChallengeKeyBytes = kPublicKeyBytes;
inline constexpr std::size_t kHelloKeyBytes = kPublicKeyBytes + kProofBytes;
inline constexpr std::size_t kPrefixBytes = 16;
// Bounds on what a peer may claim before anything is allocated.
inline constexpr std::uint32_t kMaxHeaderBytes = 64 * 1024;
inline constexpr std::uint32_t kMaxIdBytes = 1024;
inline constexpr int kMaxLocalRanks = 1024;

enum class Op : std::uint32_t { kPut = 1, kGet = 2 };
// A kGet's step for the seat's newest replica (a holder keeps the newest two).
inline constexpr std::int64_t kNewestStep = -1;

// The ranks of one node's snapshot: RANK base_rank .. base_rank +
// local_ranks - 1 of a job of world_size ranks. A replica is held per seat.
struct Seat {
  int base_rank = 0;
  int local_ranks = 0;
  int world_size = 0;
  friend bool operator==(const Seat&, const Seat&) = default;
  friend auto operator<=>(const Seat&, const Seat&) = default;
};

struct Header {
  Op op = Op::kPut;
  std::string job_id;
  // The job's store token: the key the connection's handshake proves
  // (Proof); never on the wire, so "" after ParseHeader.
  std::string token;
  std::int64_t round = 0;
  Seat seat;
  std::int64_t step = 0;  // kPut: the snapshots' step; kGet: the step asked for, or kNewestStep
  std::vector<std::uint64_t> sizes;  // kPut: one per local rank
  std::vector<std::uint32_t> crcs;   // kPut: the checksum of each, as its commit record says
  std::vector<std::uint32_t> kinds;  // kPut: its kind (checkpoint_layout::ChecksumKind)
  std::uint64_t data_bytes() const;
};

// The handshake (above). A nonce: kNonceBytes from the kernel's random source.
std::string NewNonce();
// The server's first bytes (when `encrypt`, followed by `server_public`),
// and back from the first kChallengeBytes its nonce and whether it encrypts
// (then kChallengeKeyBytes of its public key follow). InvalidArgument: not
// a replica server, or an encrypting one of an older ddprun (named so).
std::string EncodeChallenge(std::string_view server_nonce, bool encrypt,
                            std::string_view server_public = {});
absl::StatusOr<std::string> ParseChallenge(std::string_view bytes, bool* encrypt);
// What `role` ("client" or "server") proves: HMAC-SHA256 under the token
// (covering "aes-256-gcm" too when the connection is to be encrypted).
std::string Proof(std::string_view role, std::string_view token, std::string_view job_id,
                  std::string_view server_nonce, std::string_view client_nonce, bool encrypt);
// The client's answer to a challenge, and its nonce, proof and whether it
// encrypts back from kHelloBytes (InvalidArgument: not a replica client,
// e.g. an older ddprun). An encrypting client then sends kHelloKeyBytes: its
// public key and its KeyProof.
std::string EncodeHello(std::string_view client_nonce, std::string_view proof, bool encrypt);
absl::Status ParseHello(std::string_view bytes, std::string* client_nonce, std::string* proof,
                        bool* encrypt);
// What an encrypted connection's handshake exchanged in the clear: the
// input of KeyProof and of the channel's keys (replica::DeriveChannelKeys).
struct Transcript {
  std::string server_nonce;
  std::string client_nonce;
  std::string server_public;  // X25519, kPublicKeyBytes
  std::string client_public;
};
// What `role` proves over an encrypted connection's public keys:
// HMAC-SHA256 under the token over the whole transcript.
std::string KeyProof(std::string_view role, std::string_view token, std::string_view job_id,
                     const Transcript& t);
// The line of an end whose KeyProof check failed: the keys of the exchange
// between `client` and `server` were altered on the way.
std::string KeyExchangeAltered(std::string_view client, std::string_view server);
// The line about two ends of which one does not encrypt and the other
// does (each named by its address), whichever end says it.
std::string EncryptionMismatch(std::string_view plain_end, std::string_view encrypting_end);
// Whether `got` is the proof `want`, in constant time.
bool ProofHolds(std::string_view want, std::string_view got);

// The prefix and header of a request (the data follows it on the wire).
std::string EncodeRequest(const Header& h);
// The op and header length from a prefix of kPrefixBytes. InvalidArgument
// naming what is wrong (not a replica request, an unknown op, a header
// longer than kMaxHeaderBytes).
absl::StatusOr<std::uint32_t> ParsePrefix(std::string_view prefix, Op* op);
// The header after the prefix. InvalidArgument when it does not parse or
// claims more than the bounds; ResourceExhausted when one snapshot is larger
// than `limit_bytes` (the receiver's --ckpt_shm_limit), naming both.
absl::StatusOr<Header> ParseHeader(Op op, std::string_view body, std::uint64_t limit_bytes);

// The first part of a reply (a refusal's message: one line).
std::string EncodeReply(bool ok, std::string_view message);
inline constexpr std::size_t kReplyFixedBytes = 8;
// The status and the message length from the first kReplyFixedBytes.
absl::StatusOr<std::uint32_t> ParseReplyFixed(std::string_view fixed, bool* ok);

}  // namespace ddprun::agent::replica
