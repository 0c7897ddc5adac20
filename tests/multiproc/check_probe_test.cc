// `ddprun check`'s real system probes (preflight_probe.h) against this
// machine: sockets on loopback, a child interpreter with a deadline, files.
// The checks' logic is unit-tested over fake probes; this is the seam's other
// side.
#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "ddprun/launcher/check/preflight_probe.h"
#include "support/process_helpers.h"

using namespace ddprun::test;
using ddprun::launcher::preflight::Interface;
using ddprun::launcher::preflight::MakeSystemProbe;
using ddprun::launcher::preflight::Millis;

TEST_CASE("check probes: sockets, names and files on this machine", "[multiproc]") {
  auto probe = MakeSystemProbe();
  Harness h;

  SECTION("connect: a listener answers, a closed port is refused at once") {
    auto listener = probe->Listen();
    REQUIRE(listener.ok());
    CHECK(probe->Connect("127.0.0.1", (*listener)->Port(), Millis(2000)).ok());
    CHECK(probe->Connect("localhost", (*listener)->Port(), Millis(2000)).ok());
    const auto t0 = Clock::now();
    const absl::Status refused = probe->Connect("127.0.0.1", FreePort(), Millis(2000));
    CHECK(absl::IsUnavailable(refused));
    CHECK(refused.message() == "Connection refused");
    CHECK(SecondsSince(t0) < 1.0);
  }
  SECTION("names") {
    CHECK(probe->Resolve("localhost").ok());
    CHECK_FALSE(probe->Resolve("no-such-host.invalid").ok());
  }
  SECTION("SHA-256 of the script") {
    const std::string path = h.dir() + "/abc.py";
    std::ofstream(path) << "abc";
    auto sum = probe->FileSha256(path);
    REQUIRE(sum.ok());
    CHECK(*sum == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    CHECK(absl::IsNotFound(probe->FileSha256(h.dir() + "/missing.py").status()));
  }
  SECTION("interfaces, limits, /dev/shm") {
    const std::vector<Interface> ifs = probe->Interfaces();
    CHECK(std::any_of(ifs.begin(), ifs.end(),
                      [](const Interface& i) { return i.name == "lo" && i.up && i.has_address; }));
    rlimit r{};
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &r) == 0);
    const auto limits = probe->ResourceLimits();
    CHECK((r.rlim_cur == RLIM_INFINITY ? limits.nofile_soft == -1
                                       : limits.nofile_soft == static_cast<long>(r.rlim_cur)));
    CHECK(probe->Shm().total > 0);
  }
}

TEST_CASE("check probes: the Python probe has a deadline", "[multiproc]") {
  auto probe = MakeSystemProbe();
  Harness h;
  SECTION("an interpreter that hangs is killed at the deadline") {
    const std::string fake = h.dir() + "/python3";
    std::ofstream(fake) << "#!/bin/sh\nexec sleep 30\n";
    ::chmod(fake.c_str(), 0755);
    const auto t0 = Clock::now();
    const auto v = probe->Python(fake, Millis(300));
    CHECK(SecondsSince(t0) < 3.0);
    CHECK(v.error.find("did not answer within") != std::string::npos);
  }
  SECTION("a missing interpreter") {
    const auto v = probe->Python(h.dir() + "/no-python3", Millis(5000));
    CHECK(v.error.find("cannot run") != std::string::npos);
  }
  SECTION("the real one prints its version") {
    const auto v = probe->Python("/usr/bin/python3", Millis(30000));
    INFO(v.error);
    CHECK(v.error.empty());
    CHECK(v.python.rfind("3.", 0) == 0);
  }
}
