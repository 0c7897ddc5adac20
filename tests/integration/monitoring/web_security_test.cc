// The monitoring port secured the Prometheus way (docs/security.md), read
// by its real consumers: a stock Prometheus scraping it with tls_config
// (mutual TLS) and basic_auth, and headless Chromium rendering the dashboard
// over HTTPS with the test CA. A real rendezvous server, simulated agents
// reporting over gRPC.
#include <arpa/inet.h>
#include <crypt.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <fstream>
#include <regex>
#include <thread>

#include "ddprun/rendezvous/daemon/server.h"
#include "ddprun/rendezvous/monitoring/web_server.h"
#include "nlohmann/json.hpp"
#include "support/http_get.h"
#include "support/process_helpers.h"
#include "support/simulated_job.h"
#include "support/skip.h"
#include "support/tls_certs.h"

namespace ddprun {
namespace {

using namespace std::chrono_literals;
using test::SkipCase;
namespace th = ddprun::test;

bool Installed(const std::string& program) {
  return std::system(("command -v " + program + " > /dev/null 2>&1").c_str()) == 0;
}

bool PortOpen(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool up = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return up;
}

// Whether a plain-HTTP GET of /metrics gets an HTTP answer (a TLS port
// closes the connection instead).
bool PlainHttpAnswers(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  const std::string req = "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  REQUIRE(::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size()));
  std::string resp;
  char buf[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 10000) != 1) break;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    resp.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return resp.rfind("HTTP/1.1 ", 0) == 0;
}

std::string Bcrypt(const std::string& password) {
  char salt[CRYPT_GENSALT_OUTPUT_SIZE];
  REQUIRE(crypt_gensalt_rn("$2b$", 5, nullptr, 0, salt, sizeof(salt)) != nullptr);
  crypt_data data{};
  const char* h = crypt_rn(password.c_str(), salt, &data, sizeof(data));
  REQUIRE(h != nullptr);
  return h;
}

// A server whose monitoring port serves `security`, and a 1-node x 2-rank
// job whose agent reports every 200 ms.
struct SecuredJob {
  explicit SecuredJob(const rendezvous::WebSecurity& security) {
    rendezvous::ServerOptions so;
    so.host = "127.0.0.1";
    so.port = 0;
    so.dashboard_port = 0;
    so.dashboard_security = security;
    auto s = rendezvous::RendezvousServer::Start(so);
    REQUIRE(s.ok());
    server = std::move(*s);
    testing::SimulatedJobOptions jo;
    jo.job_id = "sim";
    jo.nodes = 1;
    jo.nproc = 2;
    job = std::make_unique<testing::SimulatedJob>("127.0.0.1", server->port(), jo);
    REQUIRE(job->Connect().ok());
    auto a = job->FormRound();
    REQUIRE(a.ok());
    assignment = (*a)[0];
    reporter = std::thread([this] { Run(); });
  }
  ~SecuredJob() {
    stop = true;
    reporter.join();
    job.reset();
    server->Shutdown();
  }

  void Run() {
    while (!stop) {
      steps += 2;
      rendezvous::MetricsReport r;
      r.job_id = "sim";
      r.node_id = assignment.node_id;
      r.round = assignment.round;
      r.host = job->Spec(0).host;
      r.unix_s = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
                     .count();
      for (int l = 0; l < 2; ++l) {
        rendezvous::RankSample s;
        s.rank = l;
        s.local_rank = l;
        s.pid = 4000 + l;
        s.state = "running";
        s.has_progress_source = true;
        s.steps = steps;
        s.step_seconds = {0.1, 0.1};
        r.ranks.push_back(s);
      }
      (void)job->ClientOf(0).ReportMetrics(r, 5s);
      std::this_thread::sleep_for(200ms);
    }
  }

  int port() const { return server->dashboard_port(); }

  std::unique_ptr<rendezvous::RendezvousServer> server;
  std::unique_ptr<testing::SimulatedJob> job;
  rendezvous::Assignment assignment;
  std::thread reporter;
  std::atomic<bool> stop{false};
  std::atomic<std::int64_t> steps{0};
};

// The test CA's server certificate, its key, and mutual TLS with the test CA.
rendezvous::WebSecurity Secured(const th::TestCerts& c, rendezvous::ClientAuth auth,
                                const std::string& user, const std::string& password) {
  rendezvous::WebConfig wc;
  wc.cert_file = c.server_cert;
  wc.key_file = c.server_key;
  if (auth != rendezvous::ClientAuth::kNone) wc.client_ca_file = c.ca;
  wc.client_auth = auth;
  wc.users[user] = Bcrypt(password);
  auto s = rendezvous::LoadWebSecurity(wc, "web.yml");
  INFO(s.status().message());
  REQUIRE(s.ok());
  return *s;
}

TEST_CASE("a stock Prometheus scrapes the port with tls_config and basic_auth",
          "[monitoring][prometheus][security]") {
  if (!Installed("prometheus")) return SkipCase("integration", "prometheus is not installed");
  if (!th::HaveOpenssl()) return SkipCase("integration", "openssl is not installed");
  th::TestCerts certs = th::MakeTestCerts();
  REQUIRE(certs.ok);
  SecuredJob live(
      Secured(certs, rendezvous::ClientAuth::kRequireAndVerify, "prometheus", "scrape-pw"));
  th::Harness h;
  const std::string dir = h.MakeDir("prometheus");
  const int web = th::FreePort();
  { std::ofstream(dir + "/password") << "scrape-pw\n"; }
  {
    std::ofstream(dir + "/prometheus.yml")
        << "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        << "scrape_configs:\n  - job_name: ddprun\n    honor_labels: true\n"
        << "    scheme: https\n"
        << "    tls_config:\n      ca_file: " << certs.ca
        << "\n      cert_file: " << certs.client_cert << "\n      key_file: " << certs.client_key
        << "\n"
        << "    basic_auth:\n      username: prometheus\n      password_file: " << dir
        << "/password\n"
        << "    static_configs:\n      - targets: ['127.0.0.1:" << live.port() << "']\n";
  }
  h.Start("prometheus", {"prometheus", "--config.file=" + dir + "/prometheus.yml",
                         "--storage.tsdb.path=" + dir + "/data",
                         "--web.listen-address=127.0.0.1:" + std::to_string(web)});
  const auto t0 = th::Clock::now();
  double seen = -1;
  std::string last;
  while (th::SecondsSince(t0) < 40 && seen <= 0) {
    th::SleepMs(500);
    if (!PortOpen(web)) continue;
    auto [code, body] = th::Http(
        web, "/api/v1/query?query=ddprun_rank_steps_total%7Bjob%3D%22sim%22%2Crank%3D%221%22%7D");
    last = body;
    if (code != 200) continue;
    auto j = nlohmann::json::parse(body, nullptr, false);
    if (j.is_discarded() || j["data"]["result"].empty()) continue;
    seen = std::stod(j["data"]["result"][0]["value"][1].get<std::string>());
  }
  INFO(last);
  CHECK(seen > 0);
  // The same port refuses Prometheus' own plain GET (no certificate, no
  // credentials): the scrape went through TLS and authentication.
  CHECK_FALSE(PlainHttpAnswers(live.port()));
  th::RemoveTestCerts(certs);
}

// The steps column of each rank row in Chromium's DOM.
std::map<int, long> StepsInDom(const std::string& dom) {
  std::map<int, long> out;
  static const std::regex row(
      R"re(data-rank="(\d+)"[^>]*><td>\d+</td>.*?<td class="steps">(\d+)</td>)re");
  for (auto it = std::sregex_iterator(dom.begin(), dom.end(), row); it != std::sregex_iterator();
       ++it) {
    out[std::stoi((*it)[1])] = std::stol((*it)[2]);
  }
  return out;
}

TEST_CASE("headless Chromium renders the dashboard over HTTPS with the test CA",
          "[monitoring][chromium][security]") {
  if (!Installed("chromium")) return SkipCase("integration", "chromium is not installed");
  if (!th::HaveOpenssl()) return SkipCase("integration", "openssl is not installed");
  th::TestCerts certs = th::MakeTestCerts();
  REQUIRE(certs.ok);
  SecuredJob live(Secured(certs, rendezvous::ClientAuth::kNone, "viewer", "view-pw"));
  th::Harness h;
  // Chromium trusts the test server's key by its SPKI hash (no system CA
  // store touched).
  const std::string spki_file = h.dir() + "/spki";
  REQUIRE(std::system(("openssl x509 -in " + certs.server_cert +
                       " -pubkey -noout | openssl pkey -pubin -outform der | openssl dgst "
                       "-sha256 -binary | base64 > " +
                       spki_file)
                          .c_str()) == 0);
  std::string spki = th::ReadFile(spki_file);
  while (!spki.empty() && (spki.back() == '\n' || spki.back() == '\r')) spki.pop_back();
  REQUIRE(spki.size() == 44);
  const std::string profile = h.MakeDir("chromium");
  auto dump = [&](const std::string& name, const std::string& url) {
    th::Proc& p = h.Start(name, {"chromium", "--headless", "--no-sandbox", "--disable-gpu",
                                 "--no-first-run", "--user-data-dir=" + profile + "/" + name,
                                 "--ignore-certificate-errors-spki-list=" + spki,
                                 "--virtual-time-budget=4000", "--dump-dom", url});
    REQUIRE(h.Wait(p, 90) == 0);
    return p.Out();
  };
  const std::string base = "127.0.0.1:" + std::to_string(live.port()) + "/";
  const std::string dom = dump("dom", "https://viewer:view-pw@" + base);
  INFO(dom.substr(0, 2000));
  auto steps = StepsInDom(dom);
  REQUIRE(steps.size() == 2);
  CHECK(steps[0] > 0);
  // Without credentials Chromium gets the 401 (headless, it cannot ask for
  // a password): no page, no job.
  const std::string refused = dump("refused", "https://" + base);
  CHECK(refused.find("ddprun dashboard") == std::string::npos);
  CHECK(refused.find("data-rank") == std::string::npos);
  th::RemoveTestCerts(certs);
}

}  // namespace
}  // namespace ddprun
