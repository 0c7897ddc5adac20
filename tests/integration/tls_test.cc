// TLS on the control plane (docs/tls.md), on loopback with certificates made
// by `openssl` at test time (support/tls_certs.h): the loader's one-line
// errors; a mutual-TLS RendezvousServer that serves the right client and
// refuses, by kind and with the fix named, a wrong CA, a missing or foreign
// client certificate and a plaintext client; a TLS client against a
// plaintext server; the server's rate-limited line per refused peer.
#include "ddprun/rendezvous/common/tls.h"

#include <grpc/support/log.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>

#include "ddprun/rendezvous/client.h"
#include "ddprun/rendezvous/common/errors.h"
#include "ddprun/rendezvous/daemon/server.h"
#include "ddprun/rendezvous/tls_refusal_log.h"  // the server's refusal lines
#include "support/capture_stderr.h"
#include "support/process_helpers.h"
#include "support/skip.h"
#include "support/tls_certs.h"

namespace ddprun::rendezvous {
namespace {

using namespace std::chrono_literals;
using test::TestCerts;

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The certificates of this program, made once, removed at exit.
const TestCerts& Certs() {
  static const struct Owned {
    TestCerts certs = test::MakeTestCerts();
    ~Owned() { test::RemoveTestCerts(certs); }
  } owned;
  return owned.certs;
}

std::string Message(const absl::Status& st) { return std::string(st.message()); }

TlsOptions ClientFiles(const std::string& ca, const std::string& cert = "",
                       const std::string& key = "") {
  TlsOptions o;
  o.ca_file = ca;
  o.cert_file = cert;
  o.key_file = key;
  return o;
}

TlsConfig Client(const TlsOptions& files) {
  auto c = LoadClientTls(files);
  REQUIRE(c.ok());
  return *c;
}

std::unique_ptr<RendezvousServer> StartServer(bool tls, bool mutual) {
  ServerOptions opts;
  opts.host = "127.0.0.1";
  opts.port = 0;
  if (tls) {
    TlsOptions files;
    files.cert_file = Certs().server_cert;
    files.key_file = Certs().server_key;
    if (mutual) files.client_ca_file = Certs().ca;
    auto loaded = LoadServerTls(files);
    REQUIRE(loaded.ok());
    opts.tls = *loaded;
  }
  auto s = RendezvousServer::Start(opts);
  REQUIRE(s.ok());
  return std::move(*s);
}

// Connects with `tls`; the refusal must come fast (not after the timeout),
// be a TLS handshake error of kind auth, and name the server and `fix`.
void RequireRefused(int port, const TlsConfig& tls, const std::string& reason,
                    const std::string& fix) {
  auto client = RendezvousClient::Create("127.0.0.1", port, tls);
  const auto t0 = std::chrono::steady_clock::now();
  const absl::Status st = client->WaitForConnected(20s);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(st.ToString());
  REQUIRE(IsTlsHandshakeError(st));
  REQUIRE(KindOf(st) == ErrorKind::kAuth);
  REQUIRE(Has(Message(st), "TLS handshake with 127.0.0.1:" + std::to_string(port) + " failed: "));
  REQUIRE(Has(Message(st), reason));
  REQUIRE(Has(Message(st), fix));
  REQUIRE(Message(st).find('\n') == std::string::npos);
  REQUIRE(s < 10);
}

}  // namespace

TEST_CASE("TLS files: a bad one is one line naming the flag, the file and the fix", "[tls]") {
  if (!Certs().ok) return test::SkipCase("integration", Certs().error);
  const TestCerts& c = Certs();
  auto bad = [](const absl::StatusOr<TlsConfig>& r) {
    REQUIRE_FALSE(r.ok());
    REQUIRE(KindOf(r.status()) == ErrorKind::kBadInput);
    REQUIRE(Message(r.status()).find('\n') == std::string::npos);
    return Message(r.status());
  };
  TlsOptions server;
  server.cert_file = c.server_cert;

  SECTION("nothing given: plaintext") {
    REQUIRE_FALSE(Client(TlsOptions{}).enabled);
    auto s = LoadServerTls(TlsOptions{});
    REQUIRE(s.ok());
    REQUIRE_FALSE(s->enabled);
  }
  SECTION("a key file that does not exist") {
    server.key_file = c.dir + "/missing.key";
    const std::string m = bad(LoadServerTls(server));
    REQUIRE(Has(m, "--tls_key " + c.dir + "/missing.key: cannot read: No such file"));
    REQUIRE(Has(m, "check the path"));
  }
  SECTION("a key file this user cannot read") {
    if (::geteuid() == 0) return test::SkipCase("integration", "root reads any file");
    const std::string key = c.dir + "/unreadable.key";
    REQUIRE(std::system(("cp " + c.server_key + " " + key).c_str()) == 0);
    REQUIRE(::chmod(key.c_str(), 0) == 0);
    server.key_file = key;
    REQUIRE(
        Has(bad(LoadServerTls(server)), "--tls_key " + key + ": cannot read: Permission denied"));
  }
  SECTION("a directory for a key") {
    server.key_file = c.dir;
    REQUIRE(Has(bad(LoadServerTls(server)), "--tls_key " + c.dir + ": not a regular file"));
  }
  SECTION("a key where the certificate belongs") {
    server.cert_file = c.server_key;
    server.key_file = c.server_key;
    const std::string m = bad(LoadServerTls(server));
    REQUIRE(
        Has(m, "--tls_cert " + c.server_key + ": not a PEM certificate (it holds a PRIVATE KEY)"));
  }
  SECTION("a certificate and another certificate's key") {
    server.key_file = c.client_key;
    const std::string m = bad(LoadServerTls(server));
    REQUIRE(
        Has(m, "--tls_key " + c.client_key + " does not belong to --tls_cert " + c.server_cert));
    REQUIRE(Has(m, "give the key the certificate was issued for"));
  }
  SECTION("a certificate without its key, and a client CA without TLS") {
    REQUIRE(Has(bad(LoadServerTls(server)), "--tls_cert is given without --tls_key"));
    TlsOptions only_ca;
    only_ca.client_ca_file = c.ca;
    REQUIRE(Has(bad(LoadServerTls(only_ca)), "--tls_client_ca needs --tls_cert and --tls_key"));
  }
  SECTION("a client certificate without a CA to check the server") {
    REQUIRE(Has(bad(LoadClientTls(ClientFiles("", c.client_cert, c.client_key))),
                "--tls_cert is given without --tls_ca"));
  }
  SECTION("the names a worker's variables give") {
    TlsOptions o = ClientFiles(c.client_key);
    o.names = {"DDPRUN_TLS_CA", "DDPRUN_TLS_CERT", "DDPRUN_TLS_KEY", ""};
    REQUIRE(
        Has(bad(LoadClientTls(o)), "DDPRUN_TLS_CA " + c.client_key + ": not a PEM certificate"));
  }
}

TEST_CASE("TLS rendezvous: the right certificates work, every wrong one is refused by kind",
          "[tls]") {
  if (!Certs().ok) return test::SkipCase("integration", Certs().error);
  const TestCerts& c = Certs();
  auto mtls = StartServer(/*tls=*/true, /*mutual=*/true);
  const int port = mtls->port();
  const TlsConfig good = Client(ClientFiles(c.ca, c.client_cert, c.client_key));

  SECTION("right CA and client certificate: the Rendezvous and Store services answer") {
    for (const char* host : {"127.0.0.1", "localhost"}) {
      auto client = RendezvousClient::Create(host, port, good);
      REQUIRE(client->WaitForConnected(10s).ok());
      REQUIRE(client->Status("", 5s).ok());
    }
    // A job's store over TLS, as a worker uses it.
    JoinSpec spec;
    spec.job_id = "tlsjob";
    spec.host = "127.0.0.1";
    spec.pid = 1;
    spec.nproc = 1;
    spec.policy.join_timeout_s = 5;
    spec.command = "train";
    auto client = RendezvousClient::Create("127.0.0.1", port, good);
    auto stream = client->Join(spec);
    RoundEvent e = stream->Next(10s);
    auto* a = std::get_if<Assignment>(&e);
    REQUIRE(a != nullptr);
    GrpcStore store("127.0.0.1", port, StoreScope{"tlsjob", a->store_token, a->round}, good);
    REQUIRE(store.CheckTls(5s).ok());
    REQUIRE(store.Set("k", "v").ok());
    auto v = store.Get("k", 5s);
    REQUIRE(v.ok());
    REQUIRE(*v == "v");
  }
  SECTION("a CA that did not sign the server's certificate") {
    RequireRefused(port, Client(ClientFiles(c.other_ca, c.client_cert, c.client_key)),
                   "the server's certificate is not trusted", "check --tls_ca");
    GrpcStore store("127.0.0.1", port, StoreScope{"x", "t", 0},
                    Client(ClientFiles(c.other_ca, c.client_cert, c.client_key)));
    REQUIRE(IsTlsHandshakeError(store.CheckTls(5s)));
  }
  SECTION("no client certificate under mutual TLS") {
    RequireRefused(port, Client(ClientFiles(c.ca)), "requires a client certificate",
                   "give --tls_cert and --tls_key");
  }
  SECTION("a client certificate from another CA") {
    RequireRefused(port, Client(ClientFiles(c.ca, c.stranger_cert, c.stranger_key)),
                   "client's certificate", "check --tls_cert");
  }
  SECTION("a plaintext client; the server says so once per interval") {
    test::CaptureStderr captured;
    RequireRefused(port, TlsConfig{},
                   "the server requires TLS and this client connects in plaintext",
                   "give --tls_ca");
    RequireRefused(port, TlsConfig{}, "plaintext", "give --tls_ca");
    const std::string err = captured.text();
    INFO(err);
    const std::string line = "ddprund: refused a client that does not speak TLS; give it --tls_ca";
    REQUIRE(Has(err, line));
    REQUIRE(err.find(line) == err.rfind(line));  // rate-limited: one line for many attempts
  }
}

TEST_CASE("TLS: server TLS without client certificates; a TLS client against plaintext", "[tls]") {
  if (!Certs().ok) return test::SkipCase("integration", Certs().error);
  const TestCerts& c = Certs();
  SECTION("server-only TLS serves a client with just the CA") {
    auto server = StartServer(/*tls=*/true, /*mutual=*/false);
    auto client = RendezvousClient::Create("127.0.0.1", server->port(), Client(ClientFiles(c.ca)));
    REQUIRE(client->WaitForConnected(10s).ok());
    REQUIRE(client->Status("", 5s).ok());
  }
  SECTION("a TLS client against a plaintext server") {
    auto server = StartServer(/*tls=*/false, /*mutual=*/false);
    RequireRefused(server->port(), Client(ClientFiles(c.ca)), "the server does not speak TLS",
                   "start it with --tls_cert and --tls_key");
  }
  SECTION("nothing listens: a connection error, not a TLS one") {
    auto client =
        RendezvousClient::Create("127.0.0.1", test::FreePort(), Client(ClientFiles(c.ca)));
    const absl::Status st = client->WaitForConnected(1s);
    REQUIRE(KindOf(st) == ErrorKind::kConnection);
  }
}

}  // namespace ddprun::rendezvous

namespace ddprun::rendezvous {

TEST_CASE("TLS refusals on the server: classified by OpenSSL's reason, one line per interval",
          "[tls]") {
  constexpr const char* kFile = "src/core/tsi/ssl_transport_security.cc";
  std::string reason;
  auto kind = [&](const char* file, gpr_log_severity severity, const char* message) {
    return ClassifyGrpcLogLine(file, severity, message, &reason);
  };
  const char* no_cert =
      "Handshake failed with fatal error SSL_ERROR_SSL: error:0A0000C7:SSL routines::peer did "
      "not return a certificate.";
  REQUIRE(kind(kFile, GPR_LOG_SEVERITY_ERROR, no_cert) == TlsRefusal::kNoClientCert);
  REQUIRE(kind(kFile, GPR_LOG_SEVERITY_ERROR, "... error:0A000086:SSL routines::x") ==
          TlsRefusal::kUntrustedClient);
  REQUIRE(kind(kFile, GPR_LOG_SEVERITY_ERROR, "... error:0A00010B:SSL routines::x") ==
          TlsRefusal::kPlaintextClient);
  REQUIRE(kind(kFile, GPR_LOG_SEVERITY_ERROR, "... error:0A000102:SSL routines::x") ==
          TlsRefusal::kOther);
  REQUIRE_FALSE(reason.empty());
  // Not a handshake failure: another file, another severity, no code.
  REQUIRE_FALSE(kind("src/core/lib/iomgr/tcp_posix.cc", GPR_LOG_SEVERITY_ERROR, no_cert));
  REQUIRE_FALSE(kind(kFile, GPR_LOG_SEVERITY_DEBUG, no_cert));
  REQUIRE_FALSE(kind(kFile, GPR_LOG_SEVERITY_ERROR, "Handshake failed: error:nothex"));

  FakeClock clock;
  RefusalLimiter limiter("ddprund: ", "--tls_client_ca");
  auto first = limiter.Note(TlsRefusal::kNoClientCert, "", clock.Now());
  REQUIRE(first);
  REQUIRE(*first ==
          "ddprund: refused a TLS client without a certificate (--tls_client_ca requires one); "
          "give it --tls_cert and --tls_key");
  clock.Advance(std::chrono::seconds(1));
  REQUIRE_FALSE(limiter.Note(TlsRefusal::kNoClientCert, "", clock.Now()));
  REQUIRE_FALSE(limiter.Note(TlsRefusal::kNoClientCert, "", clock.Now()));
  // Another kind has its own interval.
  REQUIRE(limiter.Note(TlsRefusal::kPlaintextClient, "", clock.Now()));
  clock.Advance(kRefusalLogInterval);
  auto later = limiter.Note(TlsRefusal::kNoClientCert, "", clock.Now());
  REQUIRE(later);
  REQUIRE(Has(*later, "(and 2 more like it in the last 11 s)"));
}

}  // namespace ddprun::rendezvous
