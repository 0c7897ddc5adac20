// The bootstrap load generator (store_load.h): one epoll loop, one state
// machine per client.
#include "store_load.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>  // getrusage
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ddprun/rendezvous/store/c10d_wire.h"

namespace ddprun::bench {
namespace {

namespace c10d = ddprun::rendezvous::c10d;

enum class Step {
  kIdle,         // not yet connected
  kConnecting,   // connect() in progress
  kCheckIn,      // ADD init sent, i64 expected
  kWaitUid,      // WAIT uid sent, u8 expected
  kGetUid,       // GET uid sent, string expected
  kBarrierAdd,   // ADD barrier sent, i64 expected
  kBarrierWait,  // WAIT barrier_done sent, u8 expected
  kDone,
};

struct Client {
  int fd = -1;
  int rank = 0;
  Step step = Step::kIdle;
  std::string out;
  std::size_t out_off = 0;
  std::string in;
  std::vector<int> extra_fds;  // the silent second connection(s)
};

double CpuSecondsOfThread() {
  rusage ru{};
  ::getrusage(RUSAGE_THREAD, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
         (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

void Encode(c10d::Request req, std::string* out) {
  // The requests below are within every limit: encoding cannot fail.
  (void)c10d::EncodeRequest(c10d::Dialect::kLegacy, req, out);
}

std::string Add(const std::string& key, std::int64_t delta) {
  std::string out;
  c10d::Request r;
  r.op = c10d::Op::kAdd;
  r.keys = {key};
  r.delta = delta;
  Encode(r, &out);
  return out;
}
std::string Set(const std::string& key, const std::string& value) {
  std::string out;
  c10d::Request r;
  r.op = c10d::Op::kSet;
  r.keys = {key};
  r.values = {value};
  Encode(r, &out);
  return out;
}
std::string Wait(const std::string& key) {
  std::string out;
  c10d::Request r;
  r.op = c10d::Op::kWait;
  r.keys = {key};
  Encode(r, &out);
  return out;
}
std::string Get(const std::string& key) {
  std::string out;
  c10d::Request r;
  r.op = c10d::Op::kGet;
  r.keys = {key};
  Encode(r, &out);
  return out;
}

std::int64_t ReadI64(const std::string& s) {
  std::int64_t v;
  std::memcpy(&v, s.data(), sizeof(v));
  return v;
}

// A non-blocking socket with connect() started; -1 and errno on failure.
// Towards a loopback server, connection `seq` comes from its own source
// address 127.0.x.y (the port still chosen at connect): with 16k connections
// from one source address the kernel's ephemeral-port search
// (__inet_hash_connect) walks the ports already taken and becomes the
// generator's main cost.
int StartConnect(const sockaddr_in& addr, int seq) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if ((ntohl(addr.sin_addr.s_addr) >> 24) == 127) {
    ::setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
    sockaddr_in src{};
    src.sin_family = AF_INET;
    src.sin_addr.s_addr = htonl((127u << 24) | (static_cast<std::uint32_t>(seq / 250 % 250) << 8) |
                                static_cast<std::uint32_t>(1 + seq % 250));
    ::bind(fd, reinterpret_cast<const sockaddr*>(&src), sizeof(src));  // else: the default
  }
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0 &&
      errno != EINPROGRESS) {
    const int e = errno;
    ::close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

// A blocking connect (for the few hundred bad clients); -1 on failure.
int ConnectNow(const sockaddr_in& addr) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

class Loop {
 public:
  explicit Loop(const BootstrapOptions& opts) : opts_(opts) {
    init_key_ = opts.key_prefix + "init";
    uid_key_ = opts.key_prefix + "uid";
    barrier_key_ = opts.key_prefix + "barrier";
    done_key_ = opts.key_prefix + "barrier_done";
  }
  ~Loop() {
    for (Client& c : clients_) {
      if (c.fd >= 0) ::close(c.fd);
      for (int fd : c.extra_fds) ::close(fd);
    }
    for (int fd : bad_fds_) ::close(fd);
    for (int fd : disconnect_fds_) ::close(fd);
    if (ep_ >= 0) ::close(ep_);
  }

  absl::StatusOr<BootstrapResult> Run() {
    addr_.sin_family = AF_INET;
    addr_.sin_port = htons(static_cast<std::uint16_t>(opts_.port));
    if (::inet_pton(AF_INET, opts_.host.c_str(), &addr_.sin_addr) != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("the load generator needs an IPv4 address, got ", opts_.host));
    }
    ep_ = ::epoll_create1(EPOLL_CLOEXEC);
    if (ep_ < 0) return Errno("epoll_create1");
    if (absl::Status st = OpenBadClients(); !st.ok()) return st;

    clients_.resize(opts_.clients);
    for (int i = 0; i < opts_.clients; ++i) clients_[i].rank = i;
    counts_seen_.assign(opts_.clients + 1, 0);

    const auto start = std::chrono::steady_clock::now();
    const double cpu0 = CpuSecondsOfThread();
    const auto deadline = start + std::chrono::duration<double>(opts_.timeout_s);
    std::vector<epoll_event> events(4096);
    while (done_ < opts_.clients) {
      if (absl::Status st = Admit(); !st.ok()) return st;
      const auto now = std::chrono::steady_clock::now();
      if (now > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("the bootstrap did not finish in ", opts_.timeout_s, " s: ", done_, " of ",
                         opts_.clients, " clients through the barrier"));
      }
      const int n = ::epoll_wait(ep_, events.data(), static_cast<int>(events.size()), 100);
      if (n < 0) {
        if (errno == EINTR) continue;
        return Errno("epoll_wait");
      }
      for (int k = 0; k < n; ++k) {
        Client& c = clients_[events[k].data.u32];
        if (absl::Status st = OnEvent(c, events[k].events); !st.ok()) return st;
      }
    }
    BootstrapResult res;
    res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    res.generator_cpu_s = CpuSecondsOfThread() - cpu0;
    res.clients_done = done_;
    res.wrong_uid = wrong_uid_;
    res.checkin_counts_ok = true;
    for (int v = 1; v <= opts_.clients; ++v) {
      if (counts_seen_[v] != 1) res.checkin_counts_ok = false;
    }
    return res;
  }

 private:
  absl::Status Errno(const char* what) {
    return absl::InternalError(absl::StrCat("load generator: ", what, ": ", std::strerror(errno)));
  }

  absl::Status OpenBadClients() {
    for (int i = 0; i < opts_.silent_clients + opts_.half_request_clients; ++i) {
      const int fd = ConnectNow(addr_);
      if (fd < 0) return Errno("connect (bad client)");
      if (i >= opts_.silent_clients) {
        const std::string set = Set(opts_.key_prefix + "half", "never-finished-value");
        if (::send(fd, set.data(), set.size() / 2, MSG_NOSIGNAL) < 0) return Errno("send");
      }
      bad_fds_.push_back(fd);
    }
    const std::string wait = Wait(done_key_);
    for (int i = 0; i < opts_.disconnect_clients; ++i) {
      const int fd = ConnectNow(addr_);
      if (fd < 0) return Errno("connect (bad client)");
      if (::send(fd, wait.data(), wait.size(), MSG_NOSIGNAL) < 0) return Errno("send");
      disconnect_fds_.push_back(fd);
    }
    return absl::OkStatus();
  }

  // Starts connects while fewer than max_connecting clients await a first reply.
  absl::Status Admit() {
    while (next_ < opts_.clients && connecting_ < opts_.max_connecting) {
      Client& c = clients_[next_++];
      c.fd = StartConnect(addr_, seq_++);
      if (c.fd < 0) return Errno("connect");
      for (int k = 1; k < opts_.conns_per_client; ++k) {
        const int extra = StartConnect(addr_, seq_++);
        if (extra < 0) return Errno("connect (second connection)");
        c.extra_fds.push_back(extra);
      }
      c.step = Step::kConnecting;
      ++connecting_;
      epoll_event ev{};
      ev.events = EPOLLOUT | EPOLLIN;
      ev.data.u32 = static_cast<std::uint32_t>(c.rank);
      if (::epoll_ctl(ep_, EPOLL_CTL_ADD, c.fd, &ev) != 0) return Errno("epoll_ctl");
    }
    return absl::OkStatus();
  }

  void Send(Client& c, const std::string& bytes) { c.out += bytes; }

  absl::Status OnEvent(Client& c, std::uint32_t ev) {
    if (c.step == Step::kConnecting) {
      int err = 0;
      socklen_t len = sizeof(err);
      ::getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err == EINPROGRESS || (err == 0 && !(ev & (EPOLLOUT | EPOLLERR | EPOLLHUP)))) {
        return absl::OkStatus();
      }
      if (err != 0) {
        return absl::UnavailableError(
            absl::StrCat("client ", c.rank, " could not connect: ", std::strerror(err)));
      }
      c.step = Step::kCheckIn;
      Send(c, Add(init_key_, 1));
    } else if (ev & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
      if (absl::Status st = ReadReplies(c); !st.ok()) return st;
    }
    return FlushAndRearm(c);
  }

  absl::Status FlushAndRearm(Client& c) {
    while (c.out_off < c.out.size()) {
      const ssize_t n =
          ::send(c.fd, c.out.data() + c.out_off, c.out.size() - c.out_off, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN) break;
        return Errno("send");
      }
      c.out_off += static_cast<std::size_t>(n);
    }
    if (c.out_off == c.out.size()) {
      c.out.clear();
      c.out_off = 0;
    }
    const bool want_out = !c.out.empty();
    if (want_out != c_wants_out(c)) {
      epoll_event ev{};
      ev.events = want_out ? (EPOLLIN | EPOLLOUT) : EPOLLIN;
      ev.data.u32 = static_cast<std::uint32_t>(c.rank);
      if (::epoll_ctl(ep_, EPOLL_CTL_MOD, c.fd, &ev) != 0) return Errno("epoll_ctl");
      wants_out_[c.rank] = want_out;
    }
    return absl::OkStatus();
  }
  bool c_wants_out(const Client& c) {
    if (wants_out_.empty()) wants_out_.assign(opts_.clients, true);  // registered with EPOLLOUT
    return wants_out_[c.rank];
  }

  absl::Status ReadReplies(Client& c) {
    char buf[4096];
    for (;;) {
      const ssize_t n = ::recv(c.fd, buf, sizeof(buf), 0);
      if (n > 0) {
        c.in.append(buf, static_cast<std::size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) break;
      return absl::UnavailableError(
          absl::StrCat("the server closed client ", c.rank, " at step ", static_cast<int>(c.step)));
    }
    for (;;) {
      switch (c.step) {
        case Step::kCheckIn: {
          if (c.in.size() < 8) return absl::OkStatus();
          const std::int64_t count = ReadI64(c.in);
          c.in.erase(0, 8);
          if (count >= 1 && count <= opts_.clients) ++counts_seen_[count];
          --connecting_;
          if (++checked_in_ * 2 >= opts_.clients && !disconnect_fds_.empty()) {
            for (int fd : disconnect_fds_) ::close(fd);  // mid-wait: barrier_done not set yet
            disconnect_fds_.clear();
          }
          if (c.rank == 0) {
            Send(c, Set(uid_key_, opts_.uid_value));
            c.step = Step::kBarrierAdd;
            Send(c, Add(barrier_key_, 1));
          } else {
            c.step = Step::kWaitUid;
            Send(c, Wait(uid_key_));
          }
          break;
        }
        case Step::kWaitUid:
          if (c.in.empty()) return absl::OkStatus();
          c.in.erase(0, 1);
          c.step = Step::kGetUid;
          Send(c, Get(uid_key_));
          break;
        case Step::kGetUid: {
          if (c.in.size() < 8) return absl::OkStatus();
          const auto len = static_cast<std::size_t>(ReadI64(c.in));
          if (c.in.size() < 8 + len) return absl::OkStatus();
          if (c.in.compare(8, len, opts_.uid_value) != 0) ++wrong_uid_;
          c.in.erase(0, 8 + len);
          c.step = Step::kBarrierAdd;
          Send(c, Add(barrier_key_, 1));
          break;
        }
        case Step::kBarrierAdd: {
          if (c.in.size() < 8) return absl::OkStatus();
          const std::int64_t count = ReadI64(c.in);
          c.in.erase(0, 8);
          if (count == opts_.clients) Send(c, Set(done_key_, "1"));
          c.step = Step::kBarrierWait;
          Send(c, Wait(done_key_));
          break;
        }
        case Step::kBarrierWait:
          if (c.in.empty()) return absl::OkStatus();
          c.in.erase(0, 1);
          c.step = Step::kDone;
          ++done_;
          break;
        default:
          if (!c.in.empty()) {
            return absl::InternalError(
                absl::StrCat("client ", c.rank, " got ", c.in.size(), " unexpected bytes"));
          }
          return absl::OkStatus();
      }
    }
  }

  const BootstrapOptions& opts_;
  sockaddr_in addr_{};
  int ep_ = -1;
  std::string init_key_, uid_key_, barrier_key_, done_key_;
  std::vector<Client> clients_;
  std::vector<bool> wants_out_;
  std::vector<int> counts_seen_;
  std::vector<int> bad_fds_, disconnect_fds_;
  int next_ = 0;
  int seq_ = 0;
  int connecting_ = 0;
  int checked_in_ = 0;
  int done_ = 0;
  int wrong_uid_ = 0;
};

}  // namespace

absl::StatusOr<BootstrapResult> RunBootstrap(const BootstrapOptions& opts) {
  if (opts.clients < 1 || opts.conns_per_client < 1) {
    return absl::InvalidArgumentError("a bootstrap needs at least one client and one connection");
  }
  Loop loop(opts);
  return loop.Run();
}

}  // namespace ddprun::bench
