// libflotilla_client: the C++ SDK for Flotilla's client API (flotilla.v1).
// Blocking and streaming generation, cancel, deadlines, and retries on
// UNAVAILABLE before the first token arrives (a retry never repeats tokens).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/flotilla.grpc.pb.h"

namespace flotilla::client {

struct ClientOptions {
  std::string address = "127.0.0.1:50051";
  absl::Duration deadline = absl::Minutes(10);  // per request
  int max_attempts = 3;                          // tries while no token has arrived
  absl::Duration retry_backoff = absl::Milliseconds(200);  // doubles per retry
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
  // Cancels a request by the id its stream reported.
  absl::StatusOr<bool> Cancel(const std::string& request_id);
  absl::StatusOr<v1::ListModelsResponse> ListModels();

 private:
  explicit Client(ClientOptions options);
  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Flotilla::Stub> stub_;
};

}  // namespace flotilla::client
