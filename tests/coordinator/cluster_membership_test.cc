// Cluster membership: the cluster token (files, comparison), the Session
// refused without it over a real gRPC connection (nothing registers), and a
// registered worker that writes into requests not assigned to it (dropped,
// its session ended, the client's stream untouched).
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "common/cluster_token.h"
#include "coordinator/cluster/cluster_manager.h"
#include "coordinator/grpc/services.h"
#include "proto/admin.grpc.pb.h"
#include "proto/cluster.grpc.pb.h"
#include "tests/coordinator/fake_session.h"

namespace flotilla::coordinator {
namespace {
namespace fs = std::filesystem;

std::string TempPath(const std::string& name) {
  return (fs::temp_directory_path() / (name + "-" + std::to_string(getpid()))).string();
}

// The comparison itself is ConstantTimeEquals' (tests/common).
TEST(ClusterToken, ComparesWholeTokensAndAnEmptyOneProvesNothing) {
  EXPECT_TRUE(TokensEqual("abc123", "abc123"));
  EXPECT_FALSE(TokensEqual("abc12", "abc123"));
  EXPECT_FALSE(TokensEqual("", ""));
}

TEST(ClusterToken, NewTokensAreLongRandomHex) {
  auto a = NewClusterToken();
  auto b = NewClusterToken();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 64u);
  EXPECT_EQ(a->find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(*a, *b);
}

TEST(ClusterToken, FileIsPrivateAndReadsBackTrimmed) {
  const std::string path = TempPath("flotilla-token-test");
  fs::remove(path);
  ASSERT_TRUE(WriteClusterTokenFile(path, "  s3cret \t").ok());
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_FALSE(WriteClusterTokenFile(path, "other").ok()) << "an existing file is not replaced";
  auto token = ReadClusterTokenFile(path);
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "s3cret");
  fs::remove(path);
}

TEST(ClusterToken, BadFilesAreRefusedClearly) {
  EXPECT_EQ(ReadClusterTokenFile("/nonexistent/token").status().code(),
            absl::StatusCode::kNotFound);
  const std::string path = TempPath("flotilla-token-bad");
  std::ofstream(path) << "\n\n";
  EXPECT_EQ(ReadClusterTokenFile(path).status().code(), absl::StatusCode::kInvalidArgument);
  std::ofstream(path) << std::string(10000, 'x');
  auto long_token = ReadClusterTokenFile(path);
  EXPECT_EQ(long_token.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(long_token.status().message().find("longer"), std::string::npos);
  fs::remove(path);
}

// ---- the manager, with scriptable sessions ----

using test_fakes::FakeSession;

ClusterOptions Options(int workers) {
  ClusterOptions o;
  o.expected_workers = workers;
  o.layout.tp_size = 1;
  o.model = ModelConfig::Tiny();
  o.model_path = "/models/tiny";
  o.heartbeat_interval = absl::Milliseconds(20);
  o.heartbeat_timeout = absl::Seconds(30);
  return o;
}

struct Member {
  std::shared_ptr<FakeSession> session = std::make_shared<FakeSession>();
  uint64_t id = 0;
};

Member Connect(ClusterManager& m, const std::string& worker_id) {
  Member w;
  w.id = m.OnSessionOpened(w.session);
  cluster::WorkerMessage hello;
  hello.mutable_hello()->set_worker_id(worker_id);
  hello.mutable_hello()->set_node("n0");
  m.OnWorkerMessage(w.id, hello);
  return w;
}

// Every ranked member reports Ready, then Joined.
void Serve(ClusterManager& m, std::vector<Member*> ranked) {
  for (Member* w : ranked) {
    auto a = w->session->Of(cluster::CoordinatorMessage::kAssignment);
    ASSERT_FALSE(a.empty());
    cluster::WorkerMessage ready;
    ready.mutable_ready()->set_generation(a.back().assignment().generation());
    ready.mutable_ready()->set_rank(a.back().assignment().rank());
    m.OnWorkerMessage(w->id, ready);
  }
  for (Member* w : ranked) {
    cluster::WorkerMessage joined;
    joined.mutable_joined()->set_generation(
        w->session->Of(cluster::CoordinatorMessage::kAssignment).back().assignment().generation());
    m.OnWorkerMessage(w->id, joined);
  }
  ASSERT_TRUE(m.WaitReady(absl::Seconds(1)));
}

cluster::WorkerMessage Tokens(uint64_t request_id, std::vector<int> tokens,
                              common::FinishReason finish) {
  cluster::WorkerMessage m;
  cluster::SequenceUpdate* u = m.mutable_tokens()->add_updates();
  u->set_request_id(request_id);
  for (int t : tokens) u->add_token_ids(t);
  u->set_finish_reason(finish);
  return m;
}

// What a client's stream saw.
struct Seen {
  std::mutex mu;
  std::vector<int> tokens;
  std::optional<absl::Status> done;
  RequestCallbacks Callbacks() {
    return {[this](const cluster::SequenceUpdate& u) {
              std::lock_guard<std::mutex> lock(mu);
              tokens.insert(tokens.end(), u.token_ids().begin(), u.token_ids().end());
            },
            [this](const absl::Status& s) {
              std::lock_guard<std::mutex> lock(mu);
              done = s;
            }};
  }
};

cluster::SubmitSequence Prompt() {
  cluster::SubmitSequence req;
  req.add_prompt_ids(5);
  return req;
}

TEST(ClusterMembership, AnUnassignedWorkerCannotWriteIntoARequest) {
  auto manager = *ClusterManager::Create(Options(1));
  Member leader = Connect(*manager, "w0");
  ASSERT_NO_FATAL_FAILURE(Serve(*manager, {&leader}));
  Member rogue = Connect(*manager, "rogue");  // registered, no rank
  Seen seen;
  auto id = manager->Submit(Prompt(), seen.Callbacks());
  ASSERT_TRUE(id.ok()) << id.status();

  manager->OnWorkerMessage(rogue.id, Tokens(*id, {66, 77}, common::STOP));
  {
    std::lock_guard<std::mutex> lock(seen.mu);
    EXPECT_TRUE(seen.tokens.empty());
    EXPECT_FALSE(seen.done.has_value()) << "the request is still running";
  }
  ASSERT_TRUE(rogue.session->Closed().has_value()) << "a violation ends the session";
  EXPECT_NE(rogue.session->Closed()->message().find("not assigned"), std::string::npos);
  EXPECT_EQ(manager->Status().state(), admin::READY);

  manager->OnWorkerMessage(leader.id, Tokens(*id, {7, 8}, common::LENGTH));
  std::lock_guard<std::mutex> lock(seen.mu);
  EXPECT_EQ(seen.tokens, (std::vector<int>{7, 8}));
  ASSERT_TRUE(seen.done.has_value());
  EXPECT_TRUE(seen.done->ok()) << *seen.done;
}

TEST(ClusterMembership, TheLeaderOfAnotherGroupCannotWriteIntoARequest) {
  auto manager = *ClusterManager::Create(Options(2));  // TP 1: two DP groups
  Member a = Connect(*manager, "w0");
  Member b = Connect(*manager, "w1");
  ASSERT_NO_FATAL_FAILURE(Serve(*manager, {&a, &b}));
  Seen seen;
  auto id = manager->Submit(Prompt(), seen.Callbacks());
  ASSERT_TRUE(id.ok());
  const bool a_leads = !a.session->Of(cluster::CoordinatorMessage::kSubmit).empty();
  Member& other = a_leads ? b : a;
  ASSERT_TRUE(other.session->Of(cluster::CoordinatorMessage::kSubmit).empty());

  manager->OnWorkerMessage(other.id, Tokens(*id, {66}, common::FINISH_REASON_UNSPECIFIED));
  std::lock_guard<std::mutex> lock(seen.mu);
  EXPECT_TRUE(seen.tokens.empty()) << "no foreign token reaches the client";
  EXPECT_TRUE(other.session->Closed().has_value());
}

// ---- the Session service over a real gRPC connection ----

using Stream = grpc::ClientReaderWriter<cluster::WorkerMessage, cluster::CoordinatorMessage>;

class ServedCoordinator {
 public:
  explicit ServedCoordinator(std::optional<std::string> token)
      : manager_(*ClusterManager::Create(Options(1))),
        control_(manager_.get(), std::move(token)),
        admin_(manager_.get()) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&control_);
    builder.RegisterService(&admin_);
    server_ = builder.BuildAndStart();
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                                   grpc::InsecureChannelCredentials());
  }
  ~ServedCoordinator() { server_->Shutdown(); }

  ClusterManager& manager() { return *manager_; }

  // A worker's session: presents `token` (if any) and says Hello.
  struct Session {
    grpc::ClientContext context;
    std::unique_ptr<Stream> stream;
  };
  std::unique_ptr<Session> Open(const std::string& worker_id, std::optional<std::string> token) {
    auto s = std::make_unique<Session>();
    if (token) s->context.AddMetadata(kClusterTokenMetadataKey, *token);
    s->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    s->stream = cluster::ClusterControl::NewStub(channel_)->Session(&s->context);
    cluster::WorkerMessage hello;
    hello.mutable_hello()->set_worker_id(worker_id);
    hello.mutable_hello()->set_node("n0");
    s->stream->Write(hello);
    return s;
  }

  admin::ClusterStatus Status() {
    grpc::ClientContext ctx;
    admin::ClusterStatus s;
    EXPECT_TRUE(admin::Admin::NewStub(channel_)->GetStatus(&ctx, {}, &s).ok());
    return s;
  }

 private:
  std::unique_ptr<ClusterManager> manager_;
  ClusterControlService control_;
  AdminService admin_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

// The next message of a kind, skipping others; false when the stream ends.
bool ReadKind(Stream& s, cluster::CoordinatorMessage::KindCase kind,
              cluster::CoordinatorMessage* out) {
  while (s.Read(out)) {
    if (out->kind_case() == kind) return true;
  }
  return false;
}

TEST(ClusterMembership, ASessionWithoutTheTokenOrWithAnotherIsRefusedAndRegistersNothing) {
  ServedCoordinator coordinator(std::string("the-right-token"));
  for (std::optional<std::string> token :
       {std::optional<std::string>(), std::optional<std::string>("another-clusters-token"),
        std::optional<std::string>("")}) {
    auto s = coordinator.Open("rogue", token);
    cluster::CoordinatorMessage m;
    EXPECT_FALSE(s->stream->Read(&m)) << "nothing is sent to a refused session";
    const grpc::Status st = s->stream->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
  }
  const admin::ClusterStatus status = coordinator.Status();
  EXPECT_EQ(status.workers_size(), 0) << status.DebugString();
  EXPECT_EQ(status.state(), admin::WAITING_FOR_WORKERS);

  auto member = coordinator.Open("w0", std::string("the-right-token"));
  cluster::CoordinatorMessage m;
  ASSERT_TRUE(ReadKind(*member->stream, cluster::CoordinatorMessage::kAssignment, &m));
  ASSERT_EQ(coordinator.Status().workers_size(), 1);
  EXPECT_EQ(coordinator.Status().workers(0).worker_id(), "w0");
  member->context.TryCancel();
}

TEST(ClusterMembership, WithoutATokenFileAnyoneMayJoinAsToday) {
  ServedCoordinator coordinator(std::nullopt);
  auto s = coordinator.Open("w0", std::nullopt);
  cluster::CoordinatorMessage m;
  ASSERT_TRUE(ReadKind(*s->stream, cluster::CoordinatorMessage::kAssignment, &m));
  EXPECT_EQ(coordinator.Status().workers_size(), 1);
  s->context.TryCancel();
}

TEST(ClusterMembership, AMemberWithTheTokenCannotInjectTokensIntoAnotherGroupsRequest) {
  const std::string token = "the-right-token";
  ServedCoordinator coordinator(token);
  auto leader = coordinator.Open("w0", token);
  cluster::CoordinatorMessage m;
  ASSERT_TRUE(ReadKind(*leader->stream, cluster::CoordinatorMessage::kAssignment, &m));
  cluster::WorkerMessage ready;
  ready.mutable_ready()->set_generation(m.assignment().generation());
  leader->stream->Write(ready);
  ASSERT_TRUE(ReadKind(*leader->stream, cluster::CoordinatorMessage::kStartComm, &m));
  cluster::WorkerMessage joined;
  joined.mutable_joined()->set_generation(m.start_comm().generation());
  leader->stream->Write(joined);
  ASSERT_TRUE(coordinator.manager().WaitReady(absl::Seconds(10)));

  auto rogue = coordinator.Open("rogue", token);  // authenticated, but a spare
  ASSERT_TRUE(ReadKind(*rogue->stream, cluster::CoordinatorMessage::kWelcome, &m));
  Seen seen;
  auto id = coordinator.manager().Submit(Prompt(), seen.Callbacks());
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(ReadKind(*leader->stream, cluster::CoordinatorMessage::kSubmit, &m));
  ASSERT_EQ(m.submit().request_id(), *id);

  // The rogue guesses the id and finishes the request with its own tokens.
  rogue->stream->Write(Tokens(*id, {66, 77, 88}, common::STOP));
  EXPECT_FALSE(ReadKind(*rogue->stream, cluster::CoordinatorMessage::kSubmit, &m));
  const grpc::Status ended = rogue->stream->Finish();
  EXPECT_FALSE(ended.ok());
  EXPECT_NE(ended.error_message().find("protocol violation"), std::string::npos)
      << ended.error_message();

  leader->stream->Write(Tokens(*id, {7, 8}, common::LENGTH));
  for (int i = 0; i < 500; ++i) {
    {
      std::lock_guard<std::mutex> lock(seen.mu);
      if (seen.done) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::lock_guard<std::mutex> lock(seen.mu);
  EXPECT_EQ(seen.tokens, (std::vector<int>{7, 8}));
  ASSERT_TRUE(seen.done.has_value());
  EXPECT_TRUE(seen.done->ok()) << *seen.done;
  leader->context.TryCancel();
}

}  // namespace
}  // namespace flotilla::coordinator
