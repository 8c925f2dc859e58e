// One generation request, whatever API asked for it: RequestSession submits
// its sequences to the cluster (prompts x n choices), decodes each choice's
// tokens (ChoiceDecoder: Harmony or plain text, stop strings), cancels a
// choice whose text hit a stop string, enforces the deadline, cancels on
// request, and emits typed events (request_events.h). The HTTP chat,
// completions and Responses endpoints and the gRPC Chat and Generate calls
// serialize them.
//
// Events of a request, per choice in order: [kContent echo] then, per worker
// update, kTokens and the text it made (kReasoning / kContent / kToolCall,
// within kMessageStart ... kMessageEnd for Harmony), and at the end kFinish.
// Choices interleave. Then exactly one terminal
// event: kUsage (every choice finished) or kError (the first failure:
// cancel, deadline, a worker lost ...). Nothing follows it.
//
// The n choices of one prompt share its KV cache blocks: the first is
// submitted alone, the others once it has produced its first token, when its
// prompt's blocks are in the workers' prefix cache, so they start from them.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/choice_decoder.h"
#include "coordinator/cluster/cluster_manager.h"
#include "coordinator/request_events.h"

namespace flotilla::coordinator {

// The cluster as a request sees it: ClusterManager, or a scripted fake in tests.
class RequestBackend {
 public:
  virtual ~RequestBackend() = default;
  // As ClusterManager::Submit: the id, or why the sequence was refused.
  virtual absl::StatusOr<uint64_t> Submit(cluster::SubmitSequence request,
                                          RequestCallbacks callbacks) = 0;
  // Submit with ClusterManager::Submit's route_key; backends without
  // instances ignore it.
  virtual absl::StatusOr<uint64_t> SubmitRouted(cluster::SubmitSequence request,
                                                RequestCallbacks callbacks,
                                                const std::string& route_key) {
    return Submit(std::move(request), std::move(callbacks));
  }
  // As ClusterManager::Cancel.
  virtual bool Cancel(uint64_t request_id, const std::string& reason) = 0;
  // Cancel for a request that ended at its deadline (counted as a deadline
  // where the backend keeps counts).
  virtual bool Expire(uint64_t request_id, const std::string& reason) {
    return Cancel(request_id, reason);
  }
  // As ClusterManager::GrantPromptLogits: the sequence may have sent
  // `allowed_bytes` of prompt logits in all. Backends whose sequences never
  // wait for credit (scripted fakes) have nothing to do.
  virtual void GrantPromptLogits(uint64_t request_id, uint64_t allowed_bytes) {}
};

// RequestBackend on a ClusterManager (which must outlive it).
class ClusterBackend final : public RequestBackend {
 public:
  explicit ClusterBackend(ClusterManager* manager) : manager_(manager) {}
  absl::StatusOr<uint64_t> Submit(cluster::SubmitSequence request,
                                  RequestCallbacks callbacks) override {
    return manager_->Submit(std::move(request), std::move(callbacks));
  }
  absl::StatusOr<uint64_t> SubmitRouted(cluster::SubmitSequence request, RequestCallbacks callbacks,
                                        const std::string& route_key) override {
    return manager_->Submit(std::move(request), std::move(callbacks), route_key);
  }
  bool Cancel(uint64_t request_id, const std::string& reason) override {
    return manager_->Cancel(request_id, reason);
  }
  bool Expire(uint64_t request_id, const std::string& reason) override {
    return manager_->Cancel(request_id, reason, absl::StatusCode::kDeadlineExceeded);
  }
  void GrantPromptLogits(uint64_t request_id, uint64_t allowed_bytes) override {
    manager_->GrantPromptLogits(request_id, allowed_bytes);
  }

 private:
  ClusterManager* manager_;
};

// What to generate.
struct SessionRequest {
  Decoding decoding = Decoding::kText;
  std::vector<std::vector<tokenizer::TokenId>> prompts;  // at least one
  uint32_t n = 1;                                        // choices per prompt
  // Everything each sequence is submitted with but its prompt and deadline
  // (sampling, constraint, return_prompt_logits). With a seed, choice i of a
  // prompt samples with seed + i: the choices differ, and are reproducible.
  cluster::SubmitSequence submit;
  std::vector<std::string> stop;  // stop strings of the answer text
  bool echo = false;              // each choice's text starts with its prompt, decoded
  std::string call_id_seed;       // function call ids; the choice is added for choices > 0
  std::optional<absl::Time> deadline;
  std::string route_key;  // keeps related requests on one instance (ClusterManager::Submit)
};

// Where the session runs and whom it tells about its sequences.
struct SessionHooks {
  // Runs the session's decoding and its sink, one task at a time; null: on
  // the thread that delivered the worker's update.
  std::function<void(std::function<void()>)> run;
  // Calls a function after a delay: the deadline's backstop (the request
  // fails DEADLINE_EXCEEDED one second past it if the workers have not ended
  // it). Null: the workers' deadline only.
  std::function<void(absl::Duration, std::function<void()>)> after;
  std::function<void(uint64_t)> on_accepted;  // each sequence the cluster took
  std::function<void(uint64_t)> on_released;  // each sequence that ended there
  std::function<void()> on_all_released;      // no sequence is left in the cluster
};

class RequestSession : public std::enable_shared_from_this<RequestSession> {
 public:
  // Gets the events of one worker update (or one session step), in order,
  // never two calls at once.
  using Sink = std::function<void(const std::vector<RequestEvent>&)>;

  // Submits the first choice of every prompt; the error of the first refusal
  // otherwise (nothing is left running then, and the sink is never called).
  // `backend` and `tokenizer` must outlive the session.
  static absl::StatusOr<std::shared_ptr<RequestSession>> Start(
      RequestBackend* backend, const tokenizer::Tokenizer* tokenizer, SessionRequest request,
      Sink sink, SessionHooks hooks = {});

  // Ends the request with `status` (a kError event, after what is already
  // queued) and cancels its sequences at once; nothing once it ended.
  void Fail(absl::Status status);
  // Fail with CANCELLED.
  void Cancel(const std::string& reason) { Fail(absl::CancelledError(reason)); }
  // The client took prompt logits of `choice`: its sequence may have sent
  // `allowed_bytes` of them in all (RequestBackend::GrantPromptLogits).
  // Nothing before the choice was accepted or once it is done.
  void GrantPromptLogits(uint32_t choice, uint64_t allowed_bytes);

  uint32_t choices() const { return static_cast<uint32_t>(choices_.size()); }
  // Prompt tokens over all prompts as submitted (each counted once).
  uint32_t prompt_tokens() const { return prompt_tokens_; }

 private:
  struct Choice {
    uint32_t index = 0;
    uint32_t prompt = 0;
    std::unique_ptr<ChoiceDecoder> decoder;
    uint64_t id = 0;          // the cluster's id; 0 until accepted
    bool submitting = false;  // submitted, or about to be
    bool done = false;        // its on_done came
    bool finished = false;    // its kFinish was emitted
    uint32_t tokens = 0;
    uint32_t prompt_tokens = 0;  // as the workers ran it
  };
  // One thing that happened to a choice (or to the whole session).
  struct Item {
    enum class Kind { kEcho, kUpdate, kDone, kFail } kind;
    uint32_t choice = 0;
    cluster::SequenceUpdate update;
    absl::Status status;
  };
  // What a step asks to do once the lock is released.
  struct Actions {
    std::vector<std::pair<uint64_t, std::string>> cancels;
    // Sequences of a request that ended at its deadline (RequestBackend::Expire).
    std::vector<std::pair<uint64_t, std::string>> expires;
    std::vector<uint32_t> submits;
    std::vector<uint64_t> released;
    bool all_released = false;
  };

  RequestSession(RequestBackend* backend, const tokenizer::Tokenizer* tokenizer,
                 SessionRequest request, Sink sink, SessionHooks hooks);
  absl::Status SubmitChoice(uint32_t choice);
  void OnUpdate(uint32_t choice, const cluster::SequenceUpdate& update);
  void Enqueue(Item item);
  void Pump();
  void HandleLocked(Item& item, std::vector<RequestEvent>& events, Actions& actions);
  void UpdateLocked(Choice& choice, const cluster::SequenceUpdate& update,
                    std::vector<RequestEvent>& events, Actions& actions);
  void DoneLocked(Choice& choice, const absl::Status& status, std::vector<RequestEvent>& events,
                  Actions& actions);
  void FailLocked(const absl::Status& status, std::vector<RequestEvent>& events, Actions& actions);
  // The later choices of `choice`'s prompt, once it started generating.
  void SubmitSiblingsLocked(const Choice& choice, Actions& actions);
  void CheckReleasedLocked(Actions& actions);
  TokenUsage UsageLocked() const;
  void Run(Actions actions);

  RequestBackend* backend_;
  const tokenizer::Tokenizer* tok_;
  SessionRequest request_;
  Sink sink_;
  SessionHooks hooks_;
  uint32_t prompt_tokens_ = 0;

  std::mutex mu_;
  std::vector<Choice> choices_;  // fixed size; fields under mu_
  std::deque<Item> queue_;       // under mu_
  bool pumping_ = false;         // under mu_
  bool ended_ = false;           // under mu_: the terminal event was emitted
  bool released_ = false;        // under mu_: on_all_released was called
};

}  // namespace flotilla::coordinator
