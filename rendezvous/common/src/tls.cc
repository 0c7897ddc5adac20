// Loading and checking the PEM files of TlsOptions with OpenSSL, so that a
// wrong file is one line naming the flag before any handshake can fail.
#include "ddprun/rendezvous/common/tls.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "ddprun/rendezvous/common/errors.h"

namespace ddprun::rendezvous {
namespace {

// PEM files are small; anything bigger is not one.
constexpr off_t kMaxPemBytes = 1 << 20;

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;

std::string Where(const std::string& source, const std::string& path) {
  return absl::StrCat(source, " ", path);
}

absl::StatusOr<std::string> ReadFile(const std::string& source, const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InvalidArgumentError(absl::StrCat(Where(source, path),
                                                   ": cannot read: ", std::strerror(errno),
                                                   "; check the path and that this user can "
                                                   "read it"));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > kMaxPemBytes) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        Where(source, path), ": not a regular file of at most 1 MiB; give a PEM file"));
  }
  std::string data(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = read(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      close(fd);
      return absl::InvalidArgumentError(absl::StrCat(
          Where(source, path), ": cannot read: ", std::strerror(err), "; check the file"));
    }
    done += static_cast<size_t>(n);
  }
  close(fd);
  return data;
}

// What a PEM file holds instead, for the message: "a PRIVATE KEY", or "".
std::string FirstPemLabel(const std::string& pem) {
  const std::string begin = "-----BEGIN ";
  const size_t at = pem.find(begin);
  if (at == std::string::npos) return "";
  const size_t end = pem.find("-----", at + begin.size());
  if (end == std::string::npos) return "";
  return pem.substr(at + begin.size(), end - at - begin.size());
}

// Every certificate in a PEM bundle; at least one, or the error.
absl::StatusOr<std::vector<X509Ptr>> ParseCerts(const std::string& source, const std::string& path,
                                                const std::string& pem, const std::string& fix) {
  std::vector<X509Ptr> certs;
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) certs.emplace_back(x);
  ERR_clear_error();  // the end of the bundle reads as an error
  if (certs.empty()) {
    const std::string label = FirstPemLabel(pem);
    return absl::InvalidArgumentError(absl::StrCat(
        Where(source, path), ": not a PEM certificate (",
        label.empty() ? "no -----BEGIN CERTIFICATE-----" : "it holds a " + label, "); ", fix));
  }
  return certs;
}

// OpenSSL asks for a passphrase on the terminal without this callback.
int NoPassphrase(char*, int, int, void*) { return -1; }

absl::StatusOr<PkeyPtr> ParseKey(const std::string& source, const std::string& path,
                                 const std::string& pem) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  PkeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, nullptr));
  ERR_clear_error();
  if (key) return key;
  const std::string label = FirstPemLabel(pem);
  if (label == "ENCRYPTED PRIVATE KEY" || pem.find("Proc-Type: 4,ENCRYPTED") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(source, path),
        ": the key is encrypted and ddprun cannot ask for a passphrase; store it decrypted "
        "(openssl pkey -in KEY -out KEY.plain) with mode 0600"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(Where(source, path), ": not a PEM private key (",
                   label.empty() ? "no -----BEGIN PRIVATE KEY-----" : "it holds a " + label,
                   "); give the PEM key of the certificate"));
}

std::string Asn1Time(const ASN1_TIME* t) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  ASN1_TIME_print(bio.get(), t);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

// Our own certificate and key: readable, PEM, matching, currently valid.
absl::Status LoadCertAndKey(const TlsOptions& o, TlsConfig& out) {
  const TlsSourceNames& n = o.names;
  if (o.cert_file.empty() != o.key_file.empty()) {
    const bool cert = !o.cert_file.empty();
    return absl::InvalidArgumentError(
        absl::StrCat(cert ? n.cert : n.key, " is given without ", cert ? n.key : n.cert,
                     "; give both the certificate and its private key"));
  }
  DDPRUN_ASSIGN_OR_RETURN(out.cert_pem, ReadFile(n.cert, o.cert_file));
  DDPRUN_ASSIGN_OR_RETURN(out.key_pem, ReadFile(n.key, o.key_file));
  DDPRUN_ASSIGN_OR_RETURN(auto certs, ParseCerts(n.cert, o.cert_file, out.cert_pem,
                                                 "give the PEM file of this host's certificate"));
  DDPRUN_ASSIGN_OR_RETURN(PkeyPtr key, ParseKey(n.key, o.key_file, out.key_pem));
  X509* leaf = certs.front().get();
  if (X509_check_private_key(leaf, key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat(Where(n.key, o.key_file), " does not belong to ", Where(n.cert, o.cert_file),
                     " (key values mismatch); give the key the certificate was issued for"));
  }
  if (X509_cmp_current_time(X509_get0_notAfter(leaf)) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(n.cert, o.cert_file), ": the certificate expired on ",
                     Asn1Time(X509_get0_notAfter(leaf)), "; issue a new one"));
  }
  if (X509_cmp_current_time(X509_get0_notBefore(leaf)) > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(n.cert, o.cert_file), ": the certificate is not valid before ",
        Asn1Time(X509_get0_notBefore(leaf)), "; check this host's clock or the certificate"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> LoadCa(const std::string& source, const std::string& path) {
  DDPRUN_ASSIGN_OR_RETURN(std::string pem, ReadFile(source, path));
  DDPRUN_RETURN_IF_ERROR(
      ParseCerts(source, path, pem, "give the PEM file of the CA that signed the certificates")
          .status());
  return pem;
}

}  // namespace

absl::StatusOr<TlsConfig> LoadClientTls(const TlsOptions& o) {
  TlsConfig out;
  if (!o.client_enabled() && o.key_file.empty()) return out;
  if (o.ca_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(o.cert_file.empty() ? o.names.key : o.names.cert, " is given without ",
                     o.names.ca, "; give the CA that signed the server's certificate too"));
  }
  out.enabled = true;
  DDPRUN_ASSIGN_OR_RETURN(out.ca_pem, LoadCa(o.names.ca, o.ca_file));
  if (!o.cert_file.empty() || !o.key_file.empty()) {
    DDPRUN_RETURN_IF_ERROR(LoadCertAndKey(o, out));
  }
  return out;
}

absl::StatusOr<TlsConfig> LoadServerTls(const TlsOptions& o) {
  TlsConfig out;
  if (!o.server_enabled()) {
    if (!o.client_ca_file.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(o.names.client_ca, " needs ", o.names.cert, " and ", o.names.key,
                       ": mutual TLS is TLS first; give the server's certificate and key"));
    }
    return out;
  }
  out.enabled = true;
  DDPRUN_RETURN_IF_ERROR(LoadCertAndKey(o, out));
  if (!o.client_ca_file.empty()) {
    DDPRUN_ASSIGN_OR_RETURN(out.client_ca_pem, LoadCa(o.names.client_ca, o.client_ca_file));
  }
  return out;
}

absl::Status TlsHandshakeError(const std::string& target, const std::string& reason,
                               const std::string& fix) {
  absl::Status st = absl::UnauthenticatedError(
      absl::StrCat("TLS handshake with ", target, " failed: ", reason, "; ", fix));
  st.SetPayload(kKindPayload, absl::Cord("tls"));
  return st;
}

bool IsTlsHandshakeError(const absl::Status& status) {
  auto kind = status.GetPayload(kKindPayload);
  return status.code() == absl::StatusCode::kUnauthenticated && kind && *kind == "tls";
}

}  // namespace ddprun::rendezvous
