// The probe routes of the monitoring port (monitoring_routes.h): /healthz
// always 200, /readyz 200 or 503 with the daemon's state, as JSON.
#include "ddprun/rendezvous/monitoring/monitoring_routes.h"

#include <catch2/catch.hpp>

#include "ddprun/rendezvous/common/clock.h"
#include "nlohmann/json.hpp"

using namespace ddprun::rendezvous;

namespace {

struct Hub {
  FakeClock clock;
  MetricsHub hub{[this] {
    MetricsHubOptions o;
    o.clock = &clock;
    return o;
  }()};
};

}  // namespace

TEST_CASE("/healthz answers 200 ok whatever the readiness", "[unit][monitoring]") {
  Hub h;
  const HttpResponse r = ServeMonitoring(h.hub, "/healthz", [] {
    return Readiness{false, "etcd unreachable", "no lease"};
  });
  CHECK(r.status == 200);
  CHECK(r.body == "ok\n");
}

TEST_CASE("/readyz: 200 without a probe, 503 with the state and detail when not ready",
          "[unit][monitoring]") {
  Hub h;
  const HttpResponse serving = ServeMonitoring(h.hub, "/readyz");
  CHECK(serving.status == 200);
  CHECK(nlohmann::json::parse(serving.body) ==
        nlohmann::json{{"ready", true}, {"state", "serving"}, {"detail", ""}});

  const HttpResponse down = ServeMonitoring(h.hub, "/readyz", [] {
    return Readiness{false, "etcd unreachable", "this replica's etcd lease is not renewed"};
  });
  CHECK(down.status == 503);
  CHECK(down.content_type == "application/json");
  const auto doc = nlohmann::json::parse(down.body);
  CHECK(doc["ready"] == false);
  CHECK(doc["state"] == "etcd unreachable");
  CHECK(doc["detail"] == "this replica's etcd lease is not renewed");

  const HttpResponse standby = ServeMonitoring(h.hub, "/readyz", [] {
    return Readiness{true, "standby", "the leader is a:1"};
  });
  CHECK(standby.status == 200);
  CHECK(nlohmann::json::parse(standby.body)["state"] == "standby");
}

TEST_CASE("an unknown page's 404 names the probe routes", "[unit][monitoring]") {
  Hub h;
  const HttpResponse r = ServeMonitoring(h.hub, "/health");
  CHECK(r.status == 404);
  CHECK(r.body.find("/healthz") != std::string::npos);
  CHECK(r.body.find("/readyz") != std::string::npos);
}
