// Certificates for the TLS tests, made at test time with the `openssl`
// command in a fresh temporary directory (nothing is checked in, nothing
// expires between runs): a CA, a server certificate for 127.0.0.1 and
// localhost (subjectAltName), a client certificate from the same CA, and a
// second, unrelated CA with a "stranger" certificate of its own. EC P-256
// keys, so that the whole set takes well under a second.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <string>

namespace ddprun::test {

struct TestCerts {
  std::string dir;
  std::string ca, server_cert, server_key, client_cert, client_key;
  std::string other_ca, stranger_cert, stranger_key;
  bool ok = false;
  std::string error;  // why not, when !ok
};

inline bool HaveOpenssl() { return std::system("openssl version > /dev/null 2>&1") == 0; }

inline TestCerts MakeTestCerts() {
  TestCerts c;
  char tmpl[] = "/tmp/ddprun_tls_XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    c.error = "mkdtemp failed";
    return c;
  }
  c.dir = tmpl;
  const std::string script = R"(set -e
cd ")" + c.dir + R"("
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
ca() { key "$1.key"; openssl req -x509 -new -key "$1.key" -out "$1.pem" -days 2 -subj "/CN=$2" 2>/dev/null; }
leaf() {  # name ca cn
  key "$1.key"
  openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=$3" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -out "$1.pem" \
    -days 2 -extfile "$1.ext" 2>/dev/null
}
ca ca ddprun-test-ca
ca other-ca unrelated-ca
leaf server ca ddprund
leaf client ca node
leaf stranger other-ca stranger
)";
  const std::string path = c.dir + "/make.sh";
  if (FILE* f = std::fopen(path.c_str(), "w")) {
    std::fputs(script.c_str(), f);
    std::fclose(f);
  }
  if (std::system(("sh " + path + " > " + c.dir + "/make.log 2>&1").c_str()) != 0) {
    c.error = "openssl could not make the test certificates (see " + c.dir + "/make.log)";
    return c;
  }
  c.ca = c.dir + "/ca.pem";
  c.server_cert = c.dir + "/server.pem";
  c.server_key = c.dir + "/server.key";
  c.client_cert = c.dir + "/client.pem";
  c.client_key = c.dir + "/client.key";
  c.other_ca = c.dir + "/other-ca.pem";
  c.stranger_cert = c.dir + "/stranger.pem";
  c.stranger_key = c.dir + "/stranger.key";
  c.ok = true;
  return c;
}

inline void RemoveTestCerts(const TestCerts& c) {
  if (!c.dir.empty()) std::system(("rm -rf '" + c.dir + "'").c_str());
}

}  // namespace ddprun::test
