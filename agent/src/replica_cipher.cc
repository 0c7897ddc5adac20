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
};
constexpr int kCtrlGcmGetTag = 0x10;  // EVP_CTRL_GCM_GET_TAG
constexpr int kCtrlGcmSetTag = 0x11;  // EVP_CTRL_GCM_SET_TAG

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
                              std::string_view server_nonce, std::string_view client_nonce) {
  const std::string salt = std::string(server_nonce) + std::string(client_nonce);
  auto key = [&](std::string_view direction) {
    std::string info = absl::StrCat("ddprun replica aes-256-gcm ", std::string(direction));
    info.push_back('\0');
    info += job_id;
    return HkdfSha256(token, salt, info, kKeyBytes);
  };
  return ChannelKeys{key("client->server"), key("server->client")};
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
