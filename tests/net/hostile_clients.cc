#include "tests/net/hostile_clients.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "tests/cluster_options.h"

namespace flotilla::flow_test {

cli::LocalClusterOptions FlowControlCluster(const std::string& log_tag) {
  setenv("FLOTILLA_MAX_STREAM_BUFFER_BYTES", "65536", 0);
  setenv("FLOTILLA_MAX_CLIENT_BUFFER_BYTES", "1048576", 0);
  setenv("FLOTILLA_CLIENT_STALL_TIMEOUT_S", "1", 0);
  cli::LocalClusterOptions o = testing_util::TestClusterOptions("", 1, 0, log_tag);
  o.heartbeat_timeout_ms = 15000;
  return o;
}
namespace {

using Json = nlohmann::json;

// Whether a client running until `until` (or `stop`) goes on.
bool GoOn(std::chrono::steady_clock::time_point until, const std::atomic<bool>* stop) {
  return std::chrono::steady_clock::now() < until && (stop == nullptr || !stop->load());
}

std::string Host(const std::string& address) { return address.substr(0, address.rfind(':')); }
int Port(const std::string& address) { return std::stoi(address.substr(address.rfind(':') + 1)); }

// A connected socket to `address` with a small receive buffer, or -1.
int SlowSocket(const std::string& address) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  int small = 4096;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  timeval timeout{30, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(Port(address)));
  inet_pton(AF_INET, Host(address).c_str(), &to.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v == nullptr ? fallback : std::atoi(v);
}

long RssKb(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

std::unique_ptr<v1::Flotilla::Stub> Stub(const std::string& address, int index) {
  grpc::ChannelArguments args;
  args.SetInt("flotilla.test.channel", index);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return v1::Flotilla::NewStub(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
}

double Metric(const std::string& http_address, const std::string& name) {
  httplib::Client c("http://" + http_address);
  c.set_read_timeout(30, 0);
  auto res = c.Get("/metrics");
  if (!res || res->status != 200) return -1;
  std::istringstream lines(res->body);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(name, 0) != 0 || line.size() <= name.size()) continue;
    if (line[name.size()] != '{' && line[name.size()] != ' ') continue;
    return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return 0;
}

void NeverReader::Run(const std::string& address, int index,
                      std::chrono::steady_clock::time_point until, const std::atomic<bool>* stop) {
  auto stub = Stub(address, index);
  v1::GenerateRequest req;
  for (int i = 0; i < prompt_tokens; ++i) {
    req.mutable_prompt_ids()->add_ids((i * 7919 + index) % 1000 + 1);
  }
  req.mutable_sampling()->set_max_tokens(1);
  req.set_return_prompt_logits(true);
  while (GoOn(until, stop)) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader = stub->Generate(&ctx, req);
    ++streams;
    std::this_thread::sleep_for(hold);
    ctx.TryCancel();
    const grpc::Status st = reader->Finish();
    if (!st.ok()) ++not_ok, last_error = st.error_message();
  }
}

void SlowReader::Run(const std::string& address, const std::string& model, int index,
                     std::chrono::steady_clock::time_point until, const std::atomic<bool>* stop) {
  const std::string body = Json{
      {"model", model},   {"messages", {{{"role", "user"}, {"content", "Tell me a long story."}}}},
      {"stream", true},   {"max_tokens", 3000},
      {"logprobs", true}, {"top_logprobs", 20},
      {"seed", index}}.dump();
  const std::string request =
      "POST /v1/chat/completions HTTP/1.1\r\nHost: " + address +
      "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\n\r\n" + body;
  while (GoOn(until, stop)) {
    const int fd = SlowSocket(address);
    if (fd < 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
        static_cast<ssize_t>(request.size())) {
      close(fd);
      continue;
    }
    ++streams;
    std::string tail;  // the last bytes read, to see [DONE]
    bool done = false;
    while (GoOn(until, stop)) {
      char buf[256];
      const ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      tail.append(buf, static_cast<size_t>(n));
      if (tail.find("[DONE]") != std::string::npos) done = true;
      if (tail.size() > 64) tail.erase(0, tail.size() - 64);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    close(fd);
    if (done) {
      ++finished;
    } else if (GoOn(until, stop)) {
      ++cut;
    }
  }
}

std::chrono::duration<double> TimedGenerate(const std::string& address, int max_tokens,
                                            std::string* error) {
  auto stub = Stub(address, 1000);
  v1::GenerateRequest req;
  for (int t : {1, 2, 3, 4, 5}) req.mutable_prompt_ids()->add_ids(t);
  req.mutable_sampling()->set_max_tokens(max_tokens);
  req.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  const auto start = std::chrono::steady_clock::now();
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse resp;
  int tokens = 0;
  while (reader->Read(&resp)) tokens += resp.token_ids_size();
  const grpc::Status st = reader->Finish();
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  if (!st.ok()) {
    *error = st.error_message();
    return std::chrono::duration<double>(-1);
  }
  if (tokens != max_tokens) {
    *error = "got " + std::to_string(tokens) + " tokens of " + std::to_string(max_tokens);
    return std::chrono::duration<double>(-1);
  }
  return took;
}

}  // namespace flotilla::flow_test
