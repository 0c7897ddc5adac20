// --ckpt_shm_limit (docs/checkpoint.md): the byte-size parser, the knob's
// default from the table, and the same message for a bad value from the
// flag and from PET_CKPT_SHM_LIMIT.
#include <catch2/catch.hpp>
#include <string>

#include "ddprun/launcher/cli.h"
#include "ddprun/launcher/value_parsers.h"

namespace ddprun::launcher {
namespace {

TEST_CASE("byte sizes: binary units, with or without iB/B; bad text is named", "[unit]") {
  CHECK(*ParseBytes("0") == 0);
  CHECK(*ParseBytes("512") == 512);
  CHECK(*ParseBytes("64KiB") == 64u << 10);
  CHECK(*ParseBytes("64k") == 64u << 10);
  CHECK(*ParseBytes("1.5GiB") == 3ull << 29);
  CHECK(*ParseBytes("16G") == 16ull << 30);
  CHECK(*ParseBytes("2TB") == 2ull << 40);
  CHECK(*ParseBytes("100B") == 100);
  for (const char* bad : {"", "GiB", "-1", "many", "1XiB", "nan", "inf", "2000TiB"}) {
    INFO(bad);
    auto v = ParseBytes(bad);
    REQUIRE_FALSE(v.ok());
    CHECK(std::string(v.status().message()) ==
          std::string("must be a number of bytes such as 512MiB, 16GiB or 0, got '") + bad + "'");
  }
}

TEST_CASE("--ckpt_shm_limit: 16GiB by default, 0 turns it off, flag and PET_ agree", "[unit]") {
  const Env env = {{"PATH", "/usr/bin:/bin"}};
  HostFacts host;
  host.cpu_count = 4;
  auto p = ParseCommandLine({"ddprun", "/bin/true"}, env, host);
  REQUIRE(p.ok());
  CHECK(p->options.ckpt_shm_limit == 16ull << 30);
  p = ParseCommandLine({"ddprun", "--ckpt_shm_limit=0", "/bin/true"}, env, host);
  REQUIRE(p.ok());
  CHECK(p->options.ckpt_shm_limit == 0);
  Env pet = env;
  pet["PET_CKPT_SHM_LIMIT"] = "256MiB";
  p = ParseCommandLine({"ddprun", "/bin/true"}, pet, host);
  REQUIRE(p.ok());
  CHECK(p->options.ckpt_shm_limit == 256u << 20);

  auto flag = ParseCommandLine({"ddprun", "--ckpt_shm_limit=lots", "/bin/true"}, env, host);
  REQUIRE_FALSE(flag.ok());
  CHECK(std::string(flag.status().message()) ==
        "ddprun: --ckpt_shm_limit must be a number of bytes such as 512MiB, 16GiB or 0, got "
        "'lots'");
  pet["PET_CKPT_SHM_LIMIT"] = "lots";
  auto var = ParseCommandLine({"ddprun", "/bin/true"}, pet, host);
  REQUIRE_FALSE(var.ok());
  CHECK(std::string(var.status().message()) ==
        "ddprun: PET_CKPT_SHM_LIMIT (--ckpt_shm_limit) must be a number of bytes such as 512MiB, "
        "16GiB or 0, got 'lots'");
}

}  // namespace
}  // namespace ddprun::launcher
