// The value types and toolkit of the lowest layer: host:port, job ids, error
// kinds, the status macros and the debug channel's switch.
#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "ddprun/rendezvous/common/debug_log.h"
#include "ddprun/rendezvous/common/errors.h"
#include "ddprun/rendezvous/common/host_port.h"
#include "ddprun/rendezvous/common/job_id.h"
#include "ddprun/rendezvous/common/status_macros.h"

using namespace ddprun::rendezvous;

TEST_CASE("ParseHostPort: names, IPv4, bracketed and bare IPv6, defaults", "[unit]") {
  auto hp = ParseHostPort("node0:29400");
  REQUIRE(hp.ok());
  CHECK(*hp == HostPort{"node0", 29400});
  CHECK(*ParseHostPort("node0", {.default_port = 29400}) == HostPort{"node0", 29400});
  CHECK(*ParseHostPort("[fe80::1]:7", {}) == HostPort{"fe80::1", 7});
  CHECK(*ParseHostPort("[fe80::1]", {.default_port = 5}) == HostPort{"fe80::1", 5});
  CHECK(*ParseHostPort("fe80::1", {.default_port = 5}) == HostPort{"fe80::1", 5});
  CHECK(ParseHostPort("h:0", {.allow_zero_port = true})->port == 0);

  auto reason = [](std::string_view text, HostPortOptions o = {}) {
    auto r = ParseHostPort(text, o);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    return std::string(r.status().message());
  };
  CHECK(reason("node0") == "the port is required");
  CHECK(reason("node0:") == "the port is empty");
  CHECK(reason(":29400") == "the host is empty");
  CHECK(reason("") == "the host is empty");
  CHECK(reason("h:0") == "the port must be 1..65535");
  CHECK(reason("h:65536") == "the port must be 1..65535");
  CHECK(reason("h:12ab") == "the port must be 1..65535");
  CHECK(reason("h:-1") == "the port must be 1..65535");
  CHECK(reason("[fe80::1:5") == "an IPv6 address needs its closing ']'");
  CHECK(reason("[fe80::1]5") == "expected ':' after ']'");
  CHECK(reason("a b:5") == "the host has a space, '/' or bracket in it");
}

TEST_CASE("FormatHostPort brackets IPv6 and round-trips", "[unit]") {
  CHECK(FormatHostPort("node0", 29400) == "node0:29400");
  CHECK(FormatHostPort("::1", 80) == "[::1]:80");
  for (const HostPort& hp : {HostPort{"10.0.0.1", 1}, HostPort{"fe80::1", 65535}}) {
    CHECK(*ParseHostPort(FormatHostPort(hp)) == hp);
  }
}

TEST_CASE("ValidateJobId: one rule for every entry point", "[unit]") {
  for (const char* ok : {"job1", "train-42", "a.b_c:d@e+f", "0", "x"}) {
    INFO(ok);
    CHECK(ValidateJobId(ok).ok());
  }
  CHECK(ValidateJobId(std::string(256, 'a')).ok());
  CHECK_FALSE(ValidateJobId(std::string(257, 'a')).ok());
  for (const char* bad : {"", "a b", "a/b", "-x", ".", "..", "a\nb", "tab\t", "\xc3\xa9"}) {
    INFO(bad);
    auto st = ValidateJobId(bad);
    REQUIRE_FALSE(st.ok());
    CHECK(st.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(st.message()).find("use 1-256 letters") != std::string::npos);
  }
  CHECK(std::string(ValidateJobId("a b").message()).find("contains a space") != std::string::npos);
  const std::string id = RandomJobId();
  CHECK(id.size() == 36);
  CHECK(ValidateJobId(id).ok());
  CHECK(RandomJobId() != id);
}

TEST_CASE("KindOf decides on codes and the closed payload, not on text", "[unit]") {
  CHECK(KindOf(absl::OkStatus()) == ErrorKind::kOk);
  CHECK(KindOf(ClosedError("x")) == ErrorKind::kClosed);
  CHECK(KindOf(absl::FailedPreconditionError("the job is closed")) == ErrorKind::kState);
  CHECK(KindOf(absl::DeadlineExceededError("")) == ErrorKind::kTimeout);
  CHECK(KindOf(absl::UnavailableError("")) == ErrorKind::kConnection);
  CHECK(KindOf(absl::PermissionDeniedError("")) == ErrorKind::kAuth);
  CHECK(KindOf(absl::UnauthenticatedError("")) == ErrorKind::kAuth);
  CHECK(KindOf(absl::AlreadyExistsError("")) == ErrorKind::kBadInput);
  CHECK(KindOf(absl::InternalError("")) == ErrorKind::kInternal);
  CHECK(std::string(ErrorKindName(ErrorKind::kClosed)) == "closed");
}

namespace {

absl::StatusOr<int> Half(int v) {
  if (v % 2 != 0) return absl::InvalidArgumentError("odd");
  return v / 2;
}

absl::StatusOr<int> Quarter(int v) {
  DDPRUN_ASSIGN_OR_RETURN(int h, Half(v));
  DDPRUN_ASSIGN_OR_RETURN(const int q, Half(h));
  return q;
}

absl::Status Check(int v) {
  DDPRUN_RETURN_IF_ERROR(Half(v));  // a StatusOr
  DDPRUN_RETURN_IF_ERROR(v > 100 ? absl::OutOfRangeError("big") : absl::OkStatus());
  return absl::OkStatus();
}

}  // namespace

TEST_CASE("DDPRUN_ASSIGN_OR_RETURN and DDPRUN_RETURN_IF_ERROR", "[unit]") {
  CHECK(*Quarter(8) == 2);
  CHECK(Quarter(6).status().message() == "odd");
  CHECK(Quarter(3).status().message() == "odd");
  CHECK(Check(4).ok());
  CHECK(Check(3).message() == "odd");
  CHECK(Check(102).code() == absl::StatusCode::kOutOfRange);
  DDPRUN_CHECK(1 + 1 == 2) << "never printed";
}

TEST_CASE("DDPRUN_DEBUG subsystems parse; a disabled line is not formatted", "[unit]") {
  using namespace ddprun::debug;
  CHECK(ParseSubsystems("rdzv,store") == (kRdzv | kStore));
  CHECK(ParseSubsystems("all") == (kRdzv | kAgent | kStore | kSdk));
  CHECK(ParseSubsystems("") == 0u);
  CHECK(ParseSubsystems(nullptr) == 0u);
  CHECK(ParseSubsystems("bogus,agent") == kAgent);
  // torchrun's LOGLEVEL: DEBUG opens the launcher's channels; DDPRUN_DEBUG wins.
  CHECK(InitialMask(nullptr, "DEBUG") == (kRdzv | kAgent | kStore));
  CHECK(InitialMask(nullptr, "debug") == (kRdzv | kAgent | kStore));
  CHECK(InitialMask(nullptr, "INFO") == 0u);
  CHECK(InitialMask(nullptr, nullptr) == 0u);
  CHECK(InitialMask("sdk", "DEBUG") == kSdk);
  CHECK(InitialMask("", "DEBUG") == 0u);
  SetEnabledForTest(0);
  int evaluated = 0;
  auto touch = [&] { return ++evaluated; };
  DDPRUN_DEBUG_LOG(kAgent) << touch();
  CHECK(evaluated == 0);
  SetEnabledForTest(kAgent);
  DDPRUN_DEBUG_LOG(kAgent) << "debug channel test line " << touch();
  CHECK(evaluated == 1);
  SetEnabledForTest(0);
}

TEST_CASE("ParseHostPortList: replicas and etcd members, each entry checked", "[unit]") {
  auto list = ParseHostPortList("d1:29400,d2,[::1]:2379", {.default_port = 29400});
  REQUIRE(list.ok());
  CHECK(*list == std::vector<HostPort>{{"d1", 29400}, {"d2", 29400}, {"::1", 2379}});
  CHECK(ParseHostPortList("d1:1").value() == std::vector<HostPort>{{"d1", 1}});
  auto empty = ParseHostPortList("d1:1,,d2:2");
  REQUIRE_FALSE(empty.ok());
  CHECK(empty.status().message() == "entry 2 (''): is empty");
  auto twice = ParseHostPortList("d1:1,d1:1");
  REQUIRE_FALSE(twice.ok());
  CHECK(twice.status().message() == "entry 2 ('d1:1'): is listed twice");
  auto bad = ParseHostPortList("d1:1,d2:x");
  REQUIRE_FALSE(bad.ok());
  CHECK(absl::StartsWith(bad.status().message(), "entry 2 ('d2:x'): "));
}
