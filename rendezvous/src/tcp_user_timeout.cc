#include "tcp_user_timeout.h"

#include <grpc/support/sync.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

// gRPC's socket mutator, declared as in src/core/lib/iomgr/socket_mutator.h,
// which gRPC does not install. Its public API takes one
// (grpc::ChannelArguments::SetSocketMutator, GRPC_ARG_SOCKET_MUTATOR); the
// layout below is the same from gRPC 1.34 (mutate_fd_2) to today's releases,
// and gRPC calls the mutator after its own options, so its TCP_USER_TIMEOUT
// is the one that stays.
typedef enum {
  GRPC_FD_CLIENT_CONNECTION_USAGE,
  GRPC_FD_SERVER_LISTENER_USAGE,
  GRPC_FD_SERVER_CONNECTION_USAGE,
} grpc_fd_usage;

typedef struct {
  int fd;
  grpc_fd_usage usage;
} grpc_mutate_socket_info;

struct grpc_socket_mutator_vtable {
  bool (*mutate_fd)(int fd, grpc_socket_mutator* mutator);
  int (*compare)(grpc_socket_mutator* a, grpc_socket_mutator* b);
  void (*destroy)(grpc_socket_mutator* mutator);
  bool (*mutate_fd_2)(const grpc_mutate_socket_info* info, grpc_socket_mutator* mutator);
};

struct grpc_socket_mutator {
  const grpc_socket_mutator_vtable* vtable;
  gpr_refcount refcount;
};

void grpc_socket_mutator_init(grpc_socket_mutator* mutator,
                              const grpc_socket_mutator_vtable* vtable);

namespace ddprun::rendezvous {
namespace {

struct TcpUserTimeoutMutator {
  grpc_socket_mutator base;  // first: gRPC hands back &base
  int timeout_ms;
};

TcpUserTimeoutMutator* Self(grpc_socket_mutator* m) {
  return reinterpret_cast<TcpUserTimeoutMutator*>(m);
}

// Only client connections; a setsockopt that fails (not a TCP socket) leaves
// gRPC's value, and the connection goes ahead.
bool Mutate(const grpc_mutate_socket_info* info, grpc_socket_mutator* m) {
  if (info->usage != GRPC_FD_CLIENT_CONNECTION_USAGE) return true;
  const int ms = Self(m)->timeout_ms;
  (void)::setsockopt(info->fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof ms);
  return true;
}

int Compare(grpc_socket_mutator* a, grpc_socket_mutator* b) {
  const int x = Self(a)->timeout_ms;
  const int y = Self(b)->timeout_ms;
  return x < y ? -1 : (x > y ? 1 : 0);
}

void Destroy(grpc_socket_mutator* m) { delete Self(m); }

constexpr grpc_socket_mutator_vtable kVtable{nullptr, Compare, Destroy, Mutate};

}  // namespace

void SetTcpUserTimeout(grpc::ChannelArguments& args, int timeout_ms) {
  auto* m = new TcpUserTimeoutMutator{{}, timeout_ms};
  grpc_socket_mutator_init(&m->base, &kVtable);
  args.SetSocketMutator(&m->base);  // takes the reference init made
}

}  // namespace ddprun::rendezvous
