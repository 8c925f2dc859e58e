// libflotilla_client: the C++ SDK for Flotilla's client API (flotilla.v1).
// Blocking and streaming generation and chat, cancel, deadlines, and retries
// on UNAVAILABLE before the first message arrives (a retry never repeats
// tokens).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tls_credentials.h"
#include "proto/flotilla.grpc.pb.h"

namespace flotilla::client {

struct ClientOptions {
  std::string address = "127.0.0.1:50051";
  absl::Duration deadline = absl::Minutes(10);  // per request
  int max_attempts = 3;                          // tries while no token has arrived
  absl::Duration retry_backoff = absl::Milliseconds(200);  // doubles per retry
  // Sent as "authorization: Bearer KEY" on every call. Empty: the
  // FLOTILLA_API_KEY environment variable, when set; else no key.
  std::string api_key;
  // TLS: tls.ca (a PEM CA file) verifies the server's certificate; tls.cert and
  // tls.key (PEM) are this client's certificate where the server asks for one
  // (--tls-client-ca). Empty: plaintext.
  TlsClientFiles tls;
};

// The whole of one generation.
struct GenerateResult {
  std::string request_id;
  std::vector<int32_t> token_ids;
  std::string text;
  std::vector<common::TokenLogprob> logprobs;
  common::FinishReason finish_reason = common::FINISH_REASON_UNSPECIFIED;
  std::optional<int32_t> stop_token;
  uint32_t prompt_tokens = 0;
  uint32_t completion_tokens = 0;
  std::vector<float> prompt_logits;
};

// A function call of a chat reply.
struct ChatToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text
};

// The whole of one chat reply.
struct ChatResult {
  std::string request_id;
  std::string content;    // the answer
  std::string reasoning;  // the reasoning (analysis channel)
  std::vector<ChatToolCall> tool_calls;
  std::vector<common::TokenLogprob> logprobs;
  std::vector<int32_t> token_ids;  // with return_token_ids: the raw completion
  v1::ChatResponse::FinishReason finish_reason = v1::ChatResponse::FINISH_REASON_UNSPECIFIED;
  uint32_t prompt_tokens = 0;
  uint32_t completion_tokens = 0;

  // Adds one streamed response (what the blocking Chat does with each).
  void Add(const v1::ChatResponse& response);
  // The reply as an ASSISTANT message, to continue the conversation with.
  v1::ChatMessage AsMessage() const;
};

// A message with `role` and `content`.
v1::ChatMessage MakeChatMessage(v1::ChatMessage::Role role, std::string content);
// The result of tool call `call_id` (the function's name is optional).
v1::ChatMessage MakeToolResult(std::string call_id, std::string content, std::string name = "");

// Cancels a streaming call from another thread.
class CancelHandle {
 public:
  void Cancel();
  bool cancelled() const { return cancelled_; }

 private:
  friend class Client;
  void Attach(grpc::ClientContext* ctx);
  void Detach();
  std::mutex mu_;
  grpc::ClientContext* ctx_ = nullptr;
  std::atomic<bool> cancelled_{false};
};

class Client {
 public:
  static absl::StatusOr<std::unique_ptr<Client>> Create(ClientOptions options);

  // Streams the response; `on_chunk` sees every message as it arrives.
  // Returns the final status (CANCELLED after `cancel`).
  absl::Status GenerateStream(const v1::GenerateRequest& request,
                              const std::function<void(const v1::GenerateResponse&)>& on_chunk,
                              CancelHandle* cancel = nullptr);
  // Blocking: waits for the whole generation.
  absl::StatusOr<GenerateResult> Generate(const v1::GenerateRequest& request);
  // Chat, streamed: `on_chunk` sees every response (the first carries only
  // the request id; then reasoning, answer and tool-call deltas; the last the
  // finish reason and usage). Returns the final status (CANCELLED after `cancel`).
  absl::Status ChatStream(const v1::ChatRequest& request,
                          const std::function<void(const v1::ChatResponse&)>& on_chunk,
                          CancelHandle* cancel = nullptr);
  // Chat, blocking: waits for the whole reply.
  absl::StatusOr<ChatResult> Chat(const v1::ChatRequest& request);
  // Cancels a request by the id its stream reported: false when no running
  // request of this key has that id.
  absl::StatusOr<bool> Cancel(const std::string& request_id);
  absl::StatusOr<v1::ListModelsResponse> ListModels();

 private:
  Client(ClientOptions options, std::shared_ptr<grpc::ChannelCredentials> credentials);
  // Sets the deadline and the API key of one call.
  void Prepare(grpc::ClientContext& ctx, std::chrono::system_clock::time_point deadline) const;
  // Runs a server-streaming call with the deadline and the retry policy.
  template <typename Request, typename Response, typename StartFn>
  absl::Status Stream(const Request& request, StartFn start,
                      const std::function<void(const Response&)>& on_chunk, CancelHandle* cancel);
  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Flotilla::Stub> stub_;
};

}  // namespace flotilla::client
