// TLS end to end (docs/tls.md): a real ddprund with mutual TLS, two real
// ddprun agents (one given its files by flags, one by PET_* variables) and
// SDK workers whose store calls go over TLS with the files the agent passed
// in DDPRUN_TLS_*; then agents with the wrong files, each refused at once
// with a one-line message that names the fix, and the daemon's line.
// Certificates are made by `openssl` at test time (support/tls_certs.h).
#include <catch2/catch.hpp>
#include <string>

#include "support/process_helpers.h"
#include "support/skip.h"
#include "support/tls_certs.h"

using namespace ddprun::test;

namespace {

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A short SDK case whose bootstrap (Gloo over TCP, DDP_SHM=0) goes through
// the store: every rank's ddp::Init and the group's keys.
std::vector<std::string> BarrierJob(std::vector<std::string> flags) {
  flags.push_back("--no_python");
  return Concat(std::move(flags),
                CatchRun(Bin("sdk_worker"), "barrier holds every rank until the last arrives"));
}

}  // namespace

TEST_CASE("two agents and their SDK workers through a mutual-TLS ddprund", "[sdk]") {
  const TestCerts c = MakeTestCerts();
  if (!c.ok) return SkipCase("sdk", c.error);
  Harness h;
  Proc* d = nullptr;
  const int port = h.StartDaemon(
      "ddprund", &d,
      {"--tls_cert", c.server_cert, "--tls_key", c.server_key, "--tls_client_ca", c.ca});
  const std::string endpoint = "--rdzv_endpoint=127.0.0.1:" + std::to_string(port);
  const std::vector<std::string> shape{"--nnodes=2", "--nproc_per_node=2", endpoint,
                                       "--rdzv_id=tlsjob"};
  const EnvList worker_env{{"DDP_TIMEOUT_SEC", "30"}, {"DDP_SHM", "0"}};

  // Node a: flags. Node b: the same files through PET_* variables.
  Proc& a = h.StartDdprun(
      "node-a",
      BarrierJob(Concat(shape, {"--local_addr=127.0.0.1", "--tls_ca", c.ca, "--tls_cert",
                                c.client_cert, "--tls_key", c.client_key})),
      worker_env);
  EnvList env_b = worker_env;
  env_b.push_back({"PET_TLS_CA", c.ca});
  env_b.push_back({"PET_TLS_CERT", c.client_cert});
  env_b.push_back({"PET_TLS_KEY", c.client_key});
  Proc& b = h.StartDdprun("node-b", BarrierJob(Concat(shape, {"--local_addr=127.0.0.2"})), env_b);
  const int ra = h.Wait(a, 120);
  const int rb = h.Wait(b, 120);
  INFO("node a:\n"
       << a.Out() << a.Err() << "\nnode b:\n"
       << b.Out() << b.Err() << "\nddprund:\n"
       << d->Err());
  REQUIRE(ra == 0);
  REQUIRE(rb == 0);
  REQUIRE(Has(d->Err(), "ddprund: serving TLS with mutual TLS"));
  // Nobody was refused on the way.
  REQUIRE_FALSE(Has(d->Err(), "refused"));
  h.StopDaemon(*d);
  RemoveTestCerts(c);
}

TEST_CASE("agents with the wrong TLS files are refused at once and told the fix", "[sdk]") {
  const TestCerts c = MakeTestCerts();
  if (!c.ok) return SkipCase("sdk", c.error);
  Harness h;
  Proc* d = nullptr;
  const int port = h.StartDaemon(
      "ddprund", &d,
      {"--tls_cert", c.server_cert, "--tls_key", c.server_key, "--tls_client_ca", c.ca});
  const std::string target = "127.0.0.1:" + std::to_string(port);
  // A fixed-size job would wait 600 s for its peer: the refusal must not.
  auto agent = [&](const std::string& name, std::vector<std::string> flags, EnvList env = {}) {
    std::vector<std::string> args{"--nnodes=2", "--rdzv_endpoint=" + target, "--rdzv_id=refused",
                                  "--no_python"};
    args.insert(args.end(), flags.begin(), flags.end());
    args.push_back("/bin/true");
    Proc& p = h.StartDdprun(name, args, env);
    const int rc = h.Wait(p, 30);
    INFO(name << " stderr:\n" << p.Err());
    return std::make_pair(rc, p.Err());
  };
  const std::string handshake = "TLS handshake with " + target + " failed: ";

  SECTION("a CA that did not sign ddprund's certificate") {
    auto [rc, err] = agent("wrong-ca", {"--tls_ca", c.other_ca, "--tls_cert", c.client_cert,
                                        "--tls_key", c.client_key});
    REQUIRE(rc == 3);
    REQUIRE(Has(err, handshake + "the server's certificate is not trusted"));
    REQUIRE(Has(err, "check --tls_ca"));
  }
  SECTION("no client certificate") {
    auto [rc, err] = agent("no-cert", {"--tls_ca", c.ca});
    REQUIRE(rc == 3);
    REQUIRE(Has(err, handshake + "the server requires a client certificate"));
    REQUIRE(Has(err, "give --tls_cert and --tls_key"));
    REQUIRE(Has(d->Err(), "ddprund: refused a TLS client without a certificate"));
  }
  SECTION("a plaintext agent") {
    auto [rc, err] = agent("plaintext", {});
    REQUIRE(rc == 3);
    REQUIRE(Has(err, handshake + "the server requires TLS and this client connects in plaintext"));
    REQUIRE(Has(err, "give --tls_ca"));
    const auto t0 = Clock::now();
    while (!Has(d->Err(), "refused a client that does not speak TLS") && SecondsSince(t0) < 5) {
      SleepMs(10);
    }
    REQUIRE(Has(d->Err(), "ddprund: refused a client that does not speak TLS; give it --tls_ca"));
  }
  SECTION("a key file that does not exist, by PET_TLS_KEY: a usage error before anything starts") {
    auto [rc, err] = agent("missing-key", {"--tls_ca", c.ca, "--tls_cert", c.client_cert},
                           {{"PET_TLS_KEY", c.dir + "/missing.key"}});
    REQUIRE(rc == 2);
    REQUIRE(Has(err, "PET_TLS_KEY (--tls_key) " + c.dir + "/missing.key: cannot read"));
  }
  SECTION("a certificate with another certificate's key") {
    auto [rc, err] = agent(
        "mismatch", {"--tls_ca", c.ca, "--tls_cert", c.client_cert, "--tls_key", c.server_key});
    REQUIRE(rc == 2);
    REQUIRE(Has(err, "does not belong to --tls_cert " + c.client_cert));
  }
  h.StopDaemon(*d);
  RemoveTestCerts(c);
}

TEST_CASE("a single node hosting the rendezvous serves mutual TLS to itself and its workers",
          "[sdk]") {
  const TestCerts c = MakeTestCerts();
  if (!c.ok) return SkipCase("sdk", c.error);
  Harness h;
  // client.pem names 127.0.0.1, where the embedded rendezvous is reached.
  Proc& p = h.StartDdprun("single",
                          BarrierJob({"--nproc_per_node=2", "--tls_ca", c.ca, "--tls_cert",
                                      c.client_cert, "--tls_key", c.client_key}),
                          {{"DDP_TIMEOUT_SEC", "30"}, {"DDP_SHM", "0"}});
  const int rc = h.Wait(p, 120);
  INFO(p.Out() << p.Err());
  REQUIRE(rc == 0);
  // Without a certificate to serve, hosting it is refused with the fix named.
  Proc& q = h.StartDdprun("no-cert",
                          {"--nproc_per_node=1", "--tls_ca", c.ca, "--no_python", "/bin/true"});
  REQUIRE(h.Wait(q, 30) == 2);  // a usage mistake (issue 33 item 13)
  REQUIRE(Has(q.Err(),
              "this node hosts the rendezvous and --tls_ca asks for TLS, but it has no "
              "--tls_cert; give it --tls_cert and --tls_key"));
  RemoveTestCerts(c);
}
