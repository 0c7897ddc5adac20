// The metrics channel (metrics_channel.h): what a writer puts in, the reader
// gets out; garbage, truncation, counters going backwards, thousands of
// scalars and long names never crash the reader or pass through it. The
// channel is a memfd, as the agent makes it (no socket, no process).
#include "ddprun/rendezvous/monitoring/metrics_channel.h"

#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <string>

namespace ddprun::rendezvous {
namespace {

// A channel file as the agent creates it; path() is what the worker opens.
struct Channel {
  Channel() {
    fd = ::memfd_create("test-channel", MFD_CLOEXEC);
    REQUIRE(fd >= 0);
    const std::string init = InitialChannelBytes();
    REQUIRE(::pwrite(fd, init.data(), init.size(), 0) == static_cast<ssize_t>(init.size()));
  }
  ~Channel() { ::close(fd); }
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd); }
  void Poke(std::size_t off, const void* bytes, std::size_t n) const {
    REQUIRE(::pwrite(fd, bytes, n, static_cast<off_t>(off)) == static_cast<ssize_t>(n));
  }
  int fd = -1;
};

TEST_CASE("a writer's steps, samples, collectives and scalars reach the reader", "[channel]") {
  Channel ch;
  auto writer = ChannelWriter::Open(ch.path());
  REQUIRE(writer.ok());
  ChannelReader reader(ch.fd);
  auto empty = reader.Read();
  REQUIRE(empty.ok());
  CHECK(empty->steps == 0);
  CHECK(empty->samples_total < 0);
  CHECK(empty->flags == 0);

  (*writer)->Step(32, std::nan(""));  // the first step has no start
  (*writer)->Step(32, 0.25);
  (*writer)->Step(32, 0.5);
  (*writer)->CollectiveStart("allreduce");
  (*writer)->CollectiveEnd("allreduce", 4096, 0.001, 3.5);
  (*writer)->CollectiveStart("broadcast");
  CHECK((*writer)->Scalar("loss", 0.75));
  CHECK((*writer)->Scalar("lr", 1e-3));
  CHECK((*writer)->Scalar("loss", 0.5));

  auto s = reader.Read();
  REQUIRE(s.ok());
  CHECK(s->owner_pid == ::getpid());
  CHECK((s->flags & kChannelFlagProgress) != 0);
  CHECK((s->flags & kChannelFlagSamples) != 0);
  CHECK((s->flags & kChannelFlagCollectives) != 0);
  CHECK(s->steps == 3);
  CHECK(s->samples_total == 96);
  CHECK(s->new_step_seconds == std::vector<double>{0.25, 0.5});
  CHECK(s->collective_seq == 2);
  CHECK(s->in_collective);
  CHECK(s->collective_op == "broadcast");
  REQUIRE(s->ops.size() == 2);
  CHECK(s->ops[0].op == "allreduce");
  CHECK(s->ops[0].count == 1);
  CHECK(s->ops[0].bytes_total == 4096);
  CHECK(s->ops[0].busbw_gbps == 3.5);
  CHECK(s->comm_seconds_total == Approx(0.001));
  CHECK(s->scalars == std::map<std::string, double>{{"loss", 0.5}, {"lr", 1e-3}});
  CHECK(s->scalars_dropped == 0);

  // The next read has only the steps since this one.
  (*writer)->Step(-1, 0.125);
  auto t = reader.Read();
  REQUIRE(t.ok());
  CHECK(t->new_step_seconds == std::vector<double>{0.125});
  CHECK(t->samples_total == 96);
}

TEST_CASE("a GPU backend's overlapping collectives: inside until the last one ends", "[channel]") {
  Channel ch;
  auto writer = ChannelWriter::Open(ch.path());
  REQUIRE(writer.ok());
  ChannelReader reader(ch.fd);
  (*writer)->CollectiveStart("allreduce");  // #1 and #2 enqueued before #1 ends
  (*writer)->CollectiveStart("allreduce");
  (*writer)->CollectiveEnd("allreduce", 1024, 0.002, 1.0, /*more_in_flight=*/true);
  auto s = reader.Read();
  REQUIRE(s.ok());
  CHECK(s->collective_seq == 2);
  CHECK(s->in_collective);  // #2 is still in flight
  CHECK(s->collective_op == "allreduce");
  (*writer)->CollectiveEnd("allreduce", 1024, 0.003, 1.0, /*more_in_flight=*/false);
  s = reader.Read();
  REQUIRE(s.ok());
  CHECK_FALSE(s->in_collective);
  REQUIRE(s->ops.size() == 1);
  CHECK(s->ops[0].count == 2);
  CHECK(s->ops[0].bytes_total == 2048);
  CHECK(s->comm_seconds_total == Approx(0.005));
}

TEST_CASE("more steps than the ring between two reads: the last 64 durations", "[channel]") {
  Channel ch;
  auto writer = ChannelWriter::Open(ch.path());
  REQUIRE(writer.ok());
  ChannelReader reader(ch.fd);
  for (int i = 1; i <= 1000; ++i) (*writer)->Step(1, i);
  auto s = reader.Read();
  REQUIRE(s.ok());
  CHECK(s->steps == 1000);
  REQUIRE(s->new_step_seconds.size() == kChannelStepRing);
  CHECK(s->new_step_seconds.front() == 1000 - kChannelStepRing + 1);
  CHECK(s->new_step_seconds.back() == 1000);
}

TEST_CASE("thousands of scalars and long names: 256 kept, the rest counted", "[channel]") {
  Channel ch;
  auto writer = ChannelWriter::Open(ch.path());
  REQUIRE(writer.ok());
  int refused = 0;
  for (int i = 0; i < 5000; ++i) {
    if (!(*writer)->Scalar("scalar_" + std::to_string(i), i)) ++refused;
  }
  CHECK(refused == 5000 - kChannelMaxScalars);
  CHECK_FALSE((*writer)->Scalar(std::string(100000, 'x'), 1));
  CHECK_FALSE((*writer)->Scalar("has space", 1));
  CHECK_FALSE((*writer)->Scalar("", 1));
  CHECK((*writer)->Scalar("scalar_7", 70));  // an existing name still updates
  ChannelReader reader(ch.fd);
  auto s = reader.Read();
  REQUIRE(s.ok());
  CHECK(s->scalars.size() == kChannelMaxScalars);
  CHECK(s->scalars.at("scalar_7") == 70);
  CHECK(s->scalars_dropped == 5000 - kChannelMaxScalars + 3);
}

TEST_CASE("a second process cannot take a claimed channel", "[channel]") {
  Channel ch;
  std::int64_t other = ::getppid();  // alive
  ch.Poke(offsetof(ChannelHeader, owner_pid), &other, sizeof(other));
  auto writer = ChannelWriter::Open(ch.path());
  CHECK(writer.status().code() == absl::StatusCode::kAlreadyExists);
  std::int64_t dead = 0x3fffffff;  // above pid_max: no such process
  ch.Poke(offsetof(ChannelHeader, owner_pid), &dead, sizeof(dead));
  CHECK(ChannelWriter::Open(ch.path()).ok());  // a dead owner's channel is taken over
}

TEST_CASE("a writer refuses a file of another layout", "[channel]") {
  Channel ch;
  const std::uint32_t version = kChannelVersion + 1;
  ch.Poke(offsetof(ChannelHeader, version), &version, sizeof(version));
  CHECK_FALSE(ChannelWriter::Open(ch.path()).ok());
  CHECK_FALSE(ChannelWriter::Open("/nonexistent/channel").ok());
}

TEST_CASE("counters going backwards are ignored with one warning", "[channel]") {
  Channel ch;
  auto writer = ChannelWriter::Open(ch.path());
  REQUIRE(writer.ok());
  ChannelReader reader(ch.fd);
  for (int i = 0; i < 10; ++i) (*writer)->Step(8, 0.1);
  (*writer)->CollectiveStart("allreduce");
  REQUIRE(reader.Read().ok());
  const std::int64_t three = 3;
  ch.Poke(offsetof(ChannelLayout, progress) + offsetof(ProgressSection, steps), &three, 8);
  const std::int64_t zero = 0;
  ch.Poke(offsetof(ChannelLayout, comm) + offsetof(CommSection, collective_seq), &zero, 8);
  auto s = reader.Read();
  REQUIRE(s.ok());
  CHECK(s->steps == 10);
  CHECK(s->collective_seq == 1);
  CHECK(s->new_step_seconds.empty());
  CHECK(reader.TakeWarnings().size() == 2);
  REQUIRE(reader.Read().ok());
  CHECK(reader.TakeWarnings().empty());  // said once
}

TEST_CASE("garbage in every byte never crashes the reader or passes through", "[channel]") {
  Channel ch;
  ChannelReader reader(ch.fd);
  std::mt19937_64 rng(42);
  std::string bytes(sizeof(ChannelLayout), '\0');
  for (int round = 0; round < 300; ++round) {
    for (char& c : bytes) c = static_cast<char>(rng());
    if (round % 2 == 0) {  // a valid header over garbage sections
      std::memcpy(bytes.data(), InitialChannelBytes().data(), offsetof(ChannelHeader, owner_pid));
      for (std::size_t seq :
           {offsetof(ChannelHeader, progress_seq), offsetof(ChannelHeader, comm_seq),
            offsetof(ChannelHeader, scalars_seq)}) {
        bytes[seq] = static_cast<char>(bytes[seq] & ~1);  // even: readable
      }
    }
    ch.Poke(0, bytes.data(), bytes.size());
    auto s = reader.Read();
    if (round % 2 == 1) {
      CHECK_FALSE(s.ok());
      continue;
    }
    REQUIRE(s.ok());
    CHECK(s->steps >= 0);
    CHECK((s->samples_total < 0 || std::isfinite(s->samples_total)));
    CHECK(s->new_step_seconds.size() <= kChannelStepRing);
    for (double d : s->new_step_seconds) CHECK((std::isfinite(d) && d >= 0));
    CHECK(s->ops.size() <= kChannelMaxOps);
    for (const auto& op : s->ops) CHECK(ValidChannelName(op.op));
    CHECK(s->scalars.size() <= kChannelMaxScalars);
    for (const auto& [name, value] : s->scalars) {
      CHECK(ValidChannelName(name));
      CHECK(std::isfinite(value));
    }
    CHECK((s->stack_signal >= 0 && s->stack_signal < 65));
  }
}

TEST_CASE("a truncated channel is an error, not a fault", "[channel]") {
  Channel ch;
  ChannelReader reader(ch.fd);
  REQUIRE(reader.Read().ok());
  REQUIRE(::ftruncate(ch.fd, 100) == 0);
  CHECK_FALSE(reader.Read().ok());
  REQUIRE(::ftruncate(ch.fd, 0) == 0);
  CHECK_FALSE(reader.Read().ok());
}

TEST_CASE("a section a writer holds odd keeps its previous copy", "[channel]") {
  Channel ch;
  auto writer = ChannelWriter::Open(ch.path());
  REQUIRE(writer.ok());
  ChannelReader reader(ch.fd);
  (*writer)->Step(1, 0.5);
  REQUIRE(reader.Read()->steps == 1);
  std::uint64_t odd = 7;  // a writer that died mid-write
  ch.Poke(offsetof(ChannelHeader, progress_seq), &odd, sizeof(odd));
  const std::int64_t steps = 99;
  ch.Poke(offsetof(ChannelLayout, progress) + offsetof(ProgressSection, steps), &steps, 8);
  auto s = reader.Read();
  REQUIRE(s.ok());
  CHECK(s->steps == 1);
}

}  // namespace
}  // namespace ddprun::rendezvous
