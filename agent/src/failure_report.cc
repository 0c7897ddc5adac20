#include "ddprun/agent/failure_report.h"

#include <algorithm>
#include <cctype>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ddprun::agent {
namespace {

std::string FormatTime(double epoch) {
  std::time_t t = static_cast<std::time_t>(epoch);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d_%H:%M:%S", &tm);
  return buf;
}

}  // namespace

std::optional<std::string> ParseErrorFileMessage(absl::string_view text) {
  const nlohmann::json top =
      nlohmann::json::parse(text.begin(), text.end(), /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (!top.is_object()) return std::nullopt;
  auto it = top.find("message");
  if (it == top.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_object()) return std::nullopt;
  auto inner = it->find("message");
  if (inner == it->end() || !inner->is_string()) return std::nullopt;
  return inner->get<std::string>();
}

std::string ReadErrorMessage(const std::string& path) {
  if (path.empty()) return "";
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  // Tracebacks in extraInfo can be long; the message comes first but JSON
  // needs the whole object, so read up to 1 MiB.
  std::string data(1 << 20, '\0');
  in.read(data.data(), static_cast<std::streamsize>(data.size()));
  data.resize(static_cast<std::size_t>(in.gcount()));
  if (auto msg = ParseErrorFileMessage(data)) return *msg;
  std::string raw = data.substr(0, 500);
  while (!raw.empty() && std::isspace(static_cast<unsigned char>(raw.back()))) raw.pop_back();
  return raw;
}

std::vector<rendezvous::WorkerFailure> CollectFailures(const WorkerGroup& group,
                                                       const std::string& host, std::int64_t round,
                                                       WorkerLogs& logs) {
  std::vector<const Worker*> failed;
  for (const Worker& w : group.workers())
    if (w.exit && !w.exit->ok() && !w.stopped_by_agent) failed.push_back(&w);
  std::stable_sort(failed.begin(), failed.end(),
                   [](const Worker* a, const Worker* b) { return a->exit_seen < b->exit_seen; });
  std::vector<rendezvous::WorkerFailure> out;
  for (const Worker* w : failed) {
    rendezvous::WorkerFailure f;
    f.host = host;
    f.global_rank = w->global_rank;
    f.local_rank = w->local_rank;
    f.exit_code = w->exit->exit_code;
    f.signal = w->exit->signal;
    f.pid = w->child ? w->child->pid() : 0;
    f.timestamp = w->exited_at;
    f.round = round;
    f.error_message = !w->spawn_error.empty() ? w->spawn_error : ReadErrorMessage(w->error_file);
    f.stderr_tail = logs.StderrTail(w->local_rank);
    f.log_file = logs.LogFile(w->local_rank);
    out.push_back(std::move(f));
  }
  return out;
}

std::string DescribeFailure(const rendezvous::WorkerFailure& f) {
  // A failure with neither an exit code nor a signal was not an exit: the
  // rendezvous named this rank in a hang report (metrics_hub.cc).
  if (f.exit_code == 0 && f.signal == 0) {
    return absl::StrCat("worker rank ", f.global_rank, " (local rank ", f.local_rank, ") on ",
                        f.host, " hung (it had not exited; see the hang report)");
  }
  ExitStatus s;
  s.exit_code = f.exit_code;
  s.signal = f.signal;
  return absl::StrCat("worker rank ", f.global_rank, " (local rank ", f.local_rank, ") on ", f.host,
                      " exited with ", s.Describe());
}

std::string FormatFailureDetails(const rendezvous::WorkerFailure& f) {
  std::string out;
  if (!f.error_message.empty()) {
    std::string msg = f.error_message.substr(0, 500);
    for (char& c : msg)
      if (c == '\n' || c == '\r') c = ' ';
    absl::StrAppend(&out, "ddprun:   error: ", msg, "\n");
  }
  if (!f.log_file.empty()) absl::StrAppend(&out, "ddprun:   log: ", f.log_file, "\n");
  if (!f.stderr_tail.empty()) {
    std::vector<std::string> lines = absl::StrSplit(f.stderr_tail, '\n');
    absl::StrAppend(&out, "ddprun:   stderr (last ", lines.size(),
                    lines.size() == 1 ? " line" : " lines", "):\n");
    for (const std::string& line : lines) absl::StrAppend(&out, "ddprun:   | ", line, "\n");
  }
  return out;
}

std::string FormatJobFailure(const std::string& job_id, const std::string& reason,
                             const std::vector<rendezvous::WorkerFailure>& failures) {
  const std::string head = absl::StrCat("ddprun: job ", job_id, " failed: ");
  std::string block = absl::StrCat(head, reason, "\n");
  for (std::size_t i = 0; i < failures.size(); ++i) {
    const rendezvous::WorkerFailure& f = failures[i];
    absl::StrAppend(&block, head, DescribeFailure(f), " (pid ", f.pid, ", round ", f.round,
                    f.timestamp > 0 ? absl::StrCat(", at ", FormatTime(f.timestamp)) : "",
                    i == 0 ? "; first failure" : "", ")\n");
    absl::StrAppend(&block, FormatFailureDetails(f));
  }
  return block;
}

std::string MissingModuleHint(const std::vector<rendezvous::WorkerFailure>& failures,
                              const std::string& python) {
  static constexpr std::string_view kMarker = "ModuleNotFoundError: No module named '";
  for (const rendezvous::WorkerFailure& f : failures) {
    for (const std::string* text : {&f.error_message, &f.stderr_tail}) {
      const std::size_t at = text->find(kMarker);
      if (at == std::string::npos) continue;
      const std::size_t start = at + kMarker.size();
      const std::size_t end = text->find('\'', start);
      if (end == std::string::npos) continue;
      const std::string module = text->substr(start, end - start);
      const std::string top = module.substr(0, module.find('.'));
      return absl::StrCat("ddprun:   the workers' Python (", python, ") cannot import '", module,
                          "'; set PYTHON_EXEC to an interpreter that has it (Debian's PyTorch: ",
                          "PYTHON_EXEC=/usr/bin/python3), or install ", top, " for ", python,
                          "; `ddprun check` tests this before a job starts\n");
    }
  }
  return "";
}

std::string LauncherErrorFileJson(const rendezvous::WorkerFailure& root,
                                  absl::string_view root_error_file) {
  const int code = root.signal != 0 ? -root.signal : root.exit_code;
  nlohmann::json doc = nlohmann::json::parse(root_error_file.begin(), root_error_file.end(),
                                             /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (doc.is_object() && doc.contains("message") && doc["message"].is_object()) {
    doc["message"]["errorCode"] = code;
    return doc.dump();
  }
  nlohmann::json out;
  out["message"]["message"] =
      root.error_message.empty() ? DescribeFailure(root) : root.error_message;
  out["message"]["extraInfo"]["py_callstack"] = root.stderr_tail;
  out["message"]["extraInfo"]["timestamp"] =
      std::to_string(static_cast<std::int64_t>(root.timestamp));
  out["message"]["errorCode"] = code;
  return out.dump();
}

}  // namespace ddprun::agent
