// What a TLS scanner sees on a running flotilla-coordinator: every TLS 1.2
// suite the openssl command line knows, offered alone by `openssl s_client`
// to the gRPC and the HTTPS port, with an RSA and with an ECDSA certificate.
// Only ECDHE with an AEAD cipher (AES-GCM, ChaCha20-Poly1305) may be
// accepted, never CBC, static RSA or anything else; TLS 1.3 is accepted,
// TLS 1.1 is not. And --tls-client-ca (mTLS) holds on HTTPS as on gRPC.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/run_command.h"

namespace flotilla {
namespace {

namespace fs = std::filesystem;
using testing_util::RunCommandWithStderr;

// ---- certificates, made by the openssl command line ----

// A CA, a server certificate for 127.0.0.1 and localhost signed by it, a
// client certificate signed by it, and a client certificate signed by a
// second CA; all with keys of one kind ("rsa:2048" or "ec").
class ScanCerts {
 public:
  ScanCerts(const std::string& key_kind) {
    char tmpl[] = "/tmp/flotilla-tls-scan-XXXXXX";
    dir_ = mkdtemp(tmpl);
    key_ = key_kind == "ec" ? "ec -pkeyopt ec_paramgen_curve:prime256v1" : key_kind;
    ok_ = MakeCa("ca") && MakeCa("other-ca") &&
          MakeLeaf("server", "ca",
                   "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth") &&
          MakeLeaf("client", "ca", "extendedKeyUsage=clientAuth") &&
          MakeLeaf("stranger", "other-ca", "extendedKeyUsage=clientAuth");
  }
  ~ScanCerts() { fs::remove_all(dir_); }
  bool ok() const { return ok_; }
  const std::string& dir() const { return dir_; }
  std::string File(const std::string& name) const { return dir_ + "/" + name; }

 private:
  static bool OpenSsl(const std::string& args) {
    return RunCommandWithStderr("openssl " + args).first == 0;
  }
  bool MakeCa(const std::string& name) {
    return OpenSsl("req -x509 -newkey " + key_ + " -nodes -days 2 -keyout " + File(name + ".key") +
                   " -out " + File(name + ".crt") + " -subj /CN=" + name);
  }
  bool MakeLeaf(const std::string& name, const std::string& ca, const std::string& ext) {
    std::ofstream(File(name + ".ext")) << ext << "\n";
    return OpenSsl("req -newkey " + key_ + " -nodes -keyout " + File(name + ".key") + " -out " +
                   File(name + ".csr") + " -subj /CN=" + name) &&
           OpenSsl("x509 -req -days 2 -in " + File(name + ".csr") + " -CA " + File(ca + ".crt") +
                   " -CAkey " + File(ca + ".key") + " -CAcreateserial -out " + File(name + ".crt") +
                   " -extfile " + File(name + ".ext"));
  }

  std::string dir_;
  std::string key_;
  bool ok_ = false;
};

// ---- a coordinator of its own (no workers: handshakes need none) ----

class Coordinator {
 public:
  // Starts flotilla-coordinator serving gRPC and HTTPS with the server
  // certificate of `certs` (and `extra` flags); waits for both ports.
  explicit Coordinator(const ScanCerts& certs, std::vector<std::string> extra = {}) {
    const std::string bin = std::string(FLOTILLA_BIN_DIR) + "/flotilla-coordinator";
    const std::string port_file = certs.File("port"), http_port_file = certs.File("http-port");
    fs::remove(port_file);
    fs::remove(http_port_file);
    std::vector<std::string> args = {bin,
                                     "--model",
                                     "synthetic:tiny",
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--port-file",
                                     port_file,
                                     "--http-listen",
                                     "127.0.0.1:0",
                                     "--http-port-file",
                                     http_port_file,
                                     "--tls-cert",
                                     certs.File("server.crt"),
                                     "--tls-key",
                                     certs.File("server.key")};
    args.insert(args.end(), extra.begin(), extra.end());
    // Its log (a line per refused handshake) to a file, shown when a test fails.
    log_ = certs.File("coordinator.log");
    pid_ = fork();
    if (pid_ == 0) {
      const int out = open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (out < 0 || dup2(out, 1) < 0 || dup2(out, 2) < 0) _exit(127);
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(bin.c_str(), argv.data());
      _exit(127);
    }
    grpc_port_ = ReadPortFile(port_file);
    http_port_ = ReadPortFile(http_port_file);
  }
  ~Coordinator() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      waitpid(pid_, &status, 0);
    }
    // Its last lines (it logs every refused handshake).
    if (::testing::Test::HasFailure()) {
      std::cout << "coordinator log, the end:\n"
                << RunCommandWithStderr("tail -n 30 " + log_).second << "\n";
    }
  }
  bool ok() const { return pid_ > 0 && grpc_port_ > 0 && http_port_ > 0; }
  int grpc_port() const { return grpc_port_; }
  int http_port() const { return http_port_; }

 private:
  // The port a coordinator wrote to `file`; 0 when it exited, or wrote
  // none within a minute.
  int ReadPortFile(const std::string& file) {
    for (int i = 0; i < 3000; ++i) {
      int port = 0;
      if (std::ifstream(file) >> port && port > 0) return port;
      int status = 0;
      if (pid_ <= 0 || waitpid(pid_, &status, WNOHANG) != 0) {
        pid_ = -1;
        return 0;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return 0;
  }

  std::string log_;
  pid_t pid_ = -1;
  int grpc_port_ = 0;
  int http_port_ = 0;
};

// ---- the scan ----

// One line of `openssl ciphers -v`.
struct Suite {
  std::string name;
  std::string protocol;  // where it first appeared: SSLv3, TLSv1, TLSv1.2, TLSv1.3
  std::string kx;        // key exchange: ECDH (ECDHE), DH, RSA (static), PSK, ...
  std::string enc;       // AESGCM(128), AES(128) (CBC), CHACHA20/POLY1305(256), ...
  std::string mac;       // AEAD, or the HMAC of a MAC-then-encrypt suite
};

// Everything the local OpenSSL can offer, weak and null suites included.
std::vector<Suite> AllSuites() {
  auto [rc, out] = RunCommandWithStderr("openssl ciphers -v 'ALL:COMPLEMENTOFALL:@SECLEVEL=0'");
  EXPECT_EQ(rc, 0) << out;
  std::vector<Suite> suites;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    Suite s;
    std::string kx, au, enc, mac;
    if (!(fields >> s.name >> s.protocol >> kx >> au >> enc >> mac)) continue;
    s.kx = kx.substr(kx.find('=') + 1);
    s.enc = enc.substr(enc.find('=') + 1);
    s.mac = mac.substr(mac.find('=') + 1);
    suites.push_back(s);
  }
  return suites;
}

// What the issue allows on TLS 1.2: ECDHE key exchange, AEAD encryption by
// AES-GCM or ChaCha20-Poly1305.
bool EcdheAead(const Suite& s) {
  return s.kx == "ECDH" && s.mac == "AEAD" &&
         (s.enc.rfind("AESGCM", 0) == 0 || s.enc.rfind("CHACHA20/POLY1305", 0) == 0);
}

// What `openssl s_client` (with `flags`) negotiated with 127.0.0.1:`port`.
struct Negotiated {
  std::string protocol;  // TLSv1.2, TLSv1.3; empty when the handshake failed
  std::string suite;
  bool offered = true;  // false: the client found nothing to offer (a broken scan)
};

// The value after `label` on the first line that has it ("" when none).
std::string Field(const std::string& out, const std::string& label) {
  const size_t at = out.find(label);
  if (at == std::string::npos) return "";
  std::istringstream rest(out.substr(at + label.size()));
  std::string value;
  rest >> value;
  return value;
}

// ALPN h2 as gRPC clients send it (the HTTPS port ignores it). -brief prints
// the version and suite once the handshake completes, before anything else
// is read.
Negotiated Handshake(int port, const std::string& flags) {
  auto [rc, out] = RunCommandWithStderr(
      "timeout 20 openssl s_client -brief -connect 127.0.0.1:" + std::to_string(port) +
      " -servername localhost -alpn h2 " + flags + " </dev/null");
  Negotiated n;
  n.offered = out.find("no ciphers available") == std::string::npos;
  if (rc != 0 || out.find("CONNECTION ESTABLISHED") == std::string::npos) return n;
  n.protocol = Field(out, "Protocol version: ");
  n.suite = Field(out, "Ciphersuite: ");
  return n;
}

// The TLS 1.2 suites `port` accepts, each offered alone (PSK and SRP ones
// with a made-up key and login, so the client does offer them); ADD_FAILUREs
// where the client could not offer one. kScans handshakes (each an openssl
// process) run at once.
std::vector<Suite> AcceptedTls12(int port, const std::vector<Suite>& suites) {
  constexpr int kScans = 4;
  std::vector<const Suite*> tls12;
  for (const Suite& s : suites) {
    if (s.protocol != "TLSv1.3") tls12.push_back(&s);
  }
  std::vector<Negotiated> negotiated(tls12.size());
  std::atomic<size_t> next{0};
  std::vector<std::thread> lanes;
  for (int l = 0; l < kScans; ++l) {
    lanes.emplace_back([&] {
      for (size_t i = next++; i < tls12.size(); i = next++) {
        const Suite& s = *tls12[i];
        std::string flags = "-tls1_2 -cipher '" + s.name + ":@SECLEVEL=0'";
        if (s.kx.find("PSK") != std::string::npos) flags += " -psk 0123456789abcdef";
        if (s.kx == "SRP") flags += " -srpuser scan -srppass pass:scan";
        negotiated[i] = Handshake(port, flags);
      }
    });
  }
  for (std::thread& t : lanes) t.join();
  std::vector<Suite> accepted;
  for (size_t i = 0; i < tls12.size(); ++i) {
    const Suite& s = *tls12[i];
    if (!negotiated[i].offered) ADD_FAILURE() << "openssl s_client could not offer " << s.name;
    if (negotiated[i].suite == s.name && negotiated[i].protocol == "TLSv1.2") accepted.push_back(s);
  }
  return accepted;
}

std::string Names(const std::vector<Suite>& suites) {
  std::string names;
  for (const Suite& s : suites) names += (names.empty() ? "" : " ") + s.name;
  return names.empty() ? "(none)" : names;
}

// The whole scan of one port: only ECDHE + AEAD on TLS 1.2, at least one
// of them, TLS 1.3, nothing below TLS 1.2.
void ExpectOnlyAead(const std::string& what, int port, const std::vector<Suite>& suites) {
  SCOPED_TRACE(what);
  const std::vector<Suite> accepted = AcceptedTls12(port, suites);
  std::cout << what << ": TLS 1.2 suites accepted: " << Names(accepted) << "\n";
  EXPECT_FALSE(accepted.empty()) << "no TLS 1.2 suite at all: the scan found no server";
  for (const Suite& s : accepted) {
    EXPECT_TRUE(EcdheAead(s)) << s.name << " (Kx=" << s.kx << " Enc=" << s.enc << " Mac=" << s.mac
                              << ") accepted";
  }
  EXPECT_EQ(Handshake(port, "-tls1_3").protocol, "TLSv1.3");
  EXPECT_EQ(Handshake(port, "-tls1_1 -cipher 'ALL:@SECLEVEL=0'").protocol, "");
  EXPECT_EQ(Handshake(port, "-tls1 -cipher 'ALL:@SECLEVEL=0'").protocol, "");
}

class TlsScan : public ::testing::TestWithParam<std::string> {};

TEST_P(TlsScan, EveryPortOffersOnlyEcdheAeadSuites) {
  ScanCerts certs(GetParam());
  ASSERT_TRUE(certs.ok());
  Coordinator coordinator(certs);
  ASSERT_TRUE(coordinator.ok());
  const std::vector<Suite> suites = AllSuites();
  ASSERT_GT(suites.size(), 20u);
  ExpectOnlyAead("gRPC port, " + GetParam() + " certificate", coordinator.grpc_port(), suites);
  ExpectOnlyAead("HTTPS port, " + GetParam() + " certificate", coordinator.http_port(), suites);
}

INSTANTIATE_TEST_SUITE_P(Certificates, TlsScan, ::testing::Values("rsa:2048", "ec"),
                         [](const auto& info) { return info.param == "ec" ? "Ecdsa" : "Rsa"; });

// The scan itself sees CBC and static-RSA suites where a server offers them:
// an `openssl s_server` with OpenSSL's defaults, as HTTPS had them before.
TEST(TlsScanCheck, FindsCbcAndStaticRsaOnAServerWithOpenSslDefaults) {
  ScanCerts certs("rsa:2048");
  ASSERT_TRUE(certs.ok());
  const std::string log = certs.File("s_server.log");
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int null_in = open("/dev/null", O_RDONLY);
    const int out = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (null_in < 0 || out < 0 || dup2(null_in, 0) < 0 || dup2(out, 1) < 0) _exit(127);
    execlp("openssl", "openssl", "s_server", "-accept", "127.0.0.1:0", "-www", "-cert",
           certs.File("server.crt").c_str(), "-key", certs.File("server.key").c_str(), nullptr);
    _exit(127);
  }
  // "ACCEPT 127.0.0.1:PORT" once it listens.
  int port = 0;
  for (int i = 0; i < 1500 && port == 0; ++i) {
    std::ifstream in(log);
    std::string word, address;
    while (in >> word) {
      if (word == "ACCEPT" && in >> address && address.find(':') != std::string::npos) {
        port = std::stoi(address.substr(address.rfind(':') + 1));
      }
    }
    if (port == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::vector<Suite> probe;
  for (const Suite& s : AllSuites()) {
    if (s.name == "AES128-SHA" || s.name == "ECDHE-RSA-AES128-SHA" ||
        s.name == "ECDHE-RSA-AES128-GCM-SHA256") {
      probe.push_back(s);
    }
  }
  ASSERT_EQ(probe.size(), 3u);
  EXPECT_GT(port, 0);
  if (port > 0) {
    const std::vector<Suite> accepted = AcceptedTls12(port, probe);
    EXPECT_EQ(Names(accepted), Names(probe));
    for (const Suite& s : accepted) {
      EXPECT_EQ(EcdheAead(s), s.name == "ECDHE-RSA-AES128-GCM-SHA256") << s.name;
    }
  }
  kill(pid, SIGTERM);
  waitpid(pid, nullptr, 0);
}

// gRPC takes its suites from GRPC_SSL_CIPHER_SUITES: one that would weaken the
// gRPC port stops the coordinator at start, naming it.
TEST(TlsScanCheck, WeakGrpcCipherSuitesInTheEnvironmentAreRefusedAtStart) {
  ScanCerts certs("ec");
  ASSERT_TRUE(certs.ok());
  auto [rc, out] = RunCommandWithStderr(
      "GRPC_SSL_CIPHER_SUITES=ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES128-SHA timeout 60 " +
      std::string(FLOTILLA_BIN_DIR) +
      "/flotilla-coordinator --model synthetic:tiny --listen 127.0.0.1:0 --http-listen "
      "127.0.0.1:0 --tls-cert " +
      certs.File("server.crt") + " --tls-key " + certs.File("server.key"));
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("ECDHE-ECDSA-AES128-SHA"), std::string::npos) << out;
}

// ---- mTLS on HTTPS ----

// An HTTPS client that trusts the test CA, presenting `client` ("" = no
// certificate).
std::unique_ptr<httplib::SSLClient> Https(const ScanCerts& certs, int port,
                                          const std::string& client) {
  auto c = client.empty()
               ? std::make_unique<httplib::SSLClient>("127.0.0.1", port)
               : std::make_unique<httplib::SSLClient>(
                     "127.0.0.1", port, certs.File(client + ".crt"), certs.File(client + ".key"));
  c->set_ca_cert_path(certs.File("ca.crt").c_str());
  c->enable_server_certificate_verification(true);
  c->set_connection_timeout(20, 0);
  c->set_read_timeout(20, 0);
  return c;
}

// With --tls-client-ca, HTTPS serves only clients with a certificate that CA
// signed; the others fail at the handshake, on TLS 1.2 and TLS 1.3 alike.
TEST(HttpsMtls, OnlyClientsWithACertificateFromTheCaAreServed) {
  ScanCerts certs("ec");
  ASSERT_TRUE(certs.ok());
  Coordinator coordinator(certs, {"--tls-client-ca", certs.File("ca.crt")});
  ASSERT_TRUE(coordinator.ok());
  const int port = coordinator.http_port();

  auto with = Https(certs, port, "client")->Get("/v1/models");
  ASSERT_TRUE(with) << httplib::to_string(with.error());
  EXPECT_EQ(with->status, 200) << with->body;

  // On TLS 1.3 a refused client hears of it only after its handshake, so it
  // may write to a closed connection: as for any client, that must not kill it.
  signal(SIGPIPE, SIG_IGN);
  auto without = Https(certs, port, "")->Get("/v1/models");
  EXPECT_FALSE(without) << without->status << " " << without->body;
  auto stranger = Https(certs, port, "stranger")->Get("/v1/models");
  EXPECT_FALSE(stranger) << stranger->status << " " << stranger->body;

  // The handshake itself, as openssl sees it (on TLS 1.2 the client learns
  // of the refusal within the handshake).
  const std::string ca = " -CAfile " + certs.File("ca.crt");
  const std::string client =
      " -cert " + certs.File("client.crt") + " -key " + certs.File("client.key");
  EXPECT_EQ(Handshake(port, "-tls1_2" + ca).protocol, "");
  EXPECT_EQ(Handshake(port, "-tls1_2" + ca + client).protocol, "TLSv1.2");
}

}  // namespace
}  // namespace flotilla
