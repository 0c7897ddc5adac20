#include "gloo_mesh.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "backend.h"
#include "ddprun/rendezvous/common/debug_log.h"
#include "ddprun/rendezvous/store/store.h"
#include "gloo/transport/context.h"
#include "gloo/transport/pair.h"
#include "gloo/transport/tcp/address.h"
#include "gloo/transport/tcp/device.h"

namespace ddp::detail {
namespace {

namespace tcp = gloo::transport::tcp;

// A gloo::Context over pairs connected here (gloo::rendezvous::Context only
// connects through its own store protocol).
class MeshContext final : public gloo::Context {
 public:
  MeshContext(int rank, int size, std::shared_ptr<gloo::transport::Device> device,
              std::shared_ptr<gloo::transport::Context> pairs)
      : gloo::Context(rank, size) {
    device_ = std::move(device);
    transportContext_ = std::move(pairs);
  }
};

std::uint16_t PortOf(const sockaddr_storage& ss) {
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(ss).sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(ss).sin6_port);
  return 0;
}

// `base` (a pair's listening address) with another port: the same host's
// other listening sockets.
tcp::Address WithPort(const tcp::Address& base, std::uint16_t port) {
  sockaddr_storage ss = base.getSockaddr();
  if (ss.ss_family == AF_INET) reinterpret_cast<sockaddr_in&>(ss).sin_port = htons(port);
  if (ss.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6&>(ss).sin6_port = htons(port);
  return tcp::Address(ss, base.getSeq());
}

// A rank's record: the hex of one of its pairs' addresses (the transport
// address they share), then a line per mesh it is in: "<mesh> <port>,..."
// with the listening port of its pair to each member in member order (0 for
// itself). A rank in no mesh of two or more writes an empty record.
struct Record {
  std::optional<tcp::Address> base;
  std::map<int, std::vector<std::uint16_t>> ports;  // mesh -> by member
};

std::string Encode(const std::optional<tcp::Address>& base,
                   const std::map<int, std::vector<std::uint16_t>>& ports) {
  if (!base) return "";
  const std::vector<char> bytes = base->bytes();
  std::string out = absl::BytesToHexString(absl::string_view(bytes.data(), bytes.size()));
  for (const auto& [mesh, list] : ports)
    absl::StrAppend(&out, "\n", mesh, " ", absl::StrJoin(list, ","));
  return out;
}

absl::StatusOr<Record> Decode(const std::string& text, int rank) {
  Record r;
  if (text.empty()) return r;
  auto bad = [rank](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, "'s Gloo record is malformed (", why,
                     "): every rank of a job must run the same ddprun SDK version"));
  };
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  if (lines[0].size() % 2 != 0 || !std::all_of(lines[0].begin(), lines[0].end(),
                                               [](char c) { return absl::ascii_isxdigit(c); })) {
    return bad("its address is not hex");
  }
  const std::string bytes = absl::HexStringToBytes(lines[0]);
  try {
    r.base = tcp::Address(std::vector<char>(bytes.begin(), bytes.end()));
  } catch (const std::exception& e) {
    return bad(e.what());
  }
  for (std::size_t i = 1; i < lines.size(); ++i) {
    std::vector<std::string> f = absl::StrSplit(lines[i], ' ');
    int mesh = 0;
    if (f.size() != 2 || !absl::SimpleAtoi(f[0], &mesh)) return bad(absl::StrCat("line ", i + 1));
    std::vector<std::uint16_t>& list = r.ports[mesh];
    for (absl::string_view p : absl::StrSplit(f[1], ',')) {
      std::uint32_t port = 0;
      if (!absl::SimpleAtoi(p, &port) || port > 65535) return bad(absl::StrCat("line ", i + 1));
      list.push_back(static_cast<std::uint16_t>(port));
    }
  }
  return r;
}

// One pair to connect.
struct Link {
  gloo::transport::Pair* pair;
  std::vector<char> peer;  // the peer's listening address, as Gloo's bytes
  bool active;             // this rank connects (else it waits for the peer)
};

}  // namespace

bool ConnectsToPeer(const std::vector<char>& self, const std::vector<char>& peer) {
  // Pair::connect (gloo/transport/tcp/pair.cc): compare the addresses, then
  // the ports as stored (network order, subtracted as ints); the greater one
  // connects.
  const sockaddr_storage a = tcp::Address(self).getSockaddr();
  const sockaddr_storage b = tcp::Address(peer).getSockaddr();
  if (a.ss_family != b.ss_family) return false;
  int rv = 0;
  if (a.ss_family == AF_INET) {
    const auto& sa = reinterpret_cast<const sockaddr_in&>(a);
    const auto& sb = reinterpret_cast<const sockaddr_in&>(b);
    rv = std::memcmp(&sa.sin_addr, &sb.sin_addr, sizeof(in_addr));
    if (rv == 0) rv = sa.sin_port - sb.sin_port;
  } else if (a.ss_family == AF_INET6) {
    const auto& sa = reinterpret_cast<const sockaddr_in6&>(a);
    const auto& sb = reinterpret_cast<const sockaddr_in6&>(b);
    rv = std::memcmp(&sa.sin6_addr, &sb.sin6_addr, sizeof(in6_addr));
    if (rv == 0) rv = sa.sin6_port - sb.sin6_port;
  }
  return rv > 0;
}

absl::StatusOr<Meshes> ConnectMeshes(const WorkerInfo& info, const std::vector<MeshSpec>& specs,
                                     const std::shared_ptr<gloo::transport::Device>& device,
                                     ddprun::rendezvous::Store& store, const std::string& key,
                                     Duration timeout) {
  // DDPRUN_DEBUG=sdk: where the time went (docs/benchmarks.md profiles it).
  const auto t0 = std::chrono::steady_clock::now();
  auto ms_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
  };
  Meshes out;
  out.contexts.resize(specs.size());
  std::vector<std::shared_ptr<gloo::transport::Context>> pairs(specs.size());
  std::vector<int> index(specs.size(), -1);  // this rank's index in each mesh
  std::optional<tcp::Address> base;
  std::map<int, std::vector<std::uint16_t>> my_ports;
  bool exchange = false;  // any mesh of two members or more: the same on every rank
  try {
    for (std::size_t m = 0; m < specs.size(); ++m) {
      const std::vector<int>& members = specs[m].members;
      const int size = static_cast<int>(members.size());
      exchange = exchange || size > 1;
      const auto at = std::find(members.begin(), members.end(), info.rank);
      if (at == members.end()) continue;
      index[m] = static_cast<int>(at - members.begin());
      if (size == 1) {
        out.contexts[m] = std::make_shared<gloo::Context>(0, 1);
        out.contexts[m]->setTimeout(timeout);
        continue;
      }
      // The pairs listen from here on (Gloo's TCP pairs listen when created).
      pairs[m] = device->createContext(index[m], size);
      pairs[m]->setTimeout(timeout);
      std::vector<std::uint16_t>& ports = my_ports[static_cast<int>(m)];
      ports.assign(size, 0);
      for (int j = 0; j < size; ++j) {
        if (j == index[m]) continue;
        auto& pair = pairs[m]->createPair(j);
        pair->setLocalRank(info.local_rank);  // Gloo's TCP transport does not read it
        const auto& address = dynamic_cast<const tcp::Address&>(pair->address());
        if (!base) base = address;
        ports[j] = PortOf(address.getSockaddr());
      }
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("gloo: cannot listen for the other ranks' connections: ", e.what()));
  }
  if (!exchange) return out;

  const double listening_ms = ms_since(t0);
  auto store_error = [](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("gloo addresses through the store: ", s.message()));
  };
  if (absl::Status s = store.Set(absl::StrCat(key, info.rank), Encode(base, my_ports)); !s.ok()) {
    return store_error(s);
  }
  std::vector<std::string> keys;
  for (int r = 0; r < info.world_size; ++r) keys.push_back(absl::StrCat(key, r));
  absl::StatusOr<std::vector<std::string>> all = store.MultiGet(keys, timeout);
  if (!all.ok()) return store_error(all.status());
  const double exchanged_ms = ms_since(t0);
  std::vector<Record> records(info.world_size);
  for (int r = 0; r < info.world_size; ++r) {
    if (r == info.rank) continue;
    absl::StatusOr<Record> rec = Decode((*all)[r], r);
    if (!rec.ok()) return rec.status();
    records[r] = *std::move(rec);
    for (const auto& [mesh, ports] : records[r].ports) {
      for (std::uint16_t port : ports) {
        if (port != 0) out.rank_of_address[WithPort(*records[r].base, port).str()] = r;
      }
    }
  }

  std::vector<Link> links;
  for (std::size_t m = 0; m < specs.size(); ++m) {
    if (!pairs[m]) continue;
    const std::vector<int>& members = specs[m].members;
    for (std::size_t j = 0; j < members.size(); ++j) {
      if (static_cast<int>(j) == index[m]) continue;
      const int peer = members[j];
      const Record& rec = records[peer];
      const auto ports = rec.ports.find(static_cast<int>(m));
      if (!rec.base || ports == rec.ports.end() || ports->second.size() != members.size() ||
          ports->second[index[m]] == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", peer, "'s Gloo record has no pair for this rank in mesh ", m,
                         ": every rank of a job must run the same ddprun SDK version"));
      }
      auto& pair = pairs[m]->getPair(static_cast<int>(j));
      std::vector<char> address = WithPort(*rec.base, ports->second[index[m]]).bytes();
      const bool active = ConnectsToPeer(pair->address().bytes(), address);
      links.push_back(Link{pair.get(), std::move(address), active});
    }
  }
  // The pairs this rank connects first: they complete on the peers'
  // listening sockets alone; then the ones the peers connect.
  std::stable_partition(links.begin(), links.end(), [](const Link& l) { return l.active; });
  try {
    for (Link& l : links) l.pair->connect(l.peer);
    for (std::size_t m = 0; m < specs.size(); ++m) {
      if (!pairs[m] || !specs[m].sync) continue;
      for (std::size_t j = 0; j < specs[m].members.size(); ++j) {
        if (static_cast<int>(j) != index[m]) {
          pairs[m]->getPair(static_cast<int>(j))->setSync(true, false);
        }
      }
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("gloo bootstrap: connecting to the other ",
                                               info.world_size - 1, " ranks failed: ", e.what()));
  }
  const double connected_ms = ms_since(t0);
  // A connected pair names its peer by the connection's far end (Gloo
  // resets both addresses once connected): on the side that connected, the
  // peer's listening socket (in the records); on the other side, the peer's
  // own end of the connection, which only the peer knows. Every rank
  // publishes its ends and reads everyone's (which also makes the return a
  // point where every rank's pairs are connected).
  std::vector<std::string> ends;
  for (const Link& l : links) ends.push_back(l.pair->address().str());
  if (absl::Status s = store.Set(absl::StrCat(key, "ends/", info.rank), absl::StrJoin(ends, "\n"));
      !s.ok()) {
    return store_error(s);
  }
  for (int r = 0; r < info.world_size; ++r) keys[r] = absl::StrCat(key, "ends/", r);
  all = store.MultiGet(keys, timeout);
  if (!all.ok()) return store_error(all.status());
  for (int r = 0; r < info.world_size; ++r) {
    if (r == info.rank) continue;
    for (absl::string_view a : absl::StrSplit((*all)[r], '\n', absl::SkipEmpty())) {
      out.rank_of_address[std::string(a)] = r;
    }
  }
  DDPRUN_DEBUG_LOG(kSdk) << FenceOf(info) << "gloo meshes (" << specs.size() << ", " << links.size()
                         << " pairs): listening after " << listening_ms << " ms, records read "
                         << exchanged_ms << ", connected " << connected_ms
                         << ", connections' ends read " << ms_since(t0);
  for (std::size_t m = 0; m < specs.size(); ++m) {
    if (!pairs[m]) continue;
    out.contexts[m] = std::make_shared<MeshContext>(
        index[m], static_cast<int>(specs[m].members.size()), device, pairs[m]);
    out.contexts[m]->setTimeout(timeout);
  }
  return out;
}

}  // namespace ddp::detail
