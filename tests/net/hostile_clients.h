// Clients that do not read what they asked for, and an ordinary one, for the
// flow-control tests (flow_control_test, flow_control_latency_test): gRPC
// prompt-logits streams never read, HTTP chat streams read a few bytes at a
// time, and a short request whose latency is measured.
#pragma once

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "proto/flotilla.grpc.pb.h"
#include "tools/cli/local_cluster.h"

namespace flotilla::flow_test {

// The cluster the flow-control tests start: one worker of one thread, the
// client bounds small unless the environment sets them (64 KiB a stream,
// 1 MiB in all, one second of grace), and a heartbeat timeout a loaded
// 2-core machine does not trip (not these tests' subject); the children's
// logs in testing_util::TestLogDir(log_tag).
cli::LocalClusterOptions FlowControlCluster(const std::string& log_tag);

// An integer from the environment, else `fallback`.
int EnvInt(const char* name, int fallback);

// VmRSS of `pid` in kB; -1 when unreadable.
long RssKb(pid_t pid);

// A stub on a channel of its own (no shared connection, so one stream's
// unread bytes do not hold up another's window).
std::unique_ptr<v1::Flotilla::Stub> Stub(const std::string& address, int index);

// The value of series `name` on the coordinator's /metrics (-1: unreadable,
// 0: absent).
double Metric(const std::string& http_address, const std::string& name);

// One gRPC client that asks for the logits of a `prompt_tokens` prompt and
// never reads: each stream is held for `hold`, then cancelled, then another
// one opened, until `until` (or `stop`, when given, is set).
struct NeverReader {
  int prompt_tokens = 4;
  std::chrono::seconds hold{4};
  int streams = 0;
  int not_ok = 0;  // streams that did not end OK (ended by the server, or cancelled here)
  std::string last_error;
  void Run(const std::string& address, int index, std::chrono::steady_clock::time_point until,
           const std::atomic<bool>* stop = nullptr);
};

// One HTTP client that streams a long chat completion (20 top logprobs a
// token, so each event is large) and reads it 256 bytes every 100 ms through
// a small receive buffer; over again when the server ends it, until `until`
// (or `stop`, when given, is set).
struct SlowReader {
  int streams = 0;
  int cut = 0;       // streams the server ended before [DONE]
  int finished = 0;  // streams read to [DONE]
  void Run(const std::string& address, const std::string& model, int index,
           std::chrono::steady_clock::time_point until, const std::atomic<bool>* stop = nullptr);
};

// An ordinary gRPC client's request: a 5-token prompt, `max_tokens` tokens
// (end of sequence ignored), read as they come. Its latency, or a negative
// duration when it did not end OK with every token (`error` says why).
std::chrono::duration<double> TimedGenerate(const std::string& address, int max_tokens,
                                            std::string* error);

}  // namespace flotilla::flow_test
