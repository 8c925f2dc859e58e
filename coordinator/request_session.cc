#include "coordinator/request_session.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/tokenizer/streaming_detokenizer.h"

namespace flotilla::coordinator {
namespace {

// The prompt as text, for `echo` (bytes that are not UTF-8 become U+FFFD).
std::string PromptText(const tokenizer::Tokenizer* tok,
                       const std::vector<tokenizer::TokenId>& ids) {
  tokenizer::StreamingDetokenizer detok(tok,
                                        tokenizer::StreamingDetokenizer::InvalidBytes::kReplace);
  std::string text;
  for (tokenizer::TokenId id : ids) {
    absl::StatusOr<std::string> piece = detok.Append(id);
    if (piece.ok()) text += *piece;
  }
  absl::StatusOr<std::string> rest = detok.Finish();
  if (rest.ok()) text += *rest;
  return text;
}

}  // namespace

RequestSession::RequestSession(RequestBackend* backend, const tokenizer::Tokenizer* tokenizer,
                               SessionRequest request, Sink sink, SessionHooks hooks)
    : backend_(backend),
      tok_(tokenizer),
      request_(std::move(request)),
      sink_(std::move(sink)),
      hooks_(std::move(hooks)) {
  const uint32_t n = std::max<uint32_t>(request_.n, 1);
  for (uint32_t p = 0; p < request_.prompts.size(); ++p) {
    prompt_tokens_ += static_cast<uint32_t>(request_.prompts[p].size());
    for (uint32_t i = 0; i < n; ++i) {
      Choice c;
      c.index = p * n + i;
      c.prompt = p;
      c.prompt_tokens = static_cast<uint32_t>(request_.prompts[p].size());
      // Choice 0 keeps the seed itself, so one choice is named as before.
      std::string seed =
          c.index == 0 ? request_.call_id_seed : absl::StrCat(request_.call_id_seed, "-", c.index);
      c.decoder = std::make_unique<ChoiceDecoder>(tok_, request_.decoding, c.index, std::move(seed),
                                                  request_.stop);
      choices_.push_back(std::move(c));
    }
  }
}

absl::StatusOr<std::shared_ptr<RequestSession>> RequestSession::Start(
    RequestBackend* backend, const tokenizer::Tokenizer* tokenizer, SessionRequest request,
    Sink sink, SessionHooks hooks) {
  if (request.prompts.empty())
    return absl::InvalidArgumentError("prompt: the request has no prompt");
  std::shared_ptr<RequestSession> session(new RequestSession(backend, tokenizer, std::move(request),
                                                             std::move(sink), std::move(hooks)));
  if (session->request_.echo) {
    for (const Choice& c : session->choices_) {
      session->queue_.push_back(Item{Item::Kind::kEcho, c.index, {}, {}});
    }
  }
  const uint32_t n = std::max<uint32_t>(session->request_.n, 1);
  std::vector<uint64_t> submitted;
  for (uint32_t first = 0; first < session->choices_.size(); first += n) {
    session->choices_[first].submitting = true;
    absl::Status st = session->SubmitChoice(first);
    if (!st.ok()) {
      // Nothing of this request may go on: the prompts before were accepted.
      {
        std::lock_guard<std::mutex> lock(session->mu_);
        session->ended_ = true;
        session->released_ = true;  // the caller answers the refusal itself
        session->queue_.clear();
        for (Choice& c : session->choices_) {
          if (c.id != 0) submitted.push_back(c.id);
        }
      }
      for (uint64_t id : submitted)
        backend->Cancel(id,
                        absl::StrCat("another prompt of the request was refused: ", st.message()));
      return st;
    }
  }
  if (session->request_.deadline && session->hooks_.after) {
    std::weak_ptr<RequestSession> weak = session;
    session->hooks_.after(*session->request_.deadline - absl::Now() + absl::Seconds(1), [weak] {
      if (auto s = weak.lock())
        s->Fail(absl::DeadlineExceededError("the request's deadline passed"));
    });
  }
  bool schedule = false;
  {
    std::lock_guard<std::mutex> lock(session->mu_);
    if (!session->queue_.empty() && !session->pumping_) schedule = session->pumping_ = true;
  }
  if (schedule) {
    if (session->hooks_.run) {
      session->hooks_.run([session] { session->Pump(); });
    } else {
      session->Pump();
    }
  }
  return session;
}

absl::Status RequestSession::SubmitChoice(uint32_t index) {
  const Choice& choice = choices_[index];
  cluster::SubmitSequence submit = request_.submit;
  for (tokenizer::TokenId t : request_.prompts[choice.prompt]) {
    submit.add_prompt_ids(static_cast<int32_t>(t));
  }
  const uint32_t n = std::max<uint32_t>(request_.n, 1);
  if (submit.sampling().has_seed() && index % n != 0) {
    submit.mutable_sampling()->set_seed(submit.sampling().seed() + index % n);
  }
  if (request_.deadline) submit.set_deadline_unix_ms(absl::ToUnixMillis(*request_.deadline));
  std::shared_ptr<RequestSession> self = shared_from_this();
  RequestCallbacks cb;
  cb.on_accepted = [self, index](uint64_t id) {
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      self->choices_[index].id = id;
    }
    if (self->hooks_.on_accepted) self->hooks_.on_accepted(id);
  };
  cb.on_update = [self, index](const cluster::SequenceUpdate& u) { self->OnUpdate(index, u); };
  cb.on_done = [self, index](const absl::Status& st) {
    self->Enqueue(Item{Item::Kind::kDone, index, {}, st});
  };
  absl::StatusOr<uint64_t> id =
      backend_->SubmitRouted(std::move(submit), std::move(cb), request_.route_key);
  if (!id.ok()) return id.status();
  bool ended;
  {
    std::lock_guard<std::mutex> lock(mu_);
    choices_[index].id = *id;
    ended = ended_;
  }
  // The request failed while this choice was being submitted.
  if (ended) backend_->Cancel(*id, "the request already ended");
  return absl::OkStatus();
}

void RequestSession::Fail(absl::Status status) {
  // The cancels go out at once, not after the decoding queued before them;
  // the failure is queued first, so it (not their CANCELLED) ends the request.
  std::vector<uint64_t> live;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Choice& c : choices_) {
      if (!ended_ && c.id != 0 && !c.done && !c.finished) live.push_back(c.id);
    }
  }
  const std::string reason(status.message());
  const bool expired = status.code() == absl::StatusCode::kDeadlineExceeded;
  Enqueue(Item{Item::Kind::kFail, 0, {}, std::move(status)});
  for (uint64_t id : live) {
    if (expired) {
      backend_->Expire(id, reason);
    } else {
      backend_->Cancel(id, reason);
    }
  }
}

void RequestSession::Enqueue(Item item) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(item));
    if (pumping_) return;
    pumping_ = true;
  }
  std::shared_ptr<RequestSession> self = shared_from_this();
  if (hooks_.run) {
    hooks_.run([self] { self->Pump(); });
  } else {
    Pump();
  }
}

void RequestSession::OnUpdate(uint32_t choice, const cluster::SequenceUpdate& update) {
  if (!hooks_.run) {
    // Decoding on this thread and nothing queued: no copy of the update (its
    // prompt logits may be megabytes).
    std::unique_lock<std::mutex> lock(mu_);
    if (!pumping_ && queue_.empty()) {
      pumping_ = true;
      std::vector<RequestEvent> events;
      Actions actions;
      UpdateLocked(choices_[choice], update, events, actions);
      CheckReleasedLocked(actions);
      lock.unlock();
      if (!events.empty()) sink_(events);
      Run(std::move(actions));
      Pump();  // what came meanwhile; clears pumping_
      return;
    }
  }
  Enqueue(Item{Item::Kind::kUpdate, choice, update, {}});
}

void RequestSession::GrantPromptLogits(uint32_t choice, uint64_t allowed_bytes) {
  uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (choice >= choices_.size() || choices_[choice].done) return;
    id = choices_[choice].id;
  }
  if (id != 0) backend_->GrantPromptLogits(id, allowed_bytes);
}

void RequestSession::Pump() {
  while (true) {
    std::deque<Item> items;  // the kTokens events point into it until the sink returns
    std::vector<RequestEvent> events;
    Actions actions;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (queue_.empty()) {
        pumping_ = false;
        return;
      }
      items.swap(queue_);
      for (Item& item : items) HandleLocked(item, events, actions);
    }
    if (!events.empty()) sink_(events);
    Run(std::move(actions));
  }
}

void RequestSession::Run(Actions actions) {
  for (const auto& [id, reason] : actions.cancels) backend_->Cancel(id, reason);
  for (const auto& [id, reason] : actions.expires) backend_->Expire(id, reason);
  for (uint32_t index : actions.submits) {
    absl::Status st = SubmitChoice(index);
    if (!st.ok()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        choices_[index].submitting = false;
      }
      Fail(st);
    }
  }
  for (uint64_t id : actions.released) {
    if (hooks_.on_released) hooks_.on_released(id);
  }
  if (actions.all_released && hooks_.on_all_released) hooks_.on_all_released();
}

void RequestSession::HandleLocked(Item& item, std::vector<RequestEvent>& events, Actions& actions) {
  switch (item.kind) {
    case Item::Kind::kEcho: {
      Choice& c = choices_[item.choice];
      if (!ended_) c.decoder->Prepend(PromptText(tok_, request_.prompts[c.prompt]), events);
      break;
    }
    case Item::Kind::kUpdate:
      UpdateLocked(choices_[item.choice], item.update, events, actions);
      break;
    case Item::Kind::kDone:
      DoneLocked(choices_[item.choice], item.status, events, actions);
      break;
    case Item::Kind::kFail:
      FailLocked(item.status, events, actions);
      break;
  }
  CheckReleasedLocked(actions);
}

void RequestSession::SubmitSiblingsLocked(const Choice& choice, Actions& actions) {
  const uint32_t n = std::max<uint32_t>(request_.n, 1);
  if (choice.index % n != 0) return;
  for (uint32_t i = choice.index + 1; i < choice.index + n; ++i) {
    if (choices_[i].submitting) continue;
    choices_[i].submitting = true;
    actions.submits.push_back(i);
  }
}

void RequestSession::UpdateLocked(Choice& c, const cluster::SequenceUpdate& u,
                                  std::vector<RequestEvent>& events, Actions& actions) {
  // A worker's error ends the sequence through on_done.
  if (ended_ || c.finished || u.finish_reason() == common::ERROR) return;
  // Prompt logits come before the first token; the prompt is cached once a token is out.
  if (u.token_ids_size() > 0 || u.finish_reason() != common::FINISH_REASON_UNSPECIFIED) {
    SubmitSiblingsLocked(c, actions);
  }
  RequestEvent tokens;
  tokens.kind = RequestEvent::Kind::kTokens;
  tokens.choice = c.index;
  tokens.update = &u;
  events.push_back(std::move(tokens));
  c.tokens += static_cast<uint32_t>(u.token_ids_size());
  std::vector<tokenizer::TokenId> ids(u.token_ids().begin(), u.token_ids().end());
  c.decoder->Feed(ids, events);
  // The workers count the prompt they ran (truncate_prompt_tokens may have cut it).
  if (u.prompt_tokens() != 0) c.prompt_tokens = u.prompt_tokens();
  if (c.decoder->stopped_by_string()) {
    c.decoder->Finish(common::STOP, std::nullopt, TokenUsage{c.prompt_tokens, c.tokens}, events);
    c.finished = true;
    if (c.id != 0) actions.cancels.emplace_back(c.id, kStopStringCancel);
  } else if (u.finish_reason() != common::FINISH_REASON_UNSPECIFIED) {
    std::optional<tokenizer::TokenId> stop;
    if (u.has_stop_token()) stop = static_cast<tokenizer::TokenId>(u.stop_token());
    c.tokens = u.completion_tokens();
    c.decoder->Finish(u.finish_reason(), stop, TokenUsage{c.prompt_tokens, c.tokens}, events);
    c.finished = true;
  }
  if (!c.finished) return;
  for (const Choice& other : choices_) {
    if (!other.finished) return;
  }
  ended_ = true;
  RequestEvent end;
  end.kind = RequestEvent::Kind::kUsage;
  end.usage = UsageLocked();
  events.push_back(std::move(end));
}

void RequestSession::DoneLocked(Choice& c, const absl::Status& status,
                                std::vector<RequestEvent>& events, Actions& actions) {
  c.done = true;
  if (c.id != 0) actions.released.push_back(c.id);
  if (ended_ || c.finished) return;
  FailLocked(
      status.ok() ? absl::InternalError("the request ended without a finish reason") : status,
      events, actions);
}

void RequestSession::FailLocked(const absl::Status& status, std::vector<RequestEvent>& events,
                                Actions& actions) {
  if (ended_) return;
  ended_ = true;
  RequestEvent end;
  end.kind = RequestEvent::Kind::kError;
  end.status = status;
  end.usage = UsageLocked();
  events.push_back(std::move(end));
  auto& ends = status.code() == absl::StatusCode::kDeadlineExceeded ? actions.expires
                                                                      : actions.cancels;
  for (const Choice& c : choices_) {
    if (c.id != 0 && !c.done && !c.finished) ends.emplace_back(c.id, std::string(status.message()));
  }
}

void RequestSession::CheckReleasedLocked(Actions& actions) {
  if (released_ || !ended_) return;
  for (const Choice& c : choices_) {
    if (c.submitting && !c.done) return;
  }
  released_ = true;
  actions.all_released = true;
}

TokenUsage RequestSession::UsageLocked() const {
  TokenUsage usage;
  const uint32_t n = std::max<uint32_t>(request_.n, 1);
  for (const Choice& c : choices_) {
    if (c.index % n == 0) usage.prompt_tokens += c.prompt_tokens;  // each prompt once
    usage.completion_tokens += c.tokens;
    usage.reasoning_tokens += c.decoder->reasoning_tokens();
  }
  return usage;
}

}  // namespace flotilla::coordinator
