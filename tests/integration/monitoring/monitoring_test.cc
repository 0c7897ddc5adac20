// Monitoring end to end on one machine: a real rendezvous server (gRPC and
// the monitoring HTTP port on loopback), simulated agents (SimulatedJob)
// sending MetricsReports over gRPC, and the real consumers: the JSON API,
// `promtool check metrics`, a real Prometheus scraping /metrics, headless
// Chromium rendering the dashboard, `ddprun top --once`. Bad input: garbage
// reports, a non-HTTP client, unknown jobs, a port in use.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <mutex>
#include <regex>
#include <thread>

#include "ddprun/rendezvous/client.h"
#include "ddprun/rendezvous/common/errors.h"
#include "ddprun/rendezvous/daemon/server.h"
#include "nlohmann/json.hpp"
#include "support/http_get.h"
#include "support/process_helpers.h"
#include "support/simulated_job.h"
#include "support/skip.h"

namespace ddprun {
namespace {

using namespace std::chrono_literals;
using rendezvous::MetricsReport;
using rendezvous::RankSample;
using test::Http;
using test::SkipCase;
namespace th = ddprun::test;

bool Installed(const std::string& program) {
  return std::system(("command -v " + program + " > /dev/null 2>&1").c_str()) == 0;
}

// A server with its monitoring port, and a 2-node x 2-rank job whose agents
// report every 200 ms; rank 3 takes 50 % longer per step (a straggler).
struct LiveJob {
  explicit LiveJob(double hang_timeout_s = 0) {
    rendezvous::ServerOptions so;
    so.host = "127.0.0.1";
    so.port = 0;
    so.dashboard_port = 0;
    auto s = rendezvous::RendezvousServer::Start(so);
    REQUIRE(s.ok());
    server = std::move(*s);
    testing::SimulatedJobOptions jo;
    jo.job_id = "sim";
    jo.nodes = 2;
    jo.nproc = 2;
    jo.policy.hang_timeout_s = hang_timeout_s;
    job = std::make_unique<testing::SimulatedJob>("127.0.0.1", server->port(), jo);
    REQUIRE(job->Connect().ok());
    auto a = job->FormRound();
    REQUIRE(a.ok());
    assignments = *a;
    reporter = std::thread([this] { Run(); });
  }
  ~LiveJob() {
    stop = true;
    reporter.join();
    job.reset();
    server->Shutdown();
  }

  MetricsReport Report(int n) {
    const auto& as = assignments[n];
    MetricsReport r;
    r.job_id = "sim";
    r.node_id = as.node_id;
    r.round = as.round;
    r.host = job->Spec(n).host;
    r.unix_s =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    for (int l = 0; l < 2; ++l) {
      RankSample s;
      s.rank = as.base_rank + l;
      s.local_rank = l;
      s.pid = 4000 + s.rank;
      s.state = "running";
      s.has_progress_source = true;
      s.steps = steps;
      if (!frozen) s.step_seconds = {s.rank == 3 ? 0.15 : 0.1, s.rank == 3 ? 0.15 : 0.1};
      s.samples_total = 64.0 * static_cast<double>(steps);
      s.cpu_percent = 90 + s.rank;
      s.rss_bytes = (512 + 16 * s.rank) << 20;
      s.scalars["loss"] = 2.5 - 0.001 * static_cast<double>(steps);
      r.ranks.push_back(s);
    }
    return r;
  }

  void Run() {
    while (!stop) {
      if (!frozen) steps += 2;
      for (int n = 0; n < 2; ++n) {
        auto reply = job->ClientOf(n).ReportMetrics(Report(n), 5s);
        std::lock_guard<std::mutex> lock(mu);
        if (!reply.ok()) {
          errors.push_back(std::string(reply.status().message()));
        } else if (!reply->hang_report.empty()) {
          hang_reports.push_back(reply->hang_report);
        }
      }
      std::this_thread::sleep_for(200ms);
    }
  }

  std::string token() const { return assignments[0].store_token; }

  std::unique_ptr<rendezvous::RendezvousServer> server;
  std::unique_ptr<testing::SimulatedJob> job;
  std::vector<rendezvous::Assignment> assignments;
  std::thread reporter;
  std::atomic<bool> stop{false};
  std::atomic<bool> frozen{false};
  std::atomic<std::int64_t> steps{0};
  std::mutex mu;
  std::vector<std::string> errors, hang_reports;
};

nlohmann::json JobDoc(int port) {
  auto [code, body] = Http(port, "/api/v1/jobs/sim");
  REQUIRE(code == 200);
  return nlohmann::json::parse(body);
}

// Waits until rank 3 is marked a straggler (within a few seconds of reports).
void WaitForStraggler(LiveJob& live) {
  const auto t0 = th::Clock::now();
  while (th::SecondsSince(t0) < 20) {
    auto j = JobDoc(live.server->dashboard_port());
    if (j["ranks"][3]["straggler"] == true) return;
    th::SleepMs(200);
  }
  FAIL("rank 3 never marked as a straggler");
}

TEST_CASE("reports over gRPC show in GetMetrics, the JSON API and /metrics, never the token",
          "[monitoring]") {
  LiveJob live;
  WaitForStraggler(live);
  const int port = live.server->dashboard_port();
  auto j = JobDoc(port);
  CHECK(j["state"] == "running");
  CHECK(j["world_size"] == 4);
  REQUIRE(j["ranks"].size() == 4);
  for (int r = 0; r < 4; ++r) {
    CHECK(j["ranks"][r]["rank"] == r);
    CHECK(j["ranks"][r]["steps"].get<int>() > 0);
    CHECK(j["ranks"][r]["scalars"].contains("loss"));
    CHECK(j["ranks"][r]["straggler"] == (r == 3));
  }
  CHECK(j["ranks"][3]["straggler_gap_s"].get<double>() == Approx(0.05));
  CHECK(j["samples_per_s"].get<double>() > 0);
  CHECK(j["data_age_s"].get<double>() < 5);  // reports every 0.2 s; slack for a loaded CI
  // GetMetrics is the same document.
  auto doc = live.job->ClientOf(0).GetMetrics("sim", 5s);
  REQUIRE(doc.ok());
  CHECK(nlohmann::json::parse(*doc)["job_id"] == "sim");
  CHECK(absl::IsNotFound(live.job->ClientOf(0).GetMetrics("nope", 5s).status()));
  // The listing, /metrics, errors.
  auto [lc, list] = Http(port, "/api/v1/jobs");
  CHECK(lc == 200);
  CHECK(nlohmann::json::parse(list)["jobs"][0]["job_id"] == "sim");
  auto [mc, metrics] = Http(port, "/metrics");
  CHECK(mc == 200);
  CHECK_THAT(metrics,
             Catch::Contains("ddprun_rank_straggler{job=\"sim\",node=\"" +
                             live.assignments[1].node_id + "\",rank=\"3\",round=\"0\"} 1"));
  auto [nc, nbody] = Http(port, "/api/v1/jobs/nope");
  CHECK(nc == 404);
  CHECK_THAT(nlohmann::json::parse(nbody)["error"].get<std::string>(),
             Catch::Contains("no such job"));
  CHECK(Http(port, "/nope").first == 404);
  CHECK(Http(port, "/metrics", "POST").first == 405);
  CHECK(Http(port, "/api/v1/jobs/sim", "DELETE").first == 405);
  auto [pc, page] = Http(port, "/");
  CHECK(pc == 200);
  CHECK_THAT(page, Catch::Contains("<svg"));
  CHECK_THAT(page, !Catch::Contains("http://") && !Catch::Contains("https://"));  // no CDN
  // The store token is nowhere.
  REQUIRE(!live.token().empty());
  for (const std::string& body : {page, metrics, list, JobDoc(port).dump(), *doc}) {
    CHECK(body.find(live.token()) == std::string::npos);
  }
  std::lock_guard<std::mutex> lock(live.mu);
  CHECK(live.errors.empty());
}

TEST_CASE("garbage reports are refused or clamped, and the server keeps serving", "[monitoring]") {
  LiveJob live;
  auto& client = live.job->ClientOf(0);
  MetricsReport r = live.Report(0);
  r.job_id = "nosuchjob";
  auto st = client.ReportMetrics(r, 5s).status();
  CHECK(rendezvous::KindOf(st) == rendezvous::ErrorKind::kState);
  r = live.Report(0);
  r.round = 42;
  CHECK(rendezvous::KindOf(client.ReportMetrics(r, 5s).status()) == rendezvous::ErrorKind::kState);
  r = live.Report(0);
  r.node_id = "someone:else";
  CHECK(rendezvous::KindOf(client.ReportMetrics(r, 5s).status()) == rendezvous::ErrorKind::kState);
  r = live.Report(0);
  r.ranks[0].steps = -5;
  r.ranks[0].cpu_percent = std::nan("");
  r.ranks[0].step_seconds.assign(10000, -1);
  for (int i = 0; i < 5000; ++i) r.ranks[0].scalars["s" + std::to_string(i)] = i;
  r.ranks[0].scalars[std::string(100000, 'x')] = 1;
  r.ranks[0].scalars["bad\"name\n"] = 1;
  r.events.assign(100, std::string(10000, 'e'));
  REQUIRE(client.ReportMetrics(r, 5s).ok());
  auto j = JobDoc(live.server->dashboard_port());
  CHECK(j["ranks"][0]["scalars"].size() <= 256);
  CHECK(j["ranks"][0]["scalars_dropped"].get<int>() > 4000);
  auto [mc, metrics] = Http(live.server->dashboard_port(), "/metrics");
  CHECK(mc == 200);
  CHECK(metrics.find("bad\"name") == std::string::npos);
}

TEST_CASE("a non-HTTP client is disconnected; the port keeps serving", "[monitoring]") {
  LiveJob live;
  const int port = live.server->dashboard_port();
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  const std::string junk = std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11) +
                           std::string(20000, '\xff') + "\r\n\r\n";
  (void)::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
  pollfd p{fd, POLLIN, 0};
  REQUIRE(::poll(&p, 1, 5000) == 1);
  char buf[256];
  CHECK(::recv(fd, buf, sizeof buf, 0) <= 0);  // closed, nothing sent
  ::close(fd);
  CHECK(Http(port, "/api/v1/jobs").first == 200);
}

TEST_CASE("the dashboard port in use is a one-line error naming the flag", "[monitoring]") {
  LiveJob live;
  rendezvous::ServerOptions so;
  so.host = "127.0.0.1";
  so.port = 0;
  so.dashboard_port = live.server->dashboard_port();
  auto s = rendezvous::RendezvousServer::Start(so);
  REQUIRE(!s.ok());
  const std::string msg(s.status().message());
  CHECK(rendezvous::KindOf(s.status()) == rendezvous::ErrorKind::kBadInput);
  CHECK_THAT(msg, Catch::Contains("address already in use") && Catch::Contains("--dashboard_port"));
  CHECK(msg.find('\n') == std::string::npos);
}

TEST_CASE("promtool accepts /metrics", "[monitoring][prometheus]") {
  if (!Installed("promtool")) return SkipCase("integration", "promtool is not installed");
  LiveJob live;
  WaitForStraggler(live);
  th::Harness h;
  const std::string file = h.MakeDir("prom") + "/metrics.txt";
  { std::ofstream(file) << Http(live.server->dashboard_port(), "/metrics").second; }
  th::Proc& p = h.Start("promtool", {"/bin/sh", "-c", "promtool check metrics < " + file});
  REQUIRE(h.Wait(p, 60) == 0);
  INFO(p.Out() << p.Err());
  CHECK(p.Err().empty());
}

TEST_CASE("a real Prometheus scrapes /metrics", "[monitoring][prometheus]") {
  if (!Installed("prometheus")) return SkipCase("integration", "prometheus is not installed");
  LiveJob live;
  th::Harness h;
  const std::string dir = h.MakeDir("prometheus");
  const int web = th::FreePort();
  {
    std::ofstream(dir + "/prometheus.yml")
        << "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        << "scrape_configs:\n  - job_name: ddprun\n    honor_labels: true\n"
        << "    static_configs:\n      - targets: ['127.0.0.1:" << live.server->dashboard_port()
        << "']\n";
  }
  h.Start("prometheus", {"prometheus", "--config.file=" + dir + "/prometheus.yml",
                         "--storage.tsdb.path=" + dir + "/data",
                         "--web.listen-address=127.0.0.1:" + std::to_string(web)});
  const auto t0 = th::Clock::now();
  double seen = -1;
  while (th::SecondsSince(t0) < 40 && seen <= 0) {
    th::SleepMs(500);
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(web));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool up = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    ::close(fd);
    if (!up) continue;
    auto [code, body] = Http(
        web, "/api/v1/query?query=ddprun_rank_steps_total%7Bjob%3D%22sim%22%2Crank%3D%223%22%7D");
    if (code != 200) continue;
    auto j = nlohmann::json::parse(body, nullptr, false);
    if (j.is_discarded() || j["data"]["result"].empty()) continue;
    seen = std::stod(j["data"]["result"][0]["value"][1].get<std::string>());
  }
  CHECK(seen > 0);
}

// The steps column of each rank row in Chromium's DOM.
std::map<int, long> StepsInDom(const std::string& dom) {
  std::map<int, long> out;
  static const std::regex row(
      R"re(data-rank="(\d+)"><td>\d+</td>.*?<td class="steps">(\d+)</td>)re");
  for (auto it = std::sregex_iterator(dom.begin(), dom.end(), row); it != std::sregex_iterator();
       ++it) {
    out[std::stoi((*it)[1])] = std::stol((*it)[2]);
  }
  return out;
}

TEST_CASE("headless Chromium renders the dashboard and its numbers move",
          "[monitoring][chromium]") {
  if (!Installed("chromium")) return SkipCase("integration", "chromium is not installed");
  LiveJob live;
  WaitForStraggler(live);
  th::Harness h;
  const std::string profile = h.MakeDir("chromium");
  const std::string url = "http://127.0.0.1:" + std::to_string(live.server->dashboard_port()) + "/";
  auto dump = [&](const std::string& name) {
    th::Proc& p = h.Start(name, {"chromium", "--headless", "--no-sandbox", "--disable-gpu",
                                 "--no-first-run", "--user-data-dir=" + profile + "/" + name,
                                 "--virtual-time-budget=4000", "--dump-dom", url});
    REQUIRE(h.Wait(p, 90) == 0);
    return p.Out();
  };
  const std::string first = dump("dom1");
  auto a = StepsInDom(first);
  REQUIRE(a.size() == 4);
  CHECK_THAT(first, Catch::Contains("<tr class=\"straggler\" data-rank=\"3\">"));
  CHECK_THAT(first, Catch::Contains("<polyline"));
  th::SleepMs(1500);
  auto b = StepsInDom(dump("dom2"));
  REQUIRE(b.size() == 4);
  for (int r = 0; r < 4; ++r) CHECK(b[r] > a[r]);
}

TEST_CASE("ddprun top --once prints a row per rank; unknown jobs and no daemon are errors",
          "[monitoring]") {
  LiveJob live;
  WaitForStraggler(live);
  th::Harness h;
  const std::string ep = "127.0.0.1:" + std::to_string(live.server->port());
  th::Proc& p = h.Start("top", {th::Ddprun(), "top", "--rdzv_endpoint", ep, "--once"});
  REQUIRE(h.Wait(p, 30) == 0);
  const std::string out = p.Out();
  INFO(out << p.Err());
  CHECK_THAT(out, Catch::Contains("job sim  round 0  running  world 4"));
  CHECK_THAT(out, Catch::Contains("RANK"));
  int rows = 0, marked = 0;
  for (const auto& line : th::Lines(out)) {
    std::smatch m;
    if (std::regex_search(line, m, std::regex(R"(^\s+(\d) 127\.0\.0\.1|^\s+(\d) 10\.)"))) ++rows;
    if (line.find("* +0.05") != std::string::npos) ++marked;
  }
  CHECK(rows == 4);
  CHECK(marked == 1);
  th::Proc& u = h.Start("top_unknown",
                        {th::Ddprun(), "top", "--rdzv_endpoint", ep, "--job", "nope", "--once"});
  CHECK(h.Wait(u, 30) == 3);
  CHECK_THAT(u.Err(), Catch::Contains("no such job"));
  CHECK(th::Lines(u.Err()).size() == 1);
  th::Proc& n = h.Start(
      "top_nodaemon", {th::Ddprun(), "top", "--rdzv_endpoint",
                       "127.0.0.1:" + std::to_string(th::FreePort()), "--once", "--timeout", "1"});
  CHECK(h.Wait(n, 30) == 3);
  CHECK_THAT(n.Err(), Catch::Contains("cannot reach"));
}

TEST_CASE("a stalled job is reported as a hang to every agent within the timeout + 15 s",
          "[monitoring][hang]") {
  LiveJob live(/*hang_timeout_s=*/2);
  th::SleepMs(1000);
  live.frozen = true;
  const auto t0 = th::Clock::now();
  while (th::SecondsSince(t0) < 17) {
    {
      std::lock_guard<std::mutex> lock(live.mu);
      if (live.hang_reports.size() >= 2) break;
    }
    th::SleepMs(100);
  }
  std::lock_guard<std::mutex> lock(live.mu);
  REQUIRE(live.hang_reports.size() == 2);  // one per node, once
  CHECK_THAT(live.hang_reports[0], Catch::Contains("[job sim round 0] HANG"));
  CHECK_THAT(live.hang_reports[0], Catch::Contains("every rank stopped at step"));
  auto j = JobDoc(live.server->dashboard_port());
  CHECK(j["hang_state"] == "reported");
  CHECK(j["hangs"] == 1);
}

}  // namespace
}  // namespace ddprun
