#include "ddprun/rendezvous/monitoring/monitoring_routes.h"

#include "ddprun/rendezvous/monitoring/metrics_json.h"
#include "ddprun/rendezvous/monitoring/prometheus_text.h"
#include "nlohmann/json.hpp"

namespace ddprun::rendezvous {
namespace {

constexpr const char* kJson = "application/json";

int Hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// %XX decoded; nullopt for a malformed escape.
std::optional<std::string> Unescape(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    if (i + 2 >= s.size() || Hex(s[i + 1]) < 0 || Hex(s[i + 2]) < 0) return std::nullopt;
    out += static_cast<char>(Hex(s[i + 1]) * 16 + Hex(s[i + 2]));
    i += 2;
  }
  return out;
}

}  // namespace

HttpResponse ServeMonitoring(const MetricsHub& hub, const std::string& target,
                             const ReadinessProbe& readiness) {
  if (target == "/healthz") return {200, "text/plain; charset=utf-8", "ok\n"};
  if (target == "/readyz") {
    const Readiness r = readiness ? readiness() : Readiness{};
    nlohmann::ordered_json doc = {{"ready", r.ready}, {"state", r.state}, {"detail", r.detail}};
    return {r.ready ? 200 : 503, kJson, doc.dump() + "\n"};
  }
  if (target == "/" || target == "/index.html") {
    return {200, "text/html; charset=utf-8", kDashboardHtml};
  }
  if (target == "/metrics") {
    return {200, kPrometheusContentType, PrometheusText(hub.Views(false), hub.counters())};
  }
  if (target == "/api/v1/jobs" || target == "/api/v1/jobs/") {
    return {200, kJson, JobListJson(hub.Views(false)) + "\n"};
  }
  static const std::string kJobPrefix = "/api/v1/jobs/";
  if (target.rfind(kJobPrefix, 0) == 0) {
    auto id = Unescape(target.substr(kJobPrefix.size()));
    if (!id) return {400, kJson, ErrorJson("malformed %-escape in the job id") + "\n"};
    auto view = hub.View(*id);
    if (!view.ok()) return {404, kJson, ErrorJson(std::string(view.status().message())) + "\n"};
    return {200, kJson, JobViewJson(*view) + "\n"};
  }
  return {404, kJson,
          ErrorJson("no such page; try /, /api/v1/jobs, /api/v1/jobs/<job>, /metrics, /healthz "
                    "or /readyz") +
              "\n"};
}

}  // namespace ddprun::rendezvous
