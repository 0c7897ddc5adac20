// Who can see and touch a job (docs/security.md), with real processes: a
// ddprund with TLS on both ports (mutual TLS on gRPC, --web_config on the
// monitoring port) and curl as the client with right, wrong and missing
// credentials and certificates; bad web configurations; and strangers on
// every port of a running job (monitoring HTTP, gRPC, the agent's TCPStore):
// foreign certificates, garbage, silence, slowness and 2,000 connections at
// once, refused or bounded, logged at most once a second per kind, the job
// unaffected and no secret in any error.
#include <arpa/inet.h>
#include <crypt.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <regex>

#include "ddprun/rendezvous/store/c10d_store_client.h"
#include "nlohmann/json.hpp"
#include "support/process_helpers.h"
#include "support/skip.h"
#include "support/tls_certs.h"

namespace ddprun::test {
namespace {

const std::string kPassword = "Sup3r-secret-pw";

std::string Bcrypt(const std::string& password) {
  char salt[CRYPT_GENSALT_OUTPUT_SIZE];
  REQUIRE(crypt_gensalt_rn("$2b$", 5, nullptr, 0, salt, sizeof(salt)) != nullptr);
  crypt_data data{};
  const char* h = crypt_rn(password.c_str(), salt, &data, sizeof(data));
  REQUIRE(h != nullptr);
  return h;
}

struct Curl {
  int rc = -1;
  int code = 0;
  std::string headers, body;
};

// One curl request; `args` adds the certificates and credentials.
Curl Fetch(Harness& h, const std::string& name, const std::string& url,
           const std::vector<std::string>& args) {
  const std::string hdr = h.dir() + "/" + name + ".headers";
  std::vector<std::string> argv{"curl", "-sS", "--max-time", "10",
                                "-D",   hdr,   "-w",         "\n%{http_code}"};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back(url);
  Proc& p = h.Start(name, argv);
  Curl c;
  c.rc = h.Wait(p, 20);
  std::string out = p.Out();
  const auto nl = out.rfind('\n');
  if (nl != std::string::npos) {
    c.code = std::atoi(out.c_str() + nl + 1);
    c.body = out.substr(0, nl);
  }
  c.headers = ReadFile(hdr);
  return c;
}

struct Secured {
  TestCerts certs;
  std::string web_config;
  std::vector<std::string> client;  // curl's certificate flags
};

Secured MakeSecured(Harness& h) {
  Secured s;
  s.certs = MakeTestCerts();
  REQUIRE(s.certs.ok);
  s.web_config = h.dir() + "/web.yml";
  std::ofstream(s.web_config) << "tls_server_config:\n  cert_file: " << s.certs.server_cert
                              << "\n  key_file: " << s.certs.server_key
                              << "\n  client_ca_file: " << s.certs.ca
                              << "\n  client_auth_type: RequireAndVerifyClientCert\n"
                              << "basic_auth_users:\n  prometheus: " << Bcrypt(kPassword) << "\n";
  s.client = {"--cacert", s.certs.ca, "--cert", s.certs.client_cert, "--key", s.certs.client_key};
  return s;
}

TEST_CASE("ddprund --web_config: HTTPS, mutual TLS and basic auth, tried with curl",
          "[multiproc][security]") {
  if (!HaveOpenssl()) return SkipCase("multiproc", "no openssl command for the test certificates");
  Harness h;
  Secured s = MakeSecured(h);
  Proc* d = nullptr;
  h.StartDaemon("ddprund", &d, {"--web_config", s.web_config});
  const int port = DashboardPort(*d);
  CHECK_THAT(d->Err(), Catch::Contains("ddprund: the monitoring port serves HTTPS with mutual TLS "
                                       "and basic auth (1 user), from --web_config " +
                                       s.web_config));
  const std::string base = "https://127.0.0.1:" + std::to_string(port);
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> a = s.client;
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  // Right certificate, right credentials: every route.
  for (const char* route : {"/", "/api/v1/jobs", "/metrics"}) {
    Curl ok = Fetch(h, std::string("ok") + std::to_string(std::strlen(route)), base + route,
                    with({"-u", "prometheus:" + kPassword}));
    INFO(route << ": " << ok.body);
    CHECK(ok.rc == 0);
    CHECK(ok.code == 200);
  }
  // Wrong and missing credentials: 401 with the challenge, nothing secret.
  for (const auto& [name, creds] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"wrong", {"-u", "prometheus:not-" + kPassword}},
           {"nouser", {"-u", "nobody:" + kPassword}},
           {"missing", {}}}) {
    Curl c = Fetch(h, name, base + "/api/v1/jobs", with(creds));
    INFO(name << ": " << c.headers << c.body);
    CHECK(c.code == 401);
    CHECK_THAT(c.headers, Catch::Contains("WWW-Authenticate: Basic realm=\"ddprun\""));
    CHECK(c.body ==
          "{\"error\":\"unauthorized: this port needs a user and password (basic auth)\"}");
  }
  // The health probes need no credentials (a kubelet has none), still over
  // the same TLS; every other route does.
  for (const char* route : {"/healthz", "/readyz"}) {
    Curl probe =
        Fetch(h, std::string("probe") + std::to_string(std::strlen(route)), base + route, s.client);
    INFO(route << ": " << probe.body);
    CHECK(probe.code == 200);
  }
  Curl probe_query = Fetch(h, "probe-query", base + "/healthz/../api/v1/jobs", s.client);
  CHECK(probe_query.code != 200);
  // No client certificate, a foreign one, plain HTTP: no HTTP answer at all.
  Curl nocert = Fetch(h, "nocert", base + "/metrics",
                      {"--cacert", s.certs.ca, "-u", "prometheus:" + kPassword});
  CHECK(nocert.rc != 0);
  CHECK(nocert.code == 0);
  Curl foreign = Fetch(h, "foreign", base + "/metrics",
                       {"--cacert", s.certs.ca, "--cert", s.certs.stranger_cert, "--key",
                        s.certs.stranger_key, "-u", "prometheus:" + kPassword});
  CHECK(foreign.rc != 0);
  CHECK(foreign.code == 0);
  Curl plain = Fetch(h, "plain", "http://127.0.0.1:" + std::to_string(port) + "/metrics", {});
  CHECK(plain.code == 0);
  // A client that does not trust the server's CA refuses it.
  Curl untrusted = Fetch(h, "untrusted", base + "/metrics", {"--cacert", s.certs.other_ca});
  CHECK(untrusted.rc != 0);
  h.StopDaemon(*d);
  INFO(d->Err());
  CHECK_THAT(d->Err(), Catch::Contains("monitoring port: refused a request with wrong basic-auth "
                                       "credentials (401)"));
  CHECK_THAT(d->Err(), Catch::Contains("monitoring port: refused a TLS handshake: "));
  CHECK(d->Err().find(kPassword) == std::string::npos);
  RemoveTestCerts(s.certs);
}

TEST_CASE(
    "ddprund --tls_cert without --web_config: the monitoring port is HTTPS with the same "
    "certificate; plaintext is a choice with a warning",
    "[multiproc][security]") {
  if (!HaveOpenssl()) return SkipCase("multiproc", "no openssl command for the test certificates");
  Harness h;
  TestCerts c = MakeTestCerts();
  REQUIRE(c.ok);
  const std::vector<std::string> grpc_tls{"--tls_cert", c.server_cert,     "--tls_key",
                                          c.server_key, "--tls_client_ca", c.ca};
  Proc* d = nullptr;
  h.StartDaemon("ddprund", &d, grpc_tls);
  const int port = DashboardPort(*d);
  CHECK_THAT(d->Err(), Catch::Contains("ddprund: the monitoring port serves HTTPS with mutual TLS, "
                                       "from --tls_cert (as the gRPC port)"));
  const std::string url = "https://127.0.0.1:" + std::to_string(port) + "/api/v1/jobs";
  Curl ok = Fetch(h, "ok", url, {"--cacert", c.ca, "--cert", c.client_cert, "--key", c.client_key});
  CHECK(ok.code == 200);
  Curl nocert = Fetch(h, "nocert", url, {"--cacert", c.ca});
  CHECK(nocert.code == 0);
  h.StopDaemon(*d);

  std::vector<std::string> plain = grpc_tls;
  plain.insert(plain.end(), {"--web_config", "plaintext"});
  Proc* p = nullptr;
  h.StartDaemon("plain", &p, plain);
  const int pport = DashboardPort(*p);
  const std::vector<std::string> lines = Lines(p->Err());
  CHECK(std::count_if(lines.begin(), lines.end(), [](const std::string& l) {
          return l.find("warning") != std::string::npos;
        }) == 1);
  CHECK_THAT(p->Err(), Catch::Contains("ddprund: warning: the monitoring port serves plain HTTP to "
                                       "anyone who can reach it, next to a TLS gRPC port "
                                       "(--web_config=plaintext)"));
  Curl http = Fetch(h, "http", "http://127.0.0.1:" + std::to_string(pport) + "/api/v1/jobs", {});
  CHECK(http.code == 200);
  h.StopDaemon(*p);
  RemoveTestCerts(c);
}

TEST_CASE("a bad --web_config is one line naming the file, the key and the fix; exit 2",
          "[multiproc][security]") {
  Harness h;
  const std::string typo = h.dir() + "/typo.yml";
  std::ofstream(typo) << "tls_server_config:\n  cert_file: a.pem\n  key_file: b.pem\n"
                      << "basic_auth_user:\n  a: b\n";
  const std::string nofile = h.dir() + "/cert.yml";
  std::ofstream(nofile) << "tls_server_config:\n  cert_file: missing.pem\n  key_file: b.pem\n";
  struct Case {
    std::vector<std::string> args;
    std::vector<std::pair<std::string, std::string>> env;
    std::string expected;
  };
  const std::vector<Case> cases{
      {{"--web_config", typo},
       {},
       "ddprund: --web_config " + typo +
           ": line 4: unknown key 'basic_auth_user' under the top level (did you mean "
           "basic_auth_users?); the keys there are tls_server_config, http_server_config, "
           "basic_auth_users"},
      {{},
       {{"DDPRUND_WEB_CONFIG", h.dir() + "/none.yml"}},
       "ddprund: DDPRUND_WEB_CONFIG " + h.dir() +
           "/none.yml: cannot read: No such file or directory; check the path and that this "
           "user can read it"},
      {{"--web_config", nofile},
       {},
       "ddprund: --web_config " + nofile + ": tls_server_config.cert_file " + h.dir() +
           "/missing.pem: cannot read: No such file or directory; check the path and that this "
           "user can read it"},
  };
  int i = 0;
  for (const Case& c : cases) {
    std::vector<std::string> argv{Ddprund(), "--host", "127.0.0.1", "--port", "0"};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    Proc& p = h.Start("bad" + std::to_string(i++), argv, c.env);
    const int rc = h.Wait(p, 10);
    INFO(p.Err());
    CHECK(rc == 2);
    CHECK(Lines(p.Err()).size() == 1);
    CHECK(p.Err() == c.expected + "\n");
  }
}

TEST_CASE("ddprun --web_config: the job's own monitoring port serves HTTPS with basic auth",
          "[multiproc][security]") {
  if (!HaveOpenssl()) return SkipCase("multiproc", "no openssl command for the test certificates");
  Harness h;
  Secured s = MakeSecured(h);
  const std::string dir = h.MakeDir("w");
  const std::string worker =
      h.Script("w.sh", "#!/bin/sh\nwhile [ ! -e " + dir + "/stop ]; do sleep 0.05; done\n");
  Proc& job = h.StartDdprun("job", {"--nnodes=1", "--nproc_per_node=1", "--rdzv_id=own",
                                    "--web_config", s.web_config, worker});
  static const std::regex line(R"(dashboard at https://[^ ]*:(\d+)/)");
  const auto t0 = Clock::now();
  int port = -1;
  while (port < 0 && SecondsSince(t0) < 20 && !job.exit) {
    std::smatch m;
    const std::string err = job.Err();
    if (std::regex_search(err, m, line)) port = std::stoi(m[1]);
    SleepMs(20);
  }
  INFO(job.Err());
  REQUIRE(port > 0);
  CHECK_THAT(job.Err(), Catch::Contains("the monitoring port serves HTTPS with mutual TLS and "
                                        "basic auth (1 user), from --web_config " +
                                        s.web_config));
  const std::string url = "https://127.0.0.1:" + std::to_string(port) + "/api/v1/jobs";
  std::vector<std::string> authed = s.client;
  authed.insert(authed.end(), {"-u", "prometheus:" + kPassword});
  Curl ok = Fetch(h, "ok", url, authed);
  CHECK(ok.code == 200);
  CHECK_THAT(ok.body, Catch::Contains("\"own\""));
  Curl wrong = Fetch(h, "wrong", url, s.client);
  CHECK(wrong.code == 401);
  Curl nocert = Fetch(h, "nocert", url, {"--cacert", s.certs.ca, "-u", "prometheus:" + kPassword});
  CHECK(nocert.code == 0);
  std::ofstream(dir + "/stop") << "";
  CHECK(h.Wait(job, 30) == 0);
  CHECK(job.Err().find(kPassword) == std::string::npos);

  // A bad file: one line naming it, exit 2, no worker started.
  const std::string bad = h.dir() + "/bad.yml";
  std::ofstream(bad) << "basic_auth_users:\n  prometheus: " << kPassword << "\n";
  Proc& refused = h.StartDdprun("bad", {"--nnodes=1", "--web_config", bad, worker});
  CHECK(h.Wait(refused, 30) == 2);
  INFO(refused.Err());
  CHECK(Lines(refused.Err()).size() == 1);
  CHECK_THAT(refused.Err(), Catch::Contains("--web_config " + bad +
                                            ": line 2: the password of basic_auth_users "
                                            "'prometheus' is not a bcrypt hash"));
  CHECK(refused.Err().find(kPassword) == std::string::npos);
  RemoveTestCerts(s.certs);
}

TEST_CASE(
    "ddprun hosting a TLS rendezvous without --web_config warns once that its monitoring "
    "port is plain HTTP",
    "[multiproc][security]") {
  if (!HaveOpenssl()) return SkipCase("multiproc", "no openssl command for the test certificates");
  Harness h;
  TestCerts c = MakeTestCerts();
  REQUIRE(c.ok);
  Proc& job = h.StartDdprun(
      "job", {"--nnodes=1", "--rdzv_id=tlsjob", "--local_addr=127.0.0.1", "--tls_ca", c.ca,
              "--tls_cert", c.server_cert, "--tls_key", c.server_key, "/bin/true"});
  CHECK(h.Wait(job, 30) == 0);
  INFO(job.Err());
  const std::vector<std::string> lines = Lines(job.Err());
  CHECK(std::count_if(lines.begin(), lines.end(), [](const std::string& l) {
          return l.find("warning: the monitoring port serves plain HTTP") != std::string::npos;
        }) == 1);
  CHECK_THAT(job.Err(), Catch::Contains("give --web_config FILE (docs/security.md) or "
                                        "--dashboard_port=off"));
  RemoveTestCerts(c);
}

// ---- strangers ----

int Connect(int port, bool nonblocking) {
  int fd = ::socket(AF_INET, SOCK_STREAM | (nonblocking ? SOCK_NONBLOCK : 0), 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  REQUIRE((rc == 0 || errno == EINPROGRESS));
  return fd;
}

// `n` connections at once; every other one sends garbage, the rest stay
// silent. Returns the fds (the caller closes them).
// The issue's figure: ten thousand connections to each port at once. Each
// side needs that many descriptors: the test raises its own soft limit (the
// servers it starts inherit it).
constexpr int kFloodConnections = 10'000;

// Raises this process's descriptor limit so that the flood and the servers
// it starts (which inherit it) can hold kFloodConnections each; false when
// the hard limit is too low.
bool RaiseFdLimitForFlood() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return false;
  const rlim_t want = kFloodConnections + 1024;
  if (lim.rlim_cur >= want) return true;
  if (lim.rlim_max != RLIM_INFINITY && lim.rlim_max < want) return false;
  lim.rlim_cur = want;
  return ::setrlimit(RLIMIT_NOFILE, &lim) == 0;
}

std::vector<int> Flood(int port, int n) {
  std::vector<int> fds;
  fds.reserve(n);
  for (int i = 0; i < n; ++i) fds.push_back(Connect(port, true));
  SleepMs(200);
  const std::string garbage = "\x16\x03\x01\xff\xff garbage \x00\x01\r\n\r\n";
  for (std::size_t i = 0; i < fds.size(); i += 2) {
    (void)!::send(fds[i], garbage.data(), garbage.size(), MSG_NOSIGNAL);
  }
  return fds;
}

void CloseAll(std::vector<int>& fds) {
  for (int fd : fds) ::close(fd);
  fds.clear();
}

// Whether the server closed `fd` within `seconds` (EOF or reset).
bool ClosedWithin(int fd, double seconds) {
  const auto t0 = Clock::now();
  char buf[256];
  while (SecondsSince(t0) < seconds) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) == 1) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN)) return true;
    }
  }
  return false;
}

long Steps(const std::string& dir, int rank) {
  return std::atol(ReadFile(dir + "/steps." + std::to_string(rank)).c_str());
}

TEST_CASE("strangers on the monitoring, gRPC and TCPStore ports leave a running job alone",
          "[multiproc][security]") {
  if (!HaveOpenssl()) return SkipCase("multiproc", "no openssl command for the test certificates");
  {
    INFO("the hard descriptor limit (ulimit -Hn) is below 10,000 connections plus the job's own");
    REQUIRE(RaiseFdLimitForFlood());
  }
  Harness h;
  Secured s = MakeSecured(h);
  Proc* d = nullptr;
  const int grpc =
      h.StartDaemon("ddprund", &d,
                    {"--tls_cert", s.certs.server_cert, "--tls_key", s.certs.server_key,
                     "--tls_client_ca", s.certs.ca, "--web_config", s.web_config});
  const int web = DashboardPort(*d);
  const std::string ep = "127.0.0.1:" + std::to_string(grpc);
  const std::string tls_flags[] = {"--tls_ca=" + s.certs.ca, "--tls_cert=" + s.certs.client_cert,
                                   "--tls_key=" + s.certs.client_key};
  // Workers count steps in a file and write where the agent's TCPStore is.
  const std::string dir = h.MakeDir("steps");
  const std::string worker = h.Script(
      "w.sh", "#!/bin/sh\necho \"$MASTER_PORT\" > " + dir +
                  "/master.$LOCAL_RANK\ni=0\nwhile [ ! -e " + dir +
                  "/stop ]; do i=$((i+1)); echo $i > " + dir + "/tmp.$LOCAL_RANK; mv " + dir +
                  "/tmp.$LOCAL_RANK " + dir + "/steps.$LOCAL_RANK; sleep 0.05; done\n");
  Proc& job =
      h.StartDdprun("job", {"--nnodes=1", "--nproc_per_node=2", "--rdzv_endpoint=" + ep,
                            "--rdzv_id=guarded", tls_flags[0], tls_flags[1], tls_flags[2], worker});
  const auto t0 = Clock::now();
  while (SecondsSince(t0) < 20 && (Steps(dir, 0) < 5 || Steps(dir, 1) < 5)) SleepMs(50);
  REQUIRE(Steps(dir, 1) >= 5);
  const int store = std::atoi(ReadFile(dir + "/master.0").c_str());
  REQUIRE(store > 0);
  const std::string jobs = "https://127.0.0.1:" + std::to_string(web) + "/api/v1/jobs/guarded";
  std::vector<std::string> authed = s.client;
  authed.insert(authed.end(), {"-u", "prometheus:" + kPassword});
  auto job_doc = [&](const std::string& name) {
    Curl c = Fetch(h, name, jobs, authed);
    REQUIRE(c.code == 200);
    return nlohmann::json::parse(c.body);
  };
  const nlohmann::json before = job_doc("before");
  CHECK(before["state"] == "running");
  CHECK(before["round"] == 0);
  // The job is unaffected: its workers keep stepping, ddprun status over
  // mutual TLS answers, its state stays right. How fast is not the question
  // (bench/ measures speed): a worker's next step may take seconds on a busy
  // machine, and status's connection waits behind the flood's in ddprund's
  // accept queue, so both get deadlines well above their quiet-machine times
  // (a step every 50 ms; status in tens of ms).
  auto unaffected = [&](const std::string& when) {
    INFO(when);
    const long a = Steps(dir, 0);
    long b = a;
    for (const auto s0 = Clock::now(); b <= a && SecondsSince(s0) < 10; b = Steps(dir, 0)) {
      SleepMs(20);
    }
    Proc& st = h.StartDdprun("status-" + when,
                             {"status", "--rdzv_endpoint", ep, "--rdzv_id", "guarded", "--timeout",
                              "20", tls_flags[0], tls_flags[1], tls_flags[2]});
    const int rc = h.Wait(st, 30);
    // On a failure, what the job and the daemon said by then (an agent that
    // lost the rendezvous names why, e.g. its keepalive watchdog).
    INFO("job's stderr:\n" << job.Err() << "ddprund's stderr:\n" << d->Err());
    CHECK(b > a);
    CHECK(rc == 0);
    CHECK_THAT(st.Out(), Catch::Contains("running"));
  };

  const double attack_start = SecondsSince(t0);
  SECTION("10,000 connections at once, garbage and silence, on each port") {
    for (const auto& [name, port] : std::vector<std::pair<std::string, int>>{
             {"monitoring", web}, {"grpc", grpc}, {"tcpstore", store}}) {
      std::vector<int> fds = Flood(port, kFloodConnections);
      unaffected(name + "-flooded");
      if (name != "monitoring") {
        // The monitoring port itself is full (128 connections) until they go.
        CHECK(job_doc(name + "-during")["state"] == "running");
      }
      CloseAll(fds);
    }
    // The TCPStore still serves a torch client.
    auto client = rendezvous::C10dStoreClient::Connect("127.0.0.1", store, 10.0);
    REQUIRE(client.ok());
    REQUIRE((*client)->Set("stranger-test", "v").ok());
    auto got = (*client)->Get("stranger-test", 5.0);
    REQUIRE(got.ok());
    CHECK(*got == "v");
  }
  SECTION("a client that connects and never speaks, and a slow one, are dropped in bounded time") {
    const int silent = Connect(web, false);
    CHECK(ClosedWithin(silent, 15));  // the 10 s handshake deadline
    ::close(silent);
    // A slow client: one byte of a ClientHello every 500 ms.
    const int slow = Connect(web, false);
    const std::string hello = "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03";
    const auto s0 = Clock::now();
    bool closed = false;
    for (std::size_t i = 0; SecondsSince(s0) < 15 && !closed; ++i) {
      (void)!::send(slow, hello.data() + (i % hello.size()), 1, MSG_NOSIGNAL);
      closed = ClosedWithin(slow, 0.5);
    }
    CHECK(closed);
    CHECK(SecondsSince(s0) < 13);
    ::close(slow);
    // The same on the gRPC port: its handshake has a 10 s deadline too
    // (gRPC's own default is 120 s).
    const int silent_grpc = Connect(grpc, false);
    CHECK(ClosedWithin(silent_grpc, 15));
    ::close(silent_grpc);
    unaffected("silent");
  }
  SECTION("foreign and missing certificates on the gRPC port are refused") {
    Proc& nocert =
        h.StartDdprun("nocert", {"status", "--rdzv_endpoint", ep, "--tls_ca", s.certs.ca});
    CHECK(h.Wait(nocert, 20) != 0);
    Proc& foreign = h.StartDdprun(
        "foreign", {"status", "--rdzv_endpoint", ep, "--tls_ca", s.certs.ca, "--tls_cert",
                    s.certs.stranger_cert, "--tls_key", s.certs.stranger_key});
    CHECK(h.Wait(foreign, 20) != 0);
    Proc& plain = h.StartDdprun("plain", {"status", "--rdzv_endpoint", ep});
    CHECK(h.Wait(plain, 20) != 0);
    for (Proc* p : {&nocert, &foreign, &plain}) {
      INFO(p->name << ": " << p->Err());
      CHECK(Lines(p->Err()).size() == 1);
      CHECK(p->Err().find("BEGIN") == std::string::npos);  // no key material
    }
    unaffected("refused");
  }
  const double attack_s = SecondsSince(t0) - attack_start;
  // After the strangers: the job's state is what it was.
  const nlohmann::json after = job_doc("after");
  CHECK(after["state"] == "running");
  CHECK(after["round"] == before["round"]);
  CHECK(after["restart_count"] == 0);
  std::ofstream(dir + "/stop") << "";
  CHECK(h.Wait(job, 30) == 0);
  h.StopDaemon(*d);
  // At most one line per kind per second, and never a secret.
  std::map<std::string, int> per_kind;
  for (const std::string& l : Lines(d->Err())) {
    const auto at = l.find("monitoring port: ");
    if (at == std::string::npos) continue;
    per_kind[l.substr(at, 40)]++;
  }
  for (const auto& [kind, n] : per_kind) {
    INFO(kind << ": " << n << " lines in " << attack_s << " s");
    CHECK(n <= static_cast<int>(attack_s) + 2);
  }
  CHECK(d->Err().find(kPassword) == std::string::npos);
  CHECK(d->Err().find("BEGIN") == std::string::npos);
  RemoveTestCerts(s.certs);
}

}  // namespace
}  // namespace ddprun::test
