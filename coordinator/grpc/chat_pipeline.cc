#include "coordinator/grpc/chat_pipeline.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"

namespace flotilla::coordinator {

v1::ChatResponse::FinishReason ChatFinishReason(std::string_view r) {
  if (r == "stop") return v1::ChatResponse::STOP;
  if (r == "length") return v1::ChatResponse::LENGTH;
  if (r == "tool_calls") return v1::ChatResponse::TOOL_CALLS;
  return v1::ChatResponse::FINISH_REASON_UNSPECIFIED;
}

// ---- ChatStream ----

ChatStream::ChatStream(const tokenizer::Tokenizer* tokenizer, std::string request_id,
                       std::string call_id_seed, std::vector<std::string> stop,
                       uint32_t prompt_tokens, bool return_token_ids, uint32_t choices)
    : request_id_(std::move(request_id)),
      prompt_tokens_(prompt_tokens),
      decoder_(tokenizer, Decoding::kHarmony, 0, std::move(call_id_seed), std::move(stop)),
      return_token_ids_(return_token_ids),
      choices_(std::max<uint32_t>(choices, 1)) {}

v1::ChatResponse ChatStream::Begin() const {
  v1::ChatResponse r;
  r.set_request_id(request_id_);
  return r;
}

namespace {

// Adjacent text on the same channel goes into one delta.
void AppendText(bool reasoning, const std::string& text, v1::ChatResponse& out) {
  if (text.empty()) return;
  if (out.deltas_size() > 0) {
    v1::ChatDelta* last = out.mutable_deltas(out.deltas_size() - 1);
    if (reasoning && last->has_reasoning()) {
      last->mutable_reasoning()->append(text);
      return;
    }
    if (!reasoning && last->has_content()) {
      last->mutable_content()->append(text);
      return;
    }
  }
  v1::ChatDelta* delta = out.add_deltas();
  if (reasoning) {
    delta->set_reasoning(text);
  } else {
    delta->set_content(text);
  }
}

// A call's later argument pieces join its last delta.
void AppendToolCall(const ToolCallPiece& piece, v1::ChatResponse& out) {
  if (out.deltas_size() > 0 && piece.id.empty() && piece.name.empty()) {
    v1::ChatDelta* last = out.mutable_deltas(out.deltas_size() - 1);
    if (last->has_tool_call() && last->tool_call().index() == piece.index) {
      last->mutable_tool_call()->mutable_arguments()->append(piece.arguments);
      return;
    }
  }
  if (piece.id.empty() && piece.name.empty() && piece.arguments.empty()) return;
  v1::ToolCallDelta* call = out.add_deltas()->mutable_tool_call();
  call->set_index(piece.index);
  call->set_id(piece.id);
  call->set_name(piece.name);
  call->set_arguments(piece.arguments);
}

}  // namespace

void ChatStream::SetEnd(v1::ChatResponse& out, v1::ChatResponse::FinishReason reason,
                        uint32_t prompt_tokens, uint32_t completion_tokens) {
  if (++choices_finished_ >= choices_) finished_ = true;
  out.set_finish_reason(reason);
  out.mutable_usage()->set_prompt_tokens(prompt_tokens);
  out.mutable_usage()->set_completion_tokens(completion_tokens);
}

bool ChatStream::HasNews(const v1::ChatResponse& r) {
  return r.finish_reason() != v1::ChatResponse::FINISH_REASON_UNSPECIFIED || !r.deltas().empty() ||
         !r.logprobs().empty() || !r.token_ids().empty();
}

std::vector<v1::ChatResponse> ChatStream::Consume(const std::vector<RequestEvent>& events) {
  if (finished_) return {};
  // One message per choice the batch speaks of, in the order they first appear.
  std::vector<v1::ChatResponse> out;
  std::vector<int> slot(choices_, -1);
  auto message = [&](uint32_t choice) -> v1::ChatResponse& {
    if (slot[choice] < 0) {
      slot[choice] = static_cast<int>(out.size());
      out.emplace_back().set_request_id(request_id_);
      out.back().set_index(choice);
    }
    return out[static_cast<size_t>(slot[choice])];
  };
  for (const RequestEvent& e : events) {
    if (e.choice >= choices_) continue;
    switch (e.kind) {
      case RequestEvent::Kind::kTokens: {
        if (e.update == nullptr) break;
        v1::ChatResponse& r = message(e.choice);
        tokens_seen_ += static_cast<uint32_t>(e.update->token_ids_size());
        r.mutable_logprobs()->MergeFrom(e.update->logprobs());
        if (return_token_ids_) {
          r.mutable_token_ids()->MergeFrom(e.update->token_ids());
          if (e.update->has_stop_token()) r.add_token_ids(e.update->stop_token());
        }
        break;
      }
      case RequestEvent::Kind::kReasoning:
      case RequestEvent::Kind::kContent:
        AppendText(e.kind == RequestEvent::Kind::kReasoning, e.text, message(e.choice));
        break;
      case RequestEvent::Kind::kToolCall:
        AppendToolCall(e.tool_call, message(e.choice));
        break;
      case RequestEvent::Kind::kMessageStart:
      case RequestEvent::Kind::kMessageEnd:
        break;  // the deltas say their channel; messages are not shown
      case RequestEvent::Kind::kFinish:
        SetEnd(message(e.choice), ChatFinishReason(e.finish_reason), e.usage.prompt_tokens,
               e.usage.completion_tokens);
        break;
      case RequestEvent::Kind::kUsage:
      case RequestEvent::Kind::kError:
        break;  // the caller ends the stream
    }
  }
  std::vector<v1::ChatResponse> news;
  for (v1::ChatResponse& r : out) {
    if (HasNews(r)) news.push_back(std::move(r));
  }
  return news;
}

std::optional<v1::ChatResponse> ChatStream::Feed(const cluster::SequenceUpdate& u) {
  if (finished_ || u.finish_reason() == common::ERROR) return std::nullopt;
  std::vector<RequestEvent> events(1);
  events[0].kind = RequestEvent::Kind::kTokens;
  events[0].update = &u;
  std::vector<tokenizer::TokenId> ids(u.token_ids().begin(), u.token_ids().end());
  decoder_.Feed(ids, events);
  const uint32_t seen = tokens_seen_ + static_cast<uint32_t>(u.token_ids_size());
  if (decoder_.stopped_by_string()) {
    decoder_.Finish(common::STOP, std::nullopt, TokenUsage{prompt_tokens_, seen}, events);
  } else if (u.finish_reason() != common::FINISH_REASON_UNSPECIFIED) {
    std::optional<tokenizer::TokenId> stop;
    if (u.has_stop_token()) stop = static_cast<tokenizer::TokenId>(u.stop_token());
    const uint32_t prompt = u.prompt_tokens() ? u.prompt_tokens() : prompt_tokens_;
    decoder_.Finish(u.finish_reason(), stop, TokenUsage{prompt, u.completion_tokens()}, events);
  }
  std::vector<v1::ChatResponse> out = Consume(events);
  if (out.empty()) return std::nullopt;
  return std::move(out.front());
}

v1::ChatResponse ChatStream::Cancelled() {
  v1::ChatResponse r;
  r.set_request_id(request_id_);
  if (!finished_) {
    finished_ = true;
    r.set_finish_reason(v1::ChatResponse::CANCELLED);
    r.mutable_usage()->set_prompt_tokens(prompt_tokens_);
    r.mutable_usage()->set_completion_tokens(tokens_seen_);
  }
  return r;
}

}  // namespace flotilla::coordinator
