// One greedy Generate call over the client gRPC API, as the cluster tests
// make it: the tokens, prompt logits and finish it streamed, and what the
// stream looked like (its largest message, the largest gap between token
// messages).
#pragma once

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "proto/flotilla.grpc.pb.h"

namespace flotilla::cluster_test {

struct GreedyOptions {
  bool ignore_eos = false;     // exactly max_tokens
  bool prompt_logits = false;  // return_prompt_logits
  int deadline_s = 120;
  std::atomic<bool>* first = nullptr;  // set when the first tokens arrive
};

struct Streamed {
  grpc::Status status;
  std::vector<int32_t> tokens;
  std::vector<float> prompt_logits;  // in bounded chunks of whole rows, joined
  common::FinishReason finish = common::FINISH_REASON_UNSPECIFIED;
  size_t largest_message = 0;
  double largest_gap_s = 0;  // between consecutive token messages
};

inline Streamed GreedyGenerate(const std::string& address, const std::vector<int32_t>& prompt,
                               int max_tokens, const GreedyOptions& options = {}) {
  using Clock = std::chrono::steady_clock;
  auto stub =
      v1::Flotilla::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  v1::GenerateRequest req;
  for (int32_t t : prompt) req.mutable_prompt_ids()->add_ids(t);
  req.mutable_sampling()->set_temperature(0);
  req.mutable_sampling()->set_max_tokens(max_tokens);
  if (options.ignore_eos) req.mutable_sampling()->set_ignore_eos(true);
  req.set_return_prompt_logits(options.prompt_logits);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(options.deadline_s));
  auto reader = stub->Generate(&ctx, req);
  Streamed out;
  v1::GenerateResponse resp;
  std::optional<Clock::time_point> last_tokens;
  while (reader->Read(&resp)) {
    out.largest_message = std::max(out.largest_message, resp.ByteSizeLong());
    out.prompt_logits.insert(out.prompt_logits.end(), resp.prompt_logits().begin(),
                             resp.prompt_logits().end());
    if (resp.finish_reason() != common::FINISH_REASON_UNSPECIFIED)
      out.finish = resp.finish_reason();
    if (resp.token_ids().empty()) continue;
    const Clock::time_point now = Clock::now();
    if (last_tokens) {
      out.largest_gap_s =
          std::max(out.largest_gap_s, std::chrono::duration<double>(now - *last_tokens).count());
    }
    last_tokens = now;
    out.tokens.insert(out.tokens.end(), resp.token_ids().begin(), resp.token_ids().end());
    if (options.first != nullptr) options.first->store(true);
  }
  out.status = reader->Finish();
  return out;
}

}  // namespace flotilla::cluster_test
