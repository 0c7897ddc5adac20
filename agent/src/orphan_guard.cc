#include "orphan_guard.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <new>
#include <string>

namespace ddprun::agent {

// The mapping the agent and the guard share: the table, then the guard's
// stack. Written by the agent (under its mutex), read by the guard once the
// agent is gone.
// Trivial on purpose: built over a fresh (zero) mapping without writing a
// byte, so that untouched slots are never faulted in; accessed through
// std::atomic_ref.
struct OrphanGuard::Shared {
  int fd;                   // the guard's end of the socket
  int high_water;           // slots [0, high_water) may hold a group
  pid_t slots[kMaxGroups];  // a process group, or 0
  int remove_len;           // > 0: remove_dir holds a NUL-terminated path of this length
  char remove_dir[kMaxPath];
};

namespace {

constexpr std::size_t kPage = 4096;
constexpr std::size_t kTableBytes = (sizeof(OrphanGuard::Shared) + kPage - 1) / kPage * kPage;
// The guard uses well under one page, two with RemoveDir's buffer.
constexpr std::size_t kStackBytes = 64 * 1024;
constexpr std::size_t kMapBytes = kTableBytes + kStackBytes;

#if defined(__x86_64__) || defined(__aarch64__)
#define DDPRUN_GUARD_SHARES_MEMORY 1
// A system call without libc: returns the result or -errno, touches no
// thread-local state (the guard runs on the agent's thread pointer).
[[gnu::always_inline]] inline long RawSyscall(long n, long a = 0, long b = 0, long c = 0,
                                              long d = 0) {
#if defined(__x86_64__)
  long ret;
  register long r10 __asm__("r10") = d;
  __asm__ volatile("syscall"
                   : "=a"(ret)
                   : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10)
                   : "rcx", "r11", "memory");
  return ret;
#else
  register long x8 __asm__("x8") = n;
  register long x0 __asm__("x0") = a;
  register long x1 __asm__("x1") = b;
  register long x2 __asm__("x2") = c;
  register long x3 __asm__("x3") = d;
  __asm__ volatile("svc #0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3) : "memory");
  return x0;
#endif
}
#else
#define DDPRUN_GUARD_SHARES_MEMORY 0
// Elsewhere the guard is a fork (its own memory), where libc is safe.
inline long RawSyscall(long n, long a = 0, long b = 0, long c = 0, long d = 0) {
  const long r = ::syscall(n, a, b, c, d);
  return r == -1 ? -errno : r;
}
#endif

// Unlinks the entries of `dir` (plain files; a subdirectory fails to unlink
// and stays) and removes it. Two passes: a worker killed mid-write may have
// created a file after the first listing. Raw system calls only.
__attribute__((no_stack_protector)) void RemoveDir(const char* dir) {
  for (int pass = 0; pass < 2; ++pass) {
    const long fd = RawSyscall(SYS_openat, AT_FDCWD, reinterpret_cast<long>(dir),
                               O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return;
    alignas(8) char buf[2048];
    long n;
    while ((n = RawSyscall(SYS_getdents64, fd, reinterpret_cast<long>(buf), sizeof(buf))) > 0) {
      for (long at = 0; at < n;) {
        // struct linux_dirent64: d_ino (8), d_off (8), d_reclen (2), d_type (1), d_name.
        unsigned short reclen;
        __builtin_memcpy(&reclen, buf + at + 16, sizeof(reclen));
        const char* name = buf + at + 19;
        const bool dot = name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0'));
        if (!dot) RawSyscall(SYS_unlinkat, fd, reinterpret_cast<long>(name), 0);
        at += reclen;
      }
    }
    RawSyscall(SYS_close, fd);
    if (RawSyscall(SYS_unlinkat, AT_FDCWD, reinterpret_cast<long>(dir), AT_REMOVEDIR) == 0) return;
  }
}

// The guard's whole life. Raw system calls only (see orphan_guard.h). No
// stack protector: its canary is read through the thread pointer, which is
// the starting thread's (its stack and TLS may be gone once it exits).
__attribute__((no_stack_protector)) int GuardMain(void* arg) {
  auto* shared = static_cast<OrphanGuard::Shared*>(arg);
  const int fd = shared->fd;
  // Every signal blocked (SIGKILL and SIGSTOP cannot be): the terminal
  // signals sent to the agent's process group stay pending here.
  const unsigned long all = ~0UL;
  RawSyscall(SYS_rt_sigprocmask, SIG_SETMASK, reinterpret_cast<long>(&all), 0, sizeof(all));
  static const char kName[] = "ddprun-guard";
  RawSyscall(SYS_prctl, PR_SET_NAME, reinterpret_cast<long>(kName));
  // Its copy of the agent's descriptor table: keep only the socket, so that
  // the guard holds no listening socket, pipe or console of the agent's.
  const bool ranged = (fd == 0 || RawSyscall(SYS_close_range, 0, fd - 1, 0) == 0) &&
                      RawSyscall(SYS_close_range, fd + 1, ~0U, 0) == 0;
  if (!ranged) {  // kernels before 5.9
    for (int i = 0; i < 1024; ++i) {
      if (i != fd) RawSyscall(SYS_close, i);
    }
  }
  char op = 0;
  long r;
  do {
    r = RawSyscall(SYS_read, fd, reinterpret_cast<long>(&op), 1);
  } while (r == -EINTR);
  if (r != 1 || op != 'q') {  // end-of-file (or an error): the agent is gone
    const int n = std::atomic_ref<int>(shared->high_water).load(std::memory_order_acquire);
    for (int i = 0; i < n; ++i) {
      const pid_t pgid = std::atomic_ref<pid_t>(shared->slots[i]).load(std::memory_order_acquire);
      if (pgid > 0) RawSyscall(SYS_kill, -pgid, SIGKILL);
    }
    if (std::atomic_ref<int>(shared->remove_len).load(std::memory_order_acquire) > 0) {
      RemoveDir(shared->remove_dir);
    }
  }
  for (;;) RawSyscall(SYS_exit, 0);
}

}  // namespace

absl::StatusOr<std::unique_ptr<OrphanGuard>> OrphanGuard::Start() {
  // Shared (not private) so that the fork used off x86-64/arm64 sees the
  // agent's writes too. Untouched pages cost nothing: a job touches the
  // header, one page of slots per 1,024 workers and one page of stack.
  void* mem = ::mmap(nullptr, kMapBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    return absl::ResourceExhaustedError(std::string("cannot map the orphan guard's table: ") +
                                        std::strerror(errno));
  }
  auto* shared = new (mem) Shared;  // default-initialized: the zeros of the mapping stay
  // A socket rather than a pipe: send(MSG_NOSIGNAL) cannot raise SIGPIPE in
  // the agent if the guard is gone.
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    const int err = errno;
    ::munmap(mem, kMapBytes);
    return absl::ResourceExhaustedError(std::string("cannot create the orphan guard's socket: ") +
                                        std::strerror(err));
  }
  shared->fd = fds[0];
#if DDPRUN_GUARD_SHARES_MEMORY
  char* stack_top = static_cast<char*>(mem) + kMapBytes;
  const pid_t pid = ::clone(GuardMain, stack_top, CLONE_VM | SIGCHLD, shared);
#else
  const pid_t pid = ::fork();
  if (pid == 0) GuardMain(shared);
#endif
  if (pid < 0) {
    const int err = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    ::munmap(mem, kMapBytes);
    return absl::ResourceExhaustedError(std::string("cannot start the orphan guard: ") +
                                        std::strerror(err));
  }
  ::close(fds[0]);
  return std::unique_ptr<OrphanGuard>(new OrphanGuard(pid, fds[1], shared));
}

OrphanGuard::~OrphanGuard() { Dismiss(); }

void OrphanGuard::Dismiss() {
  std::lock_guard<std::mutex> lock(mu_);
  if (dismissed_) return;
  dismissed_ = true;
  const char quit = 'q';
  while (::send(fd_, &quit, 1, MSG_NOSIGNAL) < 0 && errno == EINTR) {
  }
  // It exits at once on 'q': its end of the socket closes as it does, which
  // wakes this poll (no sleep on every exit).
  pollfd p{fd_, POLLIN, 0};
  while (::poll(&p, 1, 200) < 0 && errno == EINTR) {
  }
  ::close(fd_);
  // Reap it. Bounded (200 ms): never hang on it. Its stack and table are
  // unmapped only once it is gone.
  for (int i = 0; i < 2000; ++i) {
    pid_t r = ::waitpid(pid_, nullptr, WNOHANG);
    if (r == pid_ || (r < 0 && errno == ECHILD)) {
      ::munmap(shared_, kMapBytes);
      return;
    }
    ::usleep(100);
  }
}

void OrphanGuard::Register(pid_t pgid) {
  std::lock_guard<std::mutex> lock(mu_);
  if (dismissed_) return;
  int slot;
  bool fresh = false;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else if (next_slot_ < kMaxGroups) {
    slot = next_slot_++;
    fresh = true;
  } else {
    return;
  }
  // The group first, then the high-water mark that makes the guard read it.
  std::atomic_ref<pid_t>(shared_->slots[slot]).store(pgid, std::memory_order_release);
  if (fresh) {
    std::atomic_ref<int>(shared_->high_water).store(next_slot_, std::memory_order_release);
  }
  slot_of_[pgid] = slot;
}

void OrphanGuard::RemoveOnDeath(const std::string& dir) {
  if (dir.size() >= static_cast<std::size_t>(kMaxPath)) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (dismissed_) return;
  // Cleared first, so that the guard never reads a path being rewritten.
  std::atomic_ref<int>(shared_->remove_len).store(0, std::memory_order_release);
  if (dir.empty()) return;
  std::memcpy(shared_->remove_dir, dir.c_str(), dir.size() + 1);
  std::atomic_ref<int>(shared_->remove_len)
      .store(static_cast<int>(dir.size()), std::memory_order_release);
}

void OrphanGuard::Unregister(pid_t pgid) {
  std::lock_guard<std::mutex> lock(mu_);
  if (dismissed_) return;
  auto it = slot_of_.find(pgid);
  if (it == slot_of_.end()) return;
  std::atomic_ref<pid_t>(shared_->slots[it->second]).store(0, std::memory_order_release);
  free_slots_.push_back(it->second);
  slot_of_.erase(it);
}

}  // namespace ddprun::agent
