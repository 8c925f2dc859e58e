// A RequestBackend for tests of what the coordinator makes of a cluster's
// answers: it keeps what was submitted, and the test answers each sequence
// (updates, the end, a refusal) when it chooses.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/request_session.h"
#include "proto/cluster.pb.h"

namespace flotilla::test_support {

class FakeBackend : public coordinator::RequestBackend {
 public:
  struct Sequence {
    cluster::SubmitSequence request;
    coordinator::RequestCallbacks callbacks;
    std::string cancelled;  // the cancel reason, if cancelled
  };
  absl::StatusOr<uint64_t> Submit(cluster::SubmitSequence request,
                                  coordinator::RequestCallbacks callbacks) override {
    if (refuse_after == 0) return absl::UnavailableError("no workers");
    if (refuse_after > 0) --refuse_after;
    const uint64_t id = next_id++;
    if (callbacks.on_accepted) callbacks.on_accepted(id);
    sequences[id] = Sequence{std::move(request), std::move(callbacks), ""};
    return id;
  }
  bool Cancel(uint64_t id, const std::string& reason) override {
    auto it = sequences.find(id);
    if (it == sequences.end() || !it->second.cancelled.empty()) return false;
    it->second.cancelled = reason;
    it->second.callbacks.on_done(absl::CancelledError(reason));
    return true;
  }
  // A worker update of sequence `id`: tokens, and the finish when given.
  void Update(uint64_t id, const std::vector<tokenizer::TokenId>& tokens,
              common::FinishReason finish = common::FINISH_REASON_UNSPECIFIED,
              std::optional<tokenizer::TokenId> stop_token = std::nullopt,
              uint32_t completion = 0) {
    cluster::SequenceUpdate u;
    u.set_request_id(id);
    for (tokenizer::TokenId t : tokens) u.add_token_ids(static_cast<int32_t>(t));
    u.set_finish_reason(finish);
    if (stop_token) u.set_stop_token(static_cast<int32_t>(*stop_token));
    u.set_completion_tokens(completion);
    sequences.at(id).callbacks.on_update(u);
  }
  void Done(uint64_t id, absl::Status status = absl::OkStatus()) {
    sequences.at(id).callbacks.on_done(status);
  }
  std::vector<tokenizer::TokenId> Prompt(uint64_t id) const {
    const auto& ids = sequences.at(id).request.prompt_ids();
    return std::vector<tokenizer::TokenId>(ids.begin(), ids.end());
  }

  std::map<uint64_t, Sequence> sequences;
  uint64_t next_id = 1;
  int refuse_after = -1;  // -1: never; k: accept k more, then refuse
};

}  // namespace flotilla::test_support
