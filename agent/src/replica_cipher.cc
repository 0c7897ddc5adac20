#include "ddprun/agent/replica_cipher.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "ddprun/rendezvous/common/sha256.h"

namespace ddprun::agent::replica {
namespace {

constexpr char kLibrary[] = "libcrypto.so.3";

// libcrypto's EVP functions this file calls, by their C signatures (OpenSSL
// 3's <openssl/evp.h>; its types are opaque here).
struct Evp {
  void* (*ctx_new)();
  void (*ctx_free)(void*);
  const void* (*aes_256_gcm)();
  int (*encrypt_init)(void*, const void*, void*, const unsigned char*, const unsigned char*);
  int (*decrypt_init)(void*, const void*, void*, const unsigned char*, const unsigned char*);
  int (*encrypt_update)(void*, unsigned char*, int*, const unsigned char*, int);
  int (*decrypt_update)(void*, unsigned char*, int*, const unsigned char*, int);
  int (*encrypt_final)(void*, unsigned char*, int*);
  int (*decrypt_final)(void*, unsigned char*, int*);
  int (*ctx_ctrl)(void*, int, int, void*);
  // X25519 (EVP_PKEY).
  void* (*pkey_ctx_new_id)(int, void*);
  void* (*pkey_ctx_new)(void*, void*);
  void (*pkey_ctx_free)(void*);
  int (*keygen_init)(void*);
  int (*keygen)(void*, void**);
  void* (*new_raw_public_key)(int, void*, const unsigned char*, std::size_t);
  void* (*new_raw_private_key)(int, void*, const unsigned char*, std::size_t);
  int (*get_raw_public_key)(const void*, unsigned char*, std::size_t*);
  int (*derive_init)(void*);
  int (*derive_set_peer)(void*, void*);
  int (*derive)(void*, unsigned char*, std::size_t*);
  void (*pkey_free)(void*);
};
constexpr int kCtrlGcmGetTag = 0x10;  // EVP_CTRL_GCM_GET_TAG
constexpr int kCtrlGcmSetTag = 0x11;  // EVP_CTRL_GCM_SET_TAG
constexpr int kPkeyX25519 = 1034;     // EVP_PKEY_X25519 (NID_X25519)

std::once_flag g_once;
Evp g_evp;
absl::Status* g_load_status = nullptr;  // set once, never freed

void Load() {
  static absl::Status status;
  g_load_status = &status;
  const std::string fix =
      "install OpenSSL 3's library (Debian and Ubuntu: libssl3) on this node, or run the job "
      "with --ckpt_encrypt 0 (the replica channel then crosses the network in plaintext)";
  const char* test_file = std::getenv(kEnvTestCryptoLibrary);
  const std::string file = test_file != nullptr ? test_file : kLibrary;
  void* lib = ::dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = ::dlerror();
    status = absl::FailedPreconditionError(
        absl::StrCat("--ckpt_encrypt: cannot load ", file, " (", why ? why : "unknown error",
                     "), which encrypts the checkpoint replicas; ", fix));
    return;
  }
  bool missing = false;
  std::string which;
  auto sym = [&](auto* fn, const char* name) {
    void* p = ::dlsym(lib, name);
    if (p == nullptr && !missing) {
      missing = true;
      which = name;
    }
    *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(p);
  };
  sym(&g_evp.ctx_new, "EVP_CIPHER_CTX_new");
  sym(&g_evp.ctx_free, "EVP_CIPHER_CTX_free");
  sym(&g_evp.aes_256_gcm, "EVP_aes_256_gcm");
  sym(&g_evp.encrypt_init, "EVP_EncryptInit_ex");
  sym(&g_evp.decrypt_init, "EVP_DecryptInit_ex");
  sym(&g_evp.encrypt_update, "EVP_EncryptUpdate");
  sym(&g_evp.decrypt_update, "EVP_DecryptUpdate");
  sym(&g_evp.encrypt_final, "EVP_EncryptFinal_ex");
  sym(&g_evp.decrypt_final, "EVP_DecryptFinal_ex");
  sym(&g_evp.ctx_ctrl, "EVP_CIPHER_CTX_ctrl");
  sym(&g_evp.pkey_ctx_new_id, "EVP_PKEY_CTX_new_id");
  sym(&g_evp.pkey_ctx_new, "EVP_PKEY_CTX_new");
  sym(&g_evp.pkey_ctx_free, "EVP_PKEY_CTX_free");
  sym(&g_evp.keygen_init, "EVP_PKEY_keygen_init");
  sym(&g_evp.keygen, "EVP_PKEY_keygen");
  sym(&g_evp.new_raw_public_key, "EVP_PKEY_new_raw_public_key");
  sym(&g_evp.new_raw_private_key, "EVP_PKEY_new_raw_private_key");
  sym(&g_evp.get_raw_public_key, "EVP_PKEY_get_raw_public_key");
  sym(&g_evp.derive_init, "EVP_PKEY_derive_init");
  sym(&g_evp.derive_set_peer, "EVP_PKEY_derive_set_peer");
  sym(&g_evp.derive, "EVP_PKEY_derive");
  sym(&g_evp.pkey_free, "EVP_PKEY_free");
  if (missing) {
    status = absl::FailedPreconditionError(
        absl::StrCat("--ckpt_encrypt: ", file, " has no ", which, " (not OpenSSL 3); ", fix));
  }
}

const unsigned char* U(const char* p) { return reinterpret_cast<const unsigned char*>(p); }
unsigned char* U(char* p) { return reinterpret_cast<unsigned char*>(p); }

// The 12-byte nonce of record `seq`: 4 zero bytes, then seq big-endian.
std::string RecordIv(std::uint64_t seq) {
  std::string iv(kIvBytes, '\0');
  for (int i = 0; i < 8; ++i) iv[4 + i] = static_cast<char>(seq >> (56 - 8 * i));
  return iv;
}

}  // namespace

absl::Status LoadCipherLibrary() {
  std::call_once(g_once, Load);
  return *g_load_status;
}

std::string HkdfSha256(std::string_view ikm, std::string_view salt, std::string_view info,
                       std::size_t length) {
  const rendezvous::Sha256Digest prk = rendezvous::HmacSha256(salt, ikm);
  const std::string_view prk_view(reinterpret_cast<const char*>(prk.data()), prk.size());
  std::string out, t;
  for (unsigned char i = 1; out.size() < length; ++i) {
    std::string msg = t + std::string(info);
    msg.push_back(static_cast<char>(i));
    const rendezvous::Sha256Digest ti = rendezvous::HmacSha256(prk_view, msg);
    t.assign(reinterpret_cast<const char*>(ti.data()), ti.size());
    out += t;
    if (i == 255) break;
  }
  out.resize(std::min(length, out.size()));
  return out;
}

ChannelKeys DeriveChannelKeys(std::string_view token, std::string_view job_id,
                              std::string_view shared_secret, const Transcript& transcript) {
  // Every part has a fixed size but the token, which comes last.
  std::string ikm = std::string(shared_secret) + std::string(token);
  const std::string salt = transcript.server_nonce + transcript.client_nonce +
                           transcript.server_public + transcript.client_public;
  auto key = [&](std::string_view direction) {
    std::string info = absl::StrCat("ddprun replica x25519 aes-256-gcm ", std::string(direction));
    info.push_back('\0');
    info += job_id;
    return HkdfSha256(ikm, salt, info, kKeyBytes);
  };
  ChannelKeys keys{key("client->server"), key("server->client")};
  Wipe(&ikm);
  return keys;
}

void Wipe(std::string* secret) {
  volatile char* p = secret->data();
  for (std::size_t i = 0; i < secret->size(); ++i) p[i] = 0;
}

// ------------------------------------------------------------------ X25519

namespace {

// The public half of `pkey` (kPublicKeyBytes), or "" when libcrypto fails.
std::string RawPublicKey(void* pkey) {
  std::string out(kPublicKeyBytes, '\0');
  std::size_t len = out.size();
  if (g_evp.get_raw_public_key(pkey, U(out.data()), &len) != 1 || len != kPublicKeyBytes) {
    return "";
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<KeyExchange>> KeyExchange::Create() {
  if (absl::Status st = LoadCipherLibrary(); !st.ok()) return st;
  void* ctx = g_evp.pkey_ctx_new_id(kPkeyX25519, nullptr);
  void* pkey = nullptr;
  const bool made = ctx != nullptr && g_evp.keygen_init(ctx) == 1 &&
                    g_evp.keygen(ctx, &pkey) == 1 && pkey != nullptr;
  if (ctx != nullptr) g_evp.pkey_ctx_free(ctx);
  if (!made) return absl::InternalError("X25519 key generation failed in libcrypto");
  std::string pub = RawPublicKey(pkey);
  auto kx = std::unique_ptr<KeyExchange>(new KeyExchange(pkey, std::move(pub)));
  if (kx->public_key_.empty()) return absl::InternalError("X25519 public key export failed");
  return kx;
}

absl::StatusOr<std::unique_ptr<KeyExchange>> KeyExchange::FromPrivateKey(
    std::string_view private_key) {
  if (absl::Status st = LoadCipherLibrary(); !st.ok()) return st;
  if (private_key.size() != kPublicKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("an X25519 private key of ", private_key.size(),
                                                   " bytes (", kPublicKeyBytes, " needed)"));
  }
  void* pkey =
      g_evp.new_raw_private_key(kPkeyX25519, nullptr, U(private_key.data()), private_key.size());
  if (pkey == nullptr) return absl::InternalError("X25519 private key import failed");
  std::string pub = RawPublicKey(pkey);
  auto kx = std::unique_ptr<KeyExchange>(new KeyExchange(pkey, std::move(pub)));
  if (kx->public_key_.empty()) return absl::InternalError("X25519 public key export failed");
  return kx;
}

KeyExchange::~KeyExchange() {
  if (pkey_ != nullptr) g_evp.pkey_free(pkey_);
}

absl::StatusOr<std::string> KeyExchange::SharedSecret(std::string_view peer_public) const {
  if (peer_public.size() != kPublicKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("an X25519 public key of ", peer_public.size(),
                                                   " bytes (", kPublicKeyBytes, " needed)"));
  }
  void* peer =
      g_evp.new_raw_public_key(kPkeyX25519, nullptr, U(peer_public.data()), peer_public.size());
  if (peer == nullptr) return absl::InvalidArgumentError("an X25519 public key libcrypto refuses");
  void* ctx = g_evp.pkey_ctx_new(pkey_, nullptr);
  std::string secret(kSharedSecretBytes, '\0');
  std::size_t len = secret.size();
  // libcrypto refuses a peer key whose secret is all zeros (RFC 7748, 6.1).
  const bool derived = ctx != nullptr && g_evp.derive_init(ctx) == 1 &&
                       g_evp.derive_set_peer(ctx, peer) == 1 &&
                       g_evp.derive(ctx, U(secret.data()), &len) == 1 && len == kSharedSecretBytes;
  if (ctx != nullptr) g_evp.pkey_ctx_free(ctx);
  g_evp.pkey_free(peer);
  if (!derived || secret == std::string(kSharedSecretBytes, '\0')) {
    return absl::InvalidArgumentError(
        "an X25519 public key that gives no shared secret (a low-order point)");
  }
  return secret;
}

// ------------------------------------------------------------------ GCM

absl::StatusOr<std::unique_ptr<Aes256Gcm>> Aes256Gcm::Create(std::string_view key) {
  if (absl::Status st = LoadCipherLibrary(); !st.ok()) return st;
  if (key.size() != kKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("an AES-256 key of ", key.size(), " bytes (", kKeyBytes, " needed)"));
  }
  void* enc = g_evp.ctx_new();
  void* dec = g_evp.ctx_new();
  auto gcm = std::unique_ptr<Aes256Gcm>(new Aes256Gcm(enc, dec));
  if (enc == nullptr || dec == nullptr ||
      g_evp.encrypt_init(enc, g_evp.aes_256_gcm(), nullptr, U(key.data()), nullptr) != 1 ||
      g_evp.decrypt_init(dec, g_evp.aes_256_gcm(), nullptr, U(key.data()), nullptr) != 1) {
    return absl::InternalError("AES-256-GCM set-up failed in libcrypto");
  }
  return gcm;
}

Aes256Gcm::~Aes256Gcm() {
  if (enc_ != nullptr) g_evp.ctx_free(enc_);
  if (dec_ != nullptr) g_evp.ctx_free(dec_);
}

absl::Status Aes256Gcm::Seal(std::string_view iv, std::string_view aad, const char* in,
                             std::size_t n, char* out, char* tag) {
  int len = 0;
  if (iv.size() != kIvBytes || n > static_cast<std::size_t>(INT32_MAX) ||
      g_evp.encrypt_init(enc_, nullptr, nullptr, nullptr, U(iv.data())) != 1 ||
      (!aad.empty() && g_evp.encrypt_update(enc_, nullptr, &len, U(aad.data()),
                                            static_cast<int>(aad.size())) != 1) ||
      (n > 0 && g_evp.encrypt_update(enc_, U(out), &len, U(in), static_cast<int>(n)) != 1) ||
      g_evp.encrypt_final(enc_, U(out) + n, &len) != 1 ||
      g_evp.ctx_ctrl(enc_, kCtrlGcmGetTag, static_cast<int>(kTagBytes), tag) != 1) {
    return absl::InternalError("AES-256-GCM encryption failed in libcrypto");
  }
  return absl::OkStatus();
}

absl::Status Aes256Gcm::Open(std::string_view iv, std::string_view aad, const char* in,
                             std::size_t n, char* out, const char* tag) {
  int len = 0;
  char tag_copy[kTagBytes];
  std::memcpy(tag_copy, tag, kTagBytes);
  if (iv.size() != kIvBytes || n > static_cast<std::size_t>(INT32_MAX) ||
      g_evp.decrypt_init(dec_, nullptr, nullptr, nullptr, U(iv.data())) != 1 ||
      (!aad.empty() && g_evp.decrypt_update(dec_, nullptr, &len, U(aad.data()),
                                            static_cast<int>(aad.size())) != 1) ||
      (n > 0 && g_evp.decrypt_update(dec_, U(out), &len, U(in), static_cast<int>(n)) != 1) ||
      g_evp.ctx_ctrl(dec_, kCtrlGcmSetTag, static_cast<int>(kTagBytes), tag_copy) != 1) {
    return absl::InternalError("AES-256-GCM decryption failed in libcrypto");
  }
  // The tag is checked here, over everything above.
  if (g_evp.decrypt_final(dec_, U(out) + n, &len) != 1) {
    return absl::DataLossError("its AES-256-GCM tag does not hold");
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------------ records

absl::StatusOr<std::unique_ptr<RecordSealer>> RecordSealer::Create(std::string_view key) {
  auto gcm = Aes256Gcm::Create(key);
  if (!gcm.ok()) return gcm.status();
  return std::unique_ptr<RecordSealer>(new RecordSealer(*std::move(gcm)));
}

absl::Status RecordSealer::Seal(const char* plain, std::size_t n, std::string* out) {
  const std::size_t at = out->size();
  out->resize(at + kRecordHeaderBytes + n + kTagBytes);
  return Seal(plain, n, out->data() + at);
}

absl::Status RecordSealer::Seal(const char* plain, std::size_t n, char* p) {
  if (n == 0 || n > kMaxRecordBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a record of ", n, " bytes"));
  }
  const auto len = static_cast<std::uint32_t>(n);
  std::memcpy(p, &len, kRecordHeaderBytes);  // little-endian hosts only (as the wire)
  return gcm_->Seal(RecordIv(next_++), std::string_view(p, kRecordHeaderBytes), plain, n,
                    p + kRecordHeaderBytes, p + kRecordHeaderBytes + n);
}

absl::StatusOr<std::unique_ptr<RecordOpener>> RecordOpener::Create(std::string_view key) {
  auto gcm = Aes256Gcm::Create(key);
  if (!gcm.ok()) return gcm.status();
  return std::unique_ptr<RecordOpener>(new RecordOpener(*std::move(gcm)));
}

absl::StatusOr<std::uint32_t> RecordOpener::Length(const char* header) {
  std::uint32_t len = 0;
  std::memcpy(&len, header, kRecordHeaderBytes);
  if (len == 0 || len > kMaxRecordBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a record of ", len, " bytes (1 to ",
                                                   kMaxRecordBytes, "): not this channel's"));
  }
  return len;
}

absl::Status RecordOpener::Open(const char* header, char* data, std::size_t n, const char* tag) {
  return gcm_->Open(RecordIv(next_++), std::string_view(header, kRecordHeaderBytes), data, n, data,
                    tag);
}

}  // namespace ddprun::agent::replica
