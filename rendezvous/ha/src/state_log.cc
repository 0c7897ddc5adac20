#include "ddprun/rendezvous/ha/state_log.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "ddprun/rendezvous/ha/job_snapshot_proto.h"
#include "ddprun/rendezvous/proto_convert.h"
#include "ddprun/v1/state.pb.h"

namespace ddprun::rendezvous {
namespace {

constexpr std::size_t kMaxRecordBytes = 512u << 20;

std::string Errno(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
}

// "job42" -> "6a6f623432.log": any job id is a safe file name.
std::string HexName(const std::string& job_id) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : job_id) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out + ".log";
}

std::uint32_t Crc(const std::string& bytes) {
  return static_cast<std::uint32_t>(
      crc32(0L, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size())));
}

void PutU32(std::string* out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::uint32_t GetU32(const char* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

void Frame(const pb::StateRecord& rec, std::string* out) {
  std::string bytes = rec.SerializeAsString();
  PutU32(out, static_cast<std::uint32_t>(bytes.size()));
  PutU32(out, Crc(bytes));
  out->append(bytes);
}

absl::Status WriteAll(int fd, const std::string& data, const std::string& path) {
  std::size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::ResourceExhaustedError(Errno("cannot write", path) +
                                          "; free space in --state_dir or move it");
    }
    off += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    return absl::ResourceExhaustedError(Errno("cannot fsync", path) +
                                        "; check the disk behind --state_dir");
  }
  return absl::OkStatus();
}

absl::Status FsyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return absl::UnavailableError(Errno("cannot open", dir));
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return absl::UnavailableError(Errno("cannot fsync", dir));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<StateLog>> StateLog::Open(const std::string& dir) {
  const std::string jobs = dir + "/jobs";
  for (const std::string& d : {dir, jobs}) {
    if (::mkdir(d.c_str(), 0700) != 0 && errno != EEXIST) {
      return absl::UnavailableError(Errno("cannot create the state directory", d) +
                                    "; choose a writable --state_dir");
    }
  }
  if (::access(jobs.c_str(), W_OK) != 0) {
    return absl::PermissionDeniedError(Errno("cannot write to the state directory", jobs) +
                                       "; choose a writable --state_dir");
  }
  return std::unique_ptr<StateLog>(new StateLog(jobs));
}

std::string StateLog::PathOf(const std::string& job_id) const {
  return dir_ + "/" + HexName(job_id);
}

absl::StatusOr<std::vector<RecoveredJob>> StateLog::Recover() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<RecoveredJob> jobs;
  DIR* d = ::opendir(dir_.c_str());
  if (!d) return absl::UnavailableError(Errno("cannot read the state directory", dir_));
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".log") == 0) names.push_back(name);
  }
  ::closedir(d);
  for (const std::string& name : names) {
    const std::string path = dir_ + "/" + name;
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return absl::UnavailableError(Errno("cannot read the state file", path));
    std::string data;
    char buf[1 << 16];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof(buf))) > 0) data.append(buf, static_cast<std::size_t>(n));
    ::close(fd);
    if (n < 0) return absl::UnavailableError(Errno("cannot read the state file", path));

    auto corrupt = [&](std::size_t off, const std::string& why) {
      return absl::DataLossError("state file " + path + " is corrupt at byte " +
                                 std::to_string(off) + " (" + why +
                                 "); ddprund will not start without it silently: move the file "
                                 "away to drop that job, or restore it from a backup");
    };
    RecoveredJob job;
    bool have_snapshot = false;
    std::size_t off = 0;
    while (off < data.size()) {
      if (data.size() - off < 8) {
        job.warnings.push_back("dropped a record cut short at the end of " + path);
        break;
      }
      const std::uint32_t len = GetU32(data.data() + off);
      const std::uint32_t crc = GetU32(data.data() + off + 4);
      if (len > kMaxRecordBytes) return corrupt(off, "record length " + std::to_string(len));
      if (data.size() - off - 8 < len) {
        job.warnings.push_back("dropped a record cut short at the end of " + path);
        break;
      }
      std::string bytes = data.substr(off + 8, len);
      if (Crc(bytes) != crc) return corrupt(off, "checksum mismatch");
      pb::StateRecord rec;
      if (!rec.ParseFromString(bytes)) return corrupt(off, "record does not parse");
      if (rec.has_snapshot()) {
        if (rec.snapshot().format_version() != kFormatVersion) {
          return corrupt(off, "unknown format version " +
                                  std::to_string(rec.snapshot().format_version()));
        }
        job.snapshot = SnapshotFromProto(rec.snapshot());
        job.store_round = rec.snapshot().round();
        job.store.clear();
        have_snapshot = true;
      } else if (rec.has_key()) {
        if (!have_snapshot) return corrupt(off, "a store key before the job's snapshot");
        const auto& k = rec.key();
        if (k.round() != job.store_round) {
          if (k.round() < job.store_round) {
            off += 8 + len;
            continue;  // a key of an older round
          }
          job.store_round = k.round();
          job.store.clear();
        }
        auto it = std::find_if(job.store.begin(), job.store.end(),
                               [&](const auto& kv) { return kv.first == k.key(); });
        if (k.deleted()) {
          if (it != job.store.end()) job.store.erase(it);
        } else if (it != job.store.end()) {
          it->second = k.value();
        } else {
          job.store.emplace_back(k.key(), k.value());
        }
      } else {
        return corrupt(off, "an empty record");
      }
      off += 8 + len;
    }
    if (!have_snapshot) {
      if (data.empty()) continue;  // created but never written: nothing to restore
      return absl::DataLossError("state file " + path +
                                 " holds no job snapshot; move it away to drop it");
    }
    jobs.push_back(std::move(job));
  }
  return jobs;
}

absl::Status StateLog::WriteSnapshot(const JobSnapshot& snap, std::int64_t store_round,
                                     const KvEngine& store) {
  std::string data;
  pb::StateRecord rec;
  SnapshotToProto(snap, rec.mutable_snapshot());
  rec.mutable_snapshot()->set_round(snap.round);
  Frame(rec, &data);
  for (const auto& [k, v] : store.Dump()) {
    pb::StateRecord kr;
    kr.mutable_key()->set_round(store_round);
    kr.mutable_key()->set_key(k);
    kr.mutable_key()->set_value(v);
    Frame(kr, &data);
  }
  std::lock_guard<std::mutex> lock(mu_);
  const std::string path = PathOf(snap.job_id);
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::ResourceExhaustedError(Errno("cannot create", tmp) +
                                        "; check space and permissions of --state_dir");
  }
  absl::Status st = WriteAll(fd, data, tmp);
  ::close(fd);
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return absl::UnavailableError(Errno("cannot rename", tmp));
  }
  return FsyncDir(dir_);
}

absl::Status StateLog::AppendKey(const std::string& job_id, std::int64_t round,
                                 const std::string& key, const KvEngine& store) {
  std::lock_guard<std::mutex> lock(mu_);
  pb::StateRecord rec;
  rec.mutable_key()->set_round(round);
  rec.mutable_key()->set_key(key);
  if (auto v = store.Get(key)) {
    rec.mutable_key()->set_value(*v);
  } else {
    rec.mutable_key()->set_deleted(true);
  }
  std::string data;
  Frame(rec, &data);
  const std::string path = PathOf(job_id);
  int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd < 0) return absl::UnavailableError(Errno("cannot open", path));
  absl::Status st = WriteAll(fd, data, path);
  ::close(fd);
  return st;
}

void StateLog::Forget(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  ::unlink(PathOf(job_id).c_str());
}

}  // namespace ddprun::rendezvous
