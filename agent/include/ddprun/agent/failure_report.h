// The job's failure report: what each failed worker left behind (its
// torchelastic error file, log file, stderr tail) and the block ddprun
// prints on stderr when a job fails, first failure first.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "ddprun/agent/worker_group.h"
#include "ddprun/agent/worker_logs.h"
#include "ddprun/rendezvous/common/types.h"

namespace ddprun::agent {

// The message of a torchelastic error file (@record):
//   {"message": {"message": "<Type>: <msg>", "extraInfo": {...}}}
// also {"message": "<msg>"}; nullopt when it is not such JSON.
std::optional<std::string> ParseErrorFileMessage(absl::string_view json);

// Reads the error file at `path`: its message, else its first 500 bytes as
// text, else "" (no file).
std::string ReadErrorMessage(const std::string& path);

// The workers of `group` that failed on their own (not those the agent
// stopped), earliest exit first, with their error file's message, stderr
// tail and log file from `logs`.
std::vector<rendezvous::WorkerFailure> CollectFailures(const WorkerGroup& group,
                                                       const std::string& host, std::int64_t round,
                                                       WorkerLogs& logs);

// "worker rank 3 (local rank 1) on node7 exited with exit code 1".
std::string DescribeFailure(const rendezvous::WorkerFailure& failure);

// The report lines after a failure's headline: the error file's message, the
// log file, and the stderr tail; each line starts with "ddprun:   ".
std::string FormatFailureDetails(const rendezvous::WorkerFailure& failure);

// When a failure's error message or stderr tail shows Python's
// "ModuleNotFoundError: No module named 'X'", one line that points at the
// workers' interpreter `python` (the worker command's argv[0]) and the fix
// (PYTHON_EXEC, or installing X for it), starting "ddprun:   "; else "".
std::string MissingModuleHint(const std::vector<rendezvous::WorkerFailure>& failures,
                              const std::string& python);

// The whole report, each headline "ddprun: job <id> failed: ...":
//   the reason, then per failure its description (pid, round, time; the
//   first one marked "first failure") and its details.
std::string FormatJobFailure(const std::string& job_id, const std::string& reason,
                             const std::vector<rendezvous::WorkerFailure>& failures);

// What torchrun leaves in its own TORCHELASTIC_ERROR_FILE (the file a
// scheduler such as TorchX reads) after a failed job: the root cause's error
// file, `root_error_file` (its text; "" when that worker wrote none or ran on
// another node), with message.errorCode set to its exit code (-signal for a
// signal), as torch's ErrorHandler.dump_error_file writes it. Without one:
//   {"message": {"message": "<the error message, or the failure's description>",
//                "extraInfo": {"py_callstack": "<stderr tail>", "timestamp": "<s>"},
//                "errorCode": N}}
std::string LauncherErrorFileJson(const rendezvous::WorkerFailure& root,
                                  absl::string_view root_error_file);

}  // namespace ddprun::agent
