// The replica channel's encryption (--ckpt_encrypt, docs/security.md, "The
// checkpoint replica port"): the keys and the AES-256-GCM records, no
// sockets (replica_channel.h carries them).
//
// bin/ddprun links no libcrypto (docs/launch.md): LoadCipherLibrary opens
// libcrypto.so.3 with dlopen on the first encrypted replica connection, so
// only a job with --ckpt_replicas 1 and --ckpt_encrypt 1 pays for it.
//
// Keys: in the handshake (checkpoint_replica_wire.h) each end makes a fresh
// X25519 key pair (KeyExchange) and sends its public half, proved with the
// job's store token. Both ends then derive, with HKDF-SHA256 (RFC 5869)
// from the X25519 shared secret and the token, salted with the transcript
// (both nonces, both public keys), one key per direction
// (DeriveChannelKeys). No key is used on two connections or both ways, and
// none can be derived again once the handshake's private keys are gone:
// the token and a recording of the connection are not enough.
//
// A record: u32 n (little-endian, 1..kMaxRecordBytes), n bytes of
// AES-256-GCM ciphertext, its 16-byte tag. The 4 length bytes are the
// record's associated data; its 12-byte nonce is 4 zero bytes and the
// direction's record count (big-endian u64), so a record that is replayed,
// reordered, dropped or cut fails its tag. A record's plaintext is used
// only after its tag held.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ddprun/agent/checkpoint_replica_wire.h"

namespace ddprun::agent::replica {

inline constexpr std::size_t kKeyBytes = 32;
inline constexpr std::size_t kIvBytes = 12;
inline constexpr std::size_t kTagBytes = 16;
inline constexpr std::size_t kRecordHeaderBytes = 4;
// A sender's records carry at most this many bytes; a receiver refuses a
// longer one before it reads it.
inline constexpr std::uint32_t kMaxRecordBytes = 1 << 20;

// Loads libcrypto.so.3 once per process (later calls return the first
// answer). FailedPrecondition with one line naming the library, dlerror()
// and the fix when it does not load or lacks a function.
absl::Status LoadCipherLibrary();
// Test hook (docs/security.md): the file LoadCipherLibrary opens instead,
// so that a test sees the line of a node without libcrypto.
inline constexpr char kEnvTestCryptoLibrary[] = "DDPRUN_CKPT_TEST_CRYPTO_LIBRARY";

// HKDF-SHA256 (RFC 5869): `length` (at most 255 x 32) bytes from `ikm`.
std::string HkdfSha256(std::string_view ikm, std::string_view salt, std::string_view info,
                       std::size_t length);

// An X25519 key pair (RFC 7748) for one connection's handshake. The private
// half stays inside libcrypto and is freed with this object.
class KeyExchange {
 public:
  // A fresh key pair. FailedPrecondition when libcrypto does not load
  // (LoadCipherLibrary's line).
  static absl::StatusOr<std::unique_ptr<KeyExchange>> Create();
  // Test seam: the pair of a given private key (kPublicKeyBytes; RFC 7748's
  // test vectors).
  static absl::StatusOr<std::unique_ptr<KeyExchange>> FromPrivateKey(std::string_view private_key);
  ~KeyExchange();
  KeyExchange(const KeyExchange&) = delete;
  KeyExchange& operator=(const KeyExchange&) = delete;

  // kPublicKeyBytes: what this end sends.
  const std::string& public_key() const { return public_key_; }
  // The shared secret (kSharedSecretBytes) with the peer's public key.
  // InvalidArgument for a key of another size, or one that gives no secret
  // (a low-order point: the result would be all zeros).
  absl::StatusOr<std::string> SharedSecret(std::string_view peer_public) const;

 private:
  KeyExchange(void* pkey, std::string public_key)
      : pkey_(pkey), public_key_(std::move(public_key)) {}
  void* pkey_;  // EVP_PKEY
  std::string public_key_;
};
inline constexpr std::size_t kSharedSecretBytes = 32;

// Overwrites `secret`'s bytes with zeros (a shared secret or a key the
// handshake no longer needs), in a way the compiler keeps.
void Wipe(std::string* secret);

// The two keys of one connection: HKDF-SHA256 of the X25519 shared secret
// then the token, salted with the transcript (Ns, Nc, Ps, Pc), each
// direction's info naming it and the job.
struct ChannelKeys {
  std::string client_to_server;
  std::string server_to_client;
};
ChannelKeys DeriveChannelKeys(std::string_view token, std::string_view job_id,
                              std::string_view shared_secret, const Transcript& transcript);

// AES-256-GCM under one key (libcrypto's EVP interface). Not thread-safe.
class Aes256Gcm {
 public:
  // `key`: kKeyBytes. FailedPrecondition when libcrypto does not load
  // (LoadCipherLibrary), InvalidArgument for a key of another size.
  static absl::StatusOr<std::unique_ptr<Aes256Gcm>> Create(std::string_view key);
  ~Aes256Gcm();
  Aes256Gcm(const Aes256Gcm&) = delete;
  Aes256Gcm& operator=(const Aes256Gcm&) = delete;

  // Encrypts `n` bytes of `in` into `out` (which may be `in`) under `iv`
  // (kIvBytes), authenticating `aad` too; writes the tag (kTagBytes).
  absl::Status Seal(std::string_view iv, std::string_view aad, const char* in, std::size_t n,
                    char* out, char* tag);
  // Decrypts `n` bytes of `in` into `out` (which may be `in`). DataLoss when
  // `tag` does not hold: then `out` holds nothing to use.
  absl::Status Open(std::string_view iv, std::string_view aad, const char* in, std::size_t n,
                    char* out, const char* tag);

 private:
  Aes256Gcm(void* enc, void* dec) : enc_(enc), dec_(dec) {}
  // EVP_CIPHER_CTXs keyed once (the key schedule); each call sets its nonce.
  void* enc_;
  void* dec_;
};

// One direction's records (the layout above): the sender's Sealer and the
// receiver's Opener count records from 0 on their own.
class RecordSealer {
 public:
  static absl::StatusOr<std::unique_ptr<RecordSealer>> Create(std::string_view key);
  // Appends the record of `n` (1..kMaxRecordBytes) bytes of `plain` to `out`.
  absl::Status Seal(const char* plain, std::size_t n, std::string* out);
  // Writes it to `out`, which has room for kRecordHeaderBytes + n + kTagBytes.
  absl::Status Seal(const char* plain, std::size_t n, char* out);

 private:
  explicit RecordSealer(std::unique_ptr<Aes256Gcm> gcm) : gcm_(std::move(gcm)) {}
  std::unique_ptr<Aes256Gcm> gcm_;
  std::uint64_t next_ = 0;
};

class RecordOpener {
 public:
  static absl::StatusOr<std::unique_ptr<RecordOpener>> Create(std::string_view key);
  // The ciphertext's length from a record's header (kRecordHeaderBytes).
  // InvalidArgument for 0 or more than kMaxRecordBytes.
  static absl::StatusOr<std::uint32_t> Length(const char* header);
  // Decrypts the next record's `n` bytes of ciphertext in place, checking
  // its tag over its header; DataLoss when it does not hold (the record was
  // altered, replayed, reordered, or sealed under another key).
  absl::Status Open(const char* header, char* data, std::size_t n, const char* tag);

 private:
  explicit RecordOpener(std::unique_ptr<Aes256Gcm> gcm) : gcm_(std::move(gcm)) {}
  std::unique_ptr<Aes256Gcm> gcm_;
  std::uint64_t next_ = 0;
};

}  // namespace ddprun::agent::replica
