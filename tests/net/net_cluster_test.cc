// Listening, TLS and bounded input on real local clusters (coordinator and
// worker processes): a second `flotilla up` on a taken port fails fast and
// leaves the first cluster serving; ports out of range are refused; gRPC and
// HTTPS over TLS with certificates made by the openssl command line at test
// time; 100 MiB prompts and 60 MiB bodies are refused fast and cheaply.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "proto/admin.grpc.pb.h"
#include "tests/grpc_stub.h"
#include "tests/run_command.h"
#include "tools/cli/local_cluster.h"
#include "tools/sdk/client.h"

namespace flotilla {
namespace {

namespace fs = std::filesystem;

struct Ran {
  int rc = -1;
  std::string output;
  double seconds = 0;
};

// Runs a shell command (stdout and stderr together) under `timeout`.
Ran RunShell(const std::string& command, int timeout_s = 60) {
  const auto start = std::chrono::steady_clock::now();
  auto [rc, output] =
      testing_util::RunCommandWithStderr("timeout " + std::to_string(timeout_s) + " " + command);
  return {rc, std::move(output),
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
}

// A field of /proc/PID/status in kB (VmRSS, VmHWM); -1 when unreadable.
long ProcKb(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stol(line.substr(field.size() + 1));
  }
  return -1;
}

// The model id clients use: the checkpoint directory's name.
std::string Model(const cli::LocalCluster& cluster) {
  return cluster.model().substr(cluster.model().find_last_of('/') + 1);
}

// Resets the peak RSS (VmHWM) of `pid` to its current RSS, so the peak read
// after a request is that request's.
void ResetPeak(pid_t pid) { std::ofstream("/proc/" + std::to_string(pid) + "/clear_refs") << "5"; }

std::string PortOf(const std::string& address) { return address.substr(address.rfind(':') + 1); }

// A CA, a server certificate for 127.0.0.1 and localhost (subjectAltName), a
// client certificate, and a second CA that signed none of them.
struct Certs {
  std::string dir;
  std::string File(const std::string& name) const { return dir + "/" + name; }
};

bool OpenSsl(const std::string& args) { return RunShell("openssl " + args).rc == 0; }

bool MakeCa(const Certs& c, const std::string& name) {
  return OpenSsl(
      "req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -keyout " +
      c.File(name + ".key") + " -out " + c.File(name + ".crt") + " -subj /CN=" + name);
}

bool MakeLeaf(const Certs& c, const std::string& name, const std::string& cn,
              const std::string& ext) {
  std::ofstream(c.File(name + ".ext")) << ext << "\n";
  return OpenSsl("req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout " +
                 c.File(name + ".key") + " -out " + c.File(name + ".csr") + " -subj /CN=" + cn) &&
         OpenSsl("x509 -req -days 2 -in " + c.File(name + ".csr") + " -CA " + c.File("ca.crt") +
                 " -CAkey " + c.File("ca.key") + " -CAcreateserial -out " + c.File(name + ".crt") +
                 " -extfile " + c.File(name + ".ext"));
}

Certs MakeCerts() {
  char tmpl[] = "/tmp/flotilla-net-test-XXXXXX";
  Certs c{mkdtemp(tmpl)};
  EXPECT_TRUE(MakeCa(c, "ca"));
  EXPECT_TRUE(MakeCa(c, "other-ca"));
  EXPECT_TRUE(MakeLeaf(c, "server", "localhost",
                       "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth"));
  EXPECT_TRUE(MakeLeaf(c, "client", "flotilla-worker", "extendedKeyUsage=clientAuth"));
  return c;
}

cli::LocalCluster* StartCluster(cli::LocalClusterOptions o) {
  setenv("FLOTILLA_BIN_DIR", FLOTILLA_BIN_DIR, 1);
  o.workers = 1;
  o.threads_per_worker = 1;
  auto c = cli::LocalCluster::Start(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? c->release() : nullptr;
}

std::unique_ptr<client::Client> Sdk(const std::string& address, TlsClientFiles tls = {}) {
  client::ClientOptions o;
  o.address = address;
  o.deadline = absl::Seconds(60);
  o.max_attempts = 1;
  o.tls = std::move(tls);
  auto c = client::Client::Create(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

v1::GenerateRequest IdsRequest() {
  v1::GenerateRequest r;
  for (int id : {1, 2, 3}) r.mutable_prompt_ids()->add_ids(id);
  r.mutable_sampling()->set_max_tokens(2);
  return r;
}

// ---- a plaintext cluster: ports and bounded input ----

class NetClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { cluster_ = StartCluster({}); }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(cluster_, nullptr); }
  static void ExpectServing() {
    auto c = Sdk(cluster_->address());
    absl::StatusOr<client::GenerateResult> r = c->Generate(IdsRequest());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->token_ids.size(), 2u);
    httplib::Client http("http://" + cluster_->http_address());
    auto models = http.Get("/v1/models");
    ASSERT_TRUE(models);
    EXPECT_EQ(models->status, 200);
  }
  static cli::LocalCluster* cluster_;
};
cli::LocalCluster* NetClusterTest::cluster_ = nullptr;

TEST_F(NetClusterTest, SecondUpOnATakenPortFailsFastAndTheFirstClusterServes) {
  const std::string grpc_port = PortOf(cluster_->address());
  const std::string http_port = PortOf(cluster_->http_address());
  // The gRPC port, then the HTTP port.
  for (const auto& [args, port] :
       {std::pair<std::string, std::string>{
            "--listen " + cluster_->address() + " --http-listen 127.0.0.1:0", grpc_port},
        {"--listen 127.0.0.1:0 --http-listen " + cluster_->http_address(), http_port}}) {
    Ran up = RunShell(std::string(FLOTILLA_BIN) + " up --workers 1 " + args, 30);
    EXPECT_NE(up.rc, 0) << up.output;
    EXPECT_NE(up.rc, 124) << "timed out: " << up.output;
    EXPECT_LT(up.seconds, 10) << up.output;
    EXPECT_NE(up.output.find(port), std::string::npos) << up.output;
    EXPECT_NE(up.output.find("already in use"), std::string::npos) << up.output;
    EXPECT_EQ(up.output.find("serving"), std::string::npos) << up.output;
  }
  // The coordinator alone says the same.
  Ran coordinator = RunShell(std::string(FLOTILLA_BIN_DIR) +
                                 "/flotilla-coordinator --model synthetic:tiny --listen " +
                                 cluster_->address() + " --http-listen ''",
                             30);
  EXPECT_EQ(coordinator.rc, 1) << coordinator.output;
  EXPECT_NE(coordinator.output.find(grpc_port), std::string::npos) << coordinator.output;
  ExpectServing();
}

TEST_F(NetClusterTest, PortsOutOfRangeAreRefused) {
  Ran up = RunShell(std::string(FLOTILLA_BIN) + " up --workers 1 --listen 127.0.0.1:99999", 30);
  EXPECT_NE(up.rc, 0) << up.output;
  EXPECT_NE(up.rc, 124) << up.output;
  EXPECT_NE(up.output.find("127.0.0.1:99999"), std::string::npos) << up.output;
  EXPECT_NE(up.output.find("0-65535"), std::string::npos) << up.output;
  for (const char* args :
       {"--listen 127.0.0.1:99999", "--listen 127.0.0.1:0 --http-listen 127.0.0.1:70000",
        "--listen localhost", "--listen ::1:5000"}) {
    Ran c = RunShell(
        std::string(FLOTILLA_BIN_DIR) + "/flotilla-coordinator --model synthetic:tiny " + args, 30);
    EXPECT_EQ(c.rc, 1) << args << ": " << c.output;
    EXPECT_NE(c.output.find("is not HOST:PORT"), std::string::npos) << args << ": " << c.output;
  }
}

// Acceptance: a 100 MiB text prompt over gRPC is refused within 1 s with less
// than 200 MB of memory growth (the bound on the time here is generous; the
// measured time is printed).
TEST_F(NetClusterTest, HugeGrpcPromptIsRefusedFastAndCheaply) {
  const pid_t pid = cluster_->coordinator_pid();
  ASSERT_GT(pid, 0);
  auto c = Sdk(cluster_->address());
  for (size_t mib : {100, 20}) {
    v1::GenerateRequest r;
    r.set_text(std::string(mib << 20, 'a'));
    r.mutable_sampling()->set_max_tokens(1);
    ResetPeak(pid);
    const long rss_before = ProcKb(pid, "VmRSS");
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<client::GenerateResult> res = c->Generate(r);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const long peak_after = ProcKb(pid, "VmHWM");
    std::cout << mib << " MiB gRPC text: " << res.status() << " in " << seconds
              << " s; coordinator RSS " << rss_before / 1024 << " MiB before, peak "
              << peak_after / 1024 << " MiB\n";
    ASSERT_FALSE(res.ok());
    EXPECT_EQ(res.status().code(), absl::StatusCode::kResourceExhausted) << res.status();
    EXPECT_LT(seconds, 5.0);
    EXPECT_LT(peak_after - rss_before, 200 * 1024) << "kB of growth";
  }
  // Under the request limit but longer than the context can hold: refused
  // untokenised, naming the limit.
  v1::GenerateRequest r;
  r.set_text(std::string(size_t{4} << 20, 'a'));
  absl::StatusOr<client::GenerateResult> res = c->Generate(r);
  EXPECT_EQ(res.status().code(), absl::StatusCode::kInvalidArgument) << res.status();
  EXPECT_NE(res.status().message().find("context"), std::string::npos) << res.status();
  v1::ChatRequest chat;
  *chat.add_messages() =
      client::MakeChatMessage(v1::ChatMessage::USER, std::string(size_t{4} << 20, 'a'));
  absl::StatusOr<client::ChatResult> chat_res = c->Chat(chat);
  EXPECT_EQ(chat_res.status().code(), absl::StatusCode::kInvalidArgument) << chat_res.status();
  ExpectServing();
}

TEST_F(NetClusterTest, HugeHttpBodyIsRefusedFastAndCheaply) {
  const pid_t pid = cluster_->coordinator_pid();
  ASSERT_GT(pid, 0);
  httplib::Client http("http://" + cluster_->http_address());
  http.set_write_timeout(30, 0);
  http.set_read_timeout(30, 0);
  const std::string body =
      R"({"model":"m","prompt":")" + std::string(size_t{60} << 20, 'a') + "\"}";
  ResetPeak(pid);
  const long rss_before = ProcKb(pid, "VmRSS");
  const auto start = std::chrono::steady_clock::now();
  auto res = http.Post("/v1/completions", body, "application/json");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const long peak_after = ProcKb(pid, "VmHWM");
  std::cout << "60 MiB HTTP body: " << (res ? res->status : -1) << " in " << seconds
            << " s; coordinator RSS " << rss_before / 1024 << " MiB before, peak "
            << peak_after / 1024 << " MiB\n";
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 413) << res->body;
  EXPECT_NE(res->body.find("--max-request-bytes"), std::string::npos) << res->body;
  EXPECT_LT(seconds, 5.0);
  EXPECT_LT(peak_after - rss_before, 200 * 1024) << "kB of growth";

  // Under the body limit, over what the context can hold: 400 naming the limit.
  const std::string long_prompt = R"({"model":")" + Model(*cluster_) + R"(","prompt":")" +
                                  std::string(size_t{4} << 20, 'a') + "\"}";
  res = http.Post("/v1/completions", long_prompt, "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400) << res->body;
  EXPECT_NE(res->body.find("context"), std::string::npos) << res->body;
  ExpectServing();
}

// ---- TLS ----

class TlsClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    certs_ = new Certs(MakeCerts());
    cli::LocalClusterOptions o;
    o.tls.cert = certs_->File("server.crt");
    o.tls.key = certs_->File("server.key");
    o.client_tls.ca = certs_->File("ca.crt");  // the workers connect over TLS
    cluster_ = StartCluster(o);
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
    fs::remove_all(certs_->dir);
    delete certs_;
  }
  void SetUp() override { ASSERT_NE(cluster_, nullptr); }
  static TlsClientFiles Ca(const std::string& name = "ca.crt") {
    TlsClientFiles f;
    f.ca = certs_->File(name);
    return f;
  }
  static Certs* certs_;
  static cli::LocalCluster* cluster_;
};
Certs* TlsClusterTest::certs_ = nullptr;
cli::LocalCluster* TlsClusterTest::cluster_ = nullptr;

TEST_F(TlsClusterTest, ClientWithTheCaIsServedOverGrpcAndHttps) {
  auto c = Sdk(cluster_->address(), Ca());
  absl::StatusOr<client::GenerateResult> r = c->Generate(IdsRequest());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->token_ids.size(), 2u);

  httplib::Client https("https://" + cluster_->http_address());
  https.set_ca_cert_path(certs_->File("ca.crt").c_str());
  https.enable_server_certificate_verification(true);
  auto models = https.Get("/v1/models");
  ASSERT_TRUE(models) << httplib::to_string(models.error());
  EXPECT_EQ(models->status, 200);
  auto done =
      https.Post("/v1/completions",
                 R"({"model":")" + Model(*cluster_) + R"(","prompt":"Hello","max_tokens":2})",
                 "application/json");
  ASSERT_TRUE(done) << httplib::to_string(done.error());
  EXPECT_EQ(done->status, 200) << done->body;

  // The CLI too.
  Ran cli = RunShell(std::string(FLOTILLA_BIN) + " generate --coordinator " + cluster_->address() +
                     " --prompt-ids 1,2,3 --max-tokens 2 --timeout 30 --json --tls-ca " +
                     certs_->File("ca.crt"));
  EXPECT_EQ(cli.rc, 0) << cli.output;
}

TEST_F(TlsClusterTest, PlaintextClientIsRefused) {
  auto c = Sdk(cluster_->address());
  absl::StatusOr<client::GenerateResult> r = c->Generate(IdsRequest());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();

  httplib::Client http("http://" + cluster_->http_address());
  http.set_read_timeout(5, 0);
  auto models = http.Get("/v1/models");
  EXPECT_FALSE(models && models->status == 200);
}

TEST_F(TlsClusterTest, ClientWithoutTheCaFailsVerification) {
  auto c = Sdk(cluster_->address(), Ca("other-ca.crt"));
  absl::StatusOr<client::GenerateResult> r = c->Generate(IdsRequest());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();

  httplib::Client https("https://" + cluster_->http_address());
  https.set_ca_cert_path(certs_->File("other-ca.crt").c_str());
  https.enable_server_certificate_verification(true);
  auto models = https.Get("/v1/models");
  ASSERT_FALSE(models);
  EXPECT_EQ(models.error(), httplib::Error::SSLServerVerification);

  Ran cli = RunShell(std::string(FLOTILLA_BIN) + " generate --coordinator " + cluster_->address() +
                     " --prompt-ids 1,2,3 --max-tokens 2 --timeout 10 --tls-ca " +
                     certs_->File("other-ca.crt"));
  EXPECT_NE(cli.rc, 0) << cli.output;
}

TEST_F(TlsClusterTest, BadTlsFilesAreClearErrorsAtStart) {
  const std::string coordinator = std::string(FLOTILLA_BIN_DIR) +
                                  "/flotilla-coordinator --model synthetic:tiny "
                                  "--listen 127.0.0.1:0 --http-listen 127.0.0.1:0 ";
  Ran missing =
      RunShell(coordinator + "--tls-cert /nonexistent.crt --tls-key " + certs_->File("server.key"));
  EXPECT_EQ(missing.rc, 1) << missing.output;
  EXPECT_NE(missing.output.find("/nonexistent.crt"), std::string::npos) << missing.output;
  Ran mismatched = RunShell(coordinator + "--tls-cert " + certs_->File("server.crt") +
                            " --tls-key " + certs_->File("client.key"));
  EXPECT_EQ(mismatched.rc, 1) << mismatched.output;
  EXPECT_NE(mismatched.output.find("does not match"), std::string::npos) << mismatched.output;
  Ran half = RunShell(coordinator + "--tls-cert " + certs_->File("server.crt"));
  EXPECT_EQ(half.rc, 1) << half.output;
  EXPECT_NE(half.output.find("--tls-key"), std::string::npos) << half.output;
}

// mTLS: with --tls-client-ca the gRPC and HTTPS ports serve only clients
// (and workers) whose certificate that CA signed.
TEST(MtlsClusterTest, OnlyClientsWithACertificateAreServed) {
  Certs certs = MakeCerts();
  cli::LocalClusterOptions o;
  o.tls = {certs.File("server.crt"), certs.File("server.key"), certs.File("ca.crt")};
  o.client_tls = {certs.File("ca.crt"), certs.File("client.crt"), certs.File("client.key")};
  std::unique_ptr<cli::LocalCluster> cluster(StartCluster(o));  // ready: the worker got in
  ASSERT_NE(cluster, nullptr);
  auto without = Sdk(cluster->address(), {certs.File("ca.crt"), "", ""});
  EXPECT_EQ(without->Generate(IdsRequest()).status().code(), absl::StatusCode::kUnavailable);
  auto with = Sdk(cluster->address(), o.client_tls);
  absl::StatusOr<client::GenerateResult> r = with->Generate(IdsRequest());
  EXPECT_TRUE(r.ok()) << r.status();

  const std::string host = cluster->http_address().substr(0, cluster->http_address().rfind(':'));
  const int port = std::stoi(PortOf(cluster->http_address()));
  const std::string body =
      R"({"model":")" + Model(*cluster) + R"(","prompt":"Hello","max_tokens":2})";
  // On TLS 1.3 a refused client hears of it only after its handshake, so it
  // may write to a closed connection: as for any client, that must not kill it.
  signal(SIGPIPE, SIG_IGN);
  httplib::SSLClient https_without(host, port);
  https_without.set_ca_cert_path(certs.File("ca.crt").c_str());
  https_without.set_read_timeout(10, 0);
  auto refused = https_without.Post("/v1/completions", body, "application/json");
  EXPECT_FALSE(refused) << refused->status;
  httplib::SSLClient https_with(host, port, certs.File("client.crt"), certs.File("client.key"));
  https_with.set_ca_cert_path(certs.File("ca.crt").c_str());
  https_with.enable_server_certificate_verification(true);
  auto served = https_with.Post("/v1/completions", body, "application/json");
  EXPECT_TRUE(served) << httplib::to_string(served.error());
  if (served) {
    EXPECT_EQ(served->status, 200) << served->body;
  }
  cluster.reset();
  fs::remove_all(certs.dir);
}

}  // namespace
}  // namespace flotilla

namespace flotilla {
namespace {

// Reads a port a coordinator wrote to `file` (0 when none came in time).
int ReadPortFile(const std::string& file) {
  for (int i = 0; i < 1500; ++i) {
    int port = 0;
    if (std::ifstream(file) >> port && port > 0) return port;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return 0;
}

grpc::Status AdminStatus(const std::string& address) {
  auto stub = testing_util::PlainStub<admin::Admin>(address);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  admin::ClusterStatus status;
  return stub->GetStatus(&ctx, admin::GetStatusRequest(), &status);
}

// --admin-listen: the admin API on its own address only (e.g. one only
// operators reach); the client port no longer serves it.
TEST(AdminListen, AdminApiMovesToItsOwnAddress) {
  const std::string dir = fs::temp_directory_path() / ("flotilla_admin_listen_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string bin = std::string(FLOTILLA_BIN_DIR) + "/flotilla-coordinator";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl(bin.c_str(), bin.c_str(), "--model", "synthetic:tiny", "--listen", "127.0.0.1:0",
          "--port-file", (dir + "/port").c_str(), "--http-listen", "", "--admin-listen",
          "127.0.0.1:0", "--admin-port-file", (dir + "/admin-port").c_str(), nullptr);
    _exit(127);
  }
  const int port = ReadPortFile(dir + "/port"), admin_port = ReadPortFile(dir + "/admin-port");
  EXPECT_GT(port, 0);
  EXPECT_GT(admin_port, 0);
  if (port > 0 && admin_port > 0) {
    EXPECT_EQ(AdminStatus("127.0.0.1:" + std::to_string(port)).error_code(),
              grpc::StatusCode::UNIMPLEMENTED);
    const grpc::Status on_admin = AdminStatus("127.0.0.1:" + std::to_string(admin_port));
    EXPECT_TRUE(on_admin.ok()) << on_admin.error_message();
  }
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace flotilla
