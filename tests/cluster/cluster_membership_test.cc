// Cluster membership end to end: a `flotilla up` cluster runs with its own
// random token; sessions and worker processes without it (or with another
// cluster's) are refused and register nothing, also while a rank is free
// after a worker died; workers' peer listeners are on loopback only.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/cluster_token.h"
#include "proto/admin.grpc.pb.h"
#include "proto/cluster.grpc.pb.h"
#include "proto/flotilla.grpc.pb.h"
#include "tests/cluster/cluster_status.h"
#include "tests/cluster_options.h"
#include "tests/grpc_stub.h"
#include "tools/cli/local_cluster.h"

namespace flotilla {
namespace {
namespace fs = std::filesystem;

bool Registered(const admin::ClusterStatus& s, const std::string& worker_id) {
  for (const admin::WorkerStatus& w : s.workers()) {
    if (w.worker_id() == worker_id) return true;
  }
  return false;
}

grpc::Status GenerateFew(const std::string& address) {
  auto stub = testing_util::PlainStub<v1::Flotilla>(address);
  v1::GenerateRequest req;
  for (int32_t t : {1, 2, 3}) req.mutable_prompt_ids()->add_ids(t);
  req.mutable_sampling()->set_temperature(0);
  req.mutable_sampling()->set_max_tokens(4);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse resp;
  while (reader->Read(&resp)) {
  }
  return reader->Finish();
}

// A hand-made worker session that says Hello; returns how the coordinator ended it.
grpc::Status RogueHello(const std::string& address, const std::string& worker_id,
                        std::optional<std::string> token) {
  auto stub = testing_util::PlainStub<cluster::ClusterControl>(address);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (token) ctx.AddMetadata(kClusterTokenMetadataKey, *token);
  auto stream = stub->Session(&ctx);
  cluster::WorkerMessage hello;
  hello.mutable_hello()->set_worker_id(worker_id);
  hello.mutable_hello()->set_node("local");
  stream->Write(hello);
  cluster::CoordinatorMessage m;
  while (stream->Read(&m)) {
  }
  return stream->Finish();
}

// The local addresses (hex, as /proc/net/tcp{,6} writes them) of the TCP
// sockets process `pid` listens on.
std::vector<std::string> ListeningAddresses(pid_t pid) {
  std::set<std::string> inodes;
  for (const auto& e : fs::directory_iterator(absl::StrCat("/proc/", pid, "/fd"))) {
    std::error_code ec;
    const std::string link = fs::read_symlink(e.path(), ec).string();
    if (!ec && link.rfind("socket:[", 0) == 0) inodes.insert(link.substr(8, link.size() - 9));
  }
  std::vector<std::string> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream row(line);
      std::string slot, local, remote, state, queues, timer, retr, uid, timeout, inode;
      row >> slot >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
      if (state == "0A" && inodes.count(inode)) out.push_back(local.substr(0, local.find(':')));
    }
  }
  return out;
}

bool IsLoopback(const std::string& hex) {
  if (hex.size() == 8) return hex.substr(6) == "7F";           // 127.x.x.x
  if (hex == "00000000000000000000000001000000") return true;  // ::1
  return hex.size() == 32 && hex.substr(0, 24) == "0000000000000000FFFF0000" &&
         hex.substr(30) == "7F";  // ::ffff:127.x
}

TEST(ClusterMembership, FlotillaUpHasItsOwnTokenAndNoOneWithoutItJoinsOrTakesARank) {
  cli::LocalClusterOptions o = testing_util::TestClusterOptions("", 2, 1, "membership-test");
  o.comm_timeout_ms = 3000;
  auto cluster = cli::LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string addr = (*cluster)->address();
  ASSERT_TRUE(GenerateFew(addr).ok());

  // The token is private to this user.
  const std::string token_file = (*cluster)->cluster_token_file();
  struct stat st {};
  ASSERT_EQ(stat(token_file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(stat(fs::path(token_file).parent_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);

  // Peer (UCX) listeners bind loopback, not every interface.
  for (int i = 0; i < 2; ++i) {
    const std::vector<std::string> listening = ListeningAddresses((*cluster)->worker_pid(i));
    EXPECT_FALSE(listening.empty()) << "worker " << i << " has a UCX TCP listener";
    for (const std::string& a : listening)
      EXPECT_TRUE(IsLoopback(a)) << "worker " << i << ": " << a;
  }

  // Hand-made sessions without the token, or with another cluster's.
  const std::string another = *NewClusterToken();
  for (const std::optional<std::string>& token :
       {std::optional<std::string>(), std::optional<std::string>(another)}) {
    const grpc::Status refused = RogueHello(addr, "rogue", token);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAUTHENTICATED) << refused.error_message();
  }
  // A real worker process given another cluster's token stops at once, naming why.
  const std::string wrong_file = o.log_dir + "/another-token";
  fs::remove(wrong_file);
  ASSERT_TRUE(WriteClusterTokenFile(wrong_file, another).ok());
  const std::string out = o.log_dir + "/rogue-worker.log";
  const std::string cmd =
      absl::StrCat(FLOTILLA_BIN_DIR, "/flotilla-worker --coordinator ", addr,
                   " --worker-id rogue-process --threads 1 --cluster-token-file ", wrong_file,
                   " > ", out, " 2>&1");
  EXPECT_NE(std::system(cmd.c_str()), 0);
  std::stringstream log;
  log << std::ifstream(out).rdbuf();
  EXPECT_NE(log.str().find("cluster token"), std::string::npos) << log.str();
  admin::ClusterStatus status = testing_util::ClusterStatusAt(addr);
  EXPECT_FALSE(Registered(status, "rogue")) << status.DebugString();
  EXPECT_FALSE(Registered(status, "rogue-process")) << status.DebugString();
  EXPECT_EQ(status.state(), admin::READY);

  // A worker dies: its rank is free, but not for a process without the token.
  ASSERT_TRUE((*cluster)->KillWorker(1).ok());
  for (int i = 0; i < 100 && testing_util::ClusterStatusAt(addr).state() != admin::DEGRADED; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(testing_util::ClusterStatusAt(addr).state(), admin::DEGRADED);
  const grpc::Status refused = RogueHello(addr, "rogue-spare", std::nullopt);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAUTHENTICATED) << refused.error_message();
  status = testing_util::ClusterStatusAt(addr);
  EXPECT_FALSE(Registered(status, "rogue-spare")) << status.DebugString();
  EXPECT_EQ(status.state(), admin::DEGRADED);

  // The cluster's own worker, with the token, takes it back.
  ASSERT_TRUE((*cluster)->RestartWorker(1).ok());
  for (int i = 0; i < 600 && testing_util::ClusterStatusAt(addr).state() != admin::READY; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(testing_util::ClusterStatusAt(addr).state(), admin::READY)
      << testing_util::ClusterStatusAt(addr).message();
  EXPECT_TRUE(GenerateFew(addr).ok());

  (*cluster)->Stop();
  EXPECT_FALSE(fs::exists(token_file)) << "the token is removed at stop";
  fs::remove_all(o.log_dir);
}

}  // namespace
}  // namespace flotilla
