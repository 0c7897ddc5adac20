#include "shared_buffers.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace ddp::detail {
namespace {

constexpr std::size_t kPage = 4096;

struct Buffer {
  std::size_t bytes;  // mapped (a whole number of pages)
  int fd;
  std::uint64_t serial;
};

struct Registry {
  std::mutex mu;
  std::map<const char*, Buffer> by_base;  // keyed by the mapping's start
  std::uint64_t next_serial = 1;
};

Registry& Buffers() {
  static Registry* r = new Registry();  // never destroyed: frees may come late
  return *r;
}

}  // namespace

absl::StatusOr<void*> AllocShared(std::size_t bytes) {
  const std::size_t size = std::max<std::size_t>(kPage, (bytes + kPage - 1) / kPage * kPage);
  const int fd = ::memfd_create("ddprun-buffer", MFD_CLOEXEC);
  if (fd < 0) {
    return absl::ResourceExhaustedError(absl::StrCat("memfd_create: ", std::strerror(errno)));
  }
  if (int e = ::posix_fallocate(fd, 0, static_cast<off_t>(size)); e != 0) {
    ::close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", size, " bytes of shared memory: ", std::strerror(e)));
  }
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    const int e = errno;
    ::close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("mmap of ", size, " bytes: ", std::strerror(e)));
  }
  Registry& r = Buffers();
  std::lock_guard<std::mutex> lock(r.mu);
  r.by_base.emplace(static_cast<const char*>(p), Buffer{size, fd, r.next_serial++});
  return p;
}

bool FreeShared(void* p) {
  Registry& r = Buffers();
  Buffer b;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.by_base.find(static_cast<const char*>(p));
    if (it == r.by_base.end()) return false;
    b = it->second;
    r.by_base.erase(it);
  }
  ::munmap(p, b.bytes);
  ::close(b.fd);
  return true;
}

std::optional<SharedRef> FindShared(const void* p, std::size_t bytes) {
  const char* c = static_cast<const char*>(p);
  Registry& r = Buffers();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.by_base.upper_bound(c);
  if (it == r.by_base.begin()) return std::nullopt;
  --it;
  const std::size_t off = static_cast<std::size_t>(c - it->first);
  if (off > it->second.bytes || bytes > it->second.bytes - off) return std::nullopt;
  return SharedRef{it->second.serial, it->second.fd, it->second.bytes, off};
}

}  // namespace ddp::detail
