// Redirects fd 2 to a temporary file for the scope; text() restores fd 2 and
// gives what was written. For tests of code that reports on stderr.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace ddprun::test {

class CaptureStderr {
 public:
  CaptureStderr() {
    char tmpl[] = "/tmp/ddprun_test_stderr_XXXXXX";
    const int fd = ::mkstemp(tmpl);
    path_ = tmpl;
    std::fflush(stderr);
    saved_ = ::dup(2);
    ::dup2(fd, 2);
    ::close(fd);
  }
  ~CaptureStderr() {
    Restore();
    ::unlink(path_.c_str());
  }
  CaptureStderr(const CaptureStderr&) = delete;
  CaptureStderr& operator=(const CaptureStderr&) = delete;

  std::string text() {
    Restore();
    std::ifstream in(path_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  void Restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    saved_ = -1;
  }
  std::string path_;
  int saved_ = -1;
};

}  // namespace ddprun::test
