#include "coordinator/choice_decoder.h"

#include <utility>

namespace flotilla::coordinator {
namespace {

constexpr std::string_view kFunctions = "functions.";

// What the answer shows of a message, as ChatDeltaMapper streams it: an
// assistant's reasoning, answer text or function call; a built-in tool's
// call or another role's message is not shown.
bool Shown(const harmony::Message& m) {
  return m.role == harmony::Role::kAssistant &&
         (m.recipient.empty() || m.recipient.starts_with(kFunctions));
}

bool IsReasoning(const harmony::Message& m) {
  return m.role == harmony::Role::kAssistant && m.recipient.empty() && m.channel == "analysis";
}

}  // namespace

std::string FinishReasonName(common::FinishReason worker_reason, bool tool_call) {
  // The length limit may cut a call's arguments anywhere: a call is finished
  // only when the turn ended on its end token, never when the limit ended it.
  if (worker_reason != common::STOP) return "length";
  return tool_call ? "tool_calls" : "stop";
}

ChoiceDecoder::ChoiceDecoder(const tokenizer::Tokenizer* tokenizer, Decoding decoding,
                             uint32_t choice, std::string call_id_seed,
                             std::vector<std::string> stop)
    : tok_(tokenizer),
      decoding_(decoding),
      choice_(choice),
      filter_(std::move(stop)),
      // Not strict: the model's slips (a missing <|message|>) are recovered as
      // the reference parser does, never an error in the middle of a stream.
      parser_(tokenizer, harmony::ParserOptions{harmony::Role::kAssistant, /*strict=*/false}),
      mapper_(std::move(call_id_seed)),
      detok_(tokenizer, tokenizer::StreamingDetokenizer::InvalidBytes::kReplace) {}

RequestEvent ChoiceDecoder::Event(RequestEvent::Kind kind) const {
  RequestEvent e;
  e.kind = kind;
  e.choice = choice_;
  return e;
}

void ChoiceDecoder::EmitContent(const std::string& text, std::vector<RequestEvent>& out) const {
  if (text.empty()) return;
  RequestEvent e = Event(RequestEvent::Kind::kContent);
  e.text = text;
  out.push_back(std::move(e));
}

void ChoiceDecoder::Prepend(std::string_view text, std::vector<RequestEvent>& out) const {
  EmitContent(std::string(text), out);
}

void ChoiceDecoder::EmitDelta(const nlohmann::ordered_json& d, std::vector<RequestEvent>& out) {
  if (auto c = d.find("content"); c != d.end()) {
    EmitContent(filter_.Push(c->get<std::string>()), out);
  } else if (auto r = d.find("reasoning_content"); r != d.end()) {
    RequestEvent e = Event(RequestEvent::Kind::kReasoning);
    e.text = r->get<std::string>();
    out.push_back(std::move(e));
  } else if (auto t = d.find("tool_calls"); t != d.end()) {
    for (const nlohmann::ordered_json& call : *t) {
      RequestEvent e = Event(RequestEvent::Kind::kToolCall);
      e.tool_call.index = call.value("index", 0u);
      e.tool_call.id = call.value("id", "");
      const nlohmann::ordered_json fn =
          call.contains("function") ? call["function"] : nlohmann::ordered_json::object();
      e.tool_call.name = fn.value("name", "");
      e.tool_call.arguments = fn.value("arguments", "");
      tool_calls_ = true;
      out.push_back(std::move(e));
    }
  }
}

void ChoiceDecoder::EmitMessageStart(const harmony::Message& m,
                                     std::vector<RequestEvent>& out) const {
  if (!Shown(m)) return;
  RequestEvent e = Event(RequestEvent::Kind::kMessageStart);
  if (!m.recipient.empty()) {
    e.message_kind = RequestEvent::Kind::kToolCall;
  } else if (m.channel == "analysis") {
    e.message_kind = RequestEvent::Kind::kReasoning;
  }
  out.push_back(std::move(e));
}

void ChoiceDecoder::ProcessToken(tokenizer::TokenId token, std::vector<RequestEvent>& out) {
  if (decoding_ == Decoding::kText) {
    absl::StatusOr<std::string> piece = detok_.Append(token);
    if (piece.ok()) EmitContent(filter_.Push(*piece), out);
    return;
  }
  using ParserEvent = harmony::StreamParser::Event;
  absl::StatusOr<ParserEvent> ev = parser_.Process(token);
  if (!ev.ok()) return;  // non-strict: only ids outside the vocabulary fail; skip them
  if (*ev == ParserEvent::kMessageStarted) EmitMessageStart(parser_.current(), out);
  const bool ended = *ev == ParserEvent::kMessageEnded;
  if ((*ev == ParserEvent::kContentDelta && IsReasoning(parser_.current())) ||
      (ended && IsReasoning(parser_.messages().back()))) {
    ++reasoning_tokens_;
  }
  for (const nlohmann::ordered_json& d : mapper_.OnEvent(parser_, *ev)) EmitDelta(d, out);
  if (ended && Shown(parser_.messages().back())) {
    out.push_back(Event(RequestEvent::Kind::kMessageEnd));
  }
}

void ChoiceDecoder::Feed(absl::Span<const tokenizer::TokenId> tokens,
                         std::vector<RequestEvent>& out) {
  if (finished_) return;
  for (tokenizer::TokenId t : tokens) {
    if (filter_.hit()) return;
    ProcessToken(t, out);
  }
}

void ChoiceDecoder::EmitRecovered(std::vector<RequestEvent>& out) {
  const bool in_header = parser_.state() == harmony::StreamParser::State::kHeader;
  const size_t before = parser_.messages().size();
  // Non-strict: a header cut off by the length limit is recovered into a
  // message whose text was never streamed; stream it now, as MapReply shows it.
  if (!parser_.Finish().ok() || !in_header || parser_.messages().size() == before) return;
  const harmony::Message& m = parser_.messages().back();
  if (m.role != harmony::Role::kAssistant || !m.recipient.empty() || m.content.empty()) return;
  // No kMessageEnd: the limit cut it, and kFinish says so.
  EmitMessageStart(m, out);
  if (m.channel == "analysis") {
    RequestEvent e = Event(RequestEvent::Kind::kReasoning);
    e.text = m.content;
    out.push_back(std::move(e));
  } else {
    EmitContent(filter_.Push(m.content), out);
  }
}

void ChoiceDecoder::Finish(common::FinishReason reason,
                           std::optional<tokenizer::TokenId> stop_token, TokenUsage usage,
                           std::vector<RequestEvent>& out) {
  if (finished_) return;
  if (!filter_.hit()) {
    if (decoding_ == Decoding::kHarmony) {
      // An end token of Harmony's (or another special token a request
      // stops on) ends the message; an ordinary token of stop_token_ids is
      // left out of the text, as in completions.
      if (stop_token && *stop_token >= tokenizer::kFirstSpecialId) ProcessToken(*stop_token, out);
      EmitRecovered(out);
    } else {
      absl::StatusOr<std::string> rest = detok_.Finish();
      if (rest.ok()) EmitContent(filter_.Push(*rest), out);
    }
    EmitContent(filter_.Flush(), out);
  }
  finished_ = true;
  RequestEvent e = Event(RequestEvent::Kind::kFinish);
  e.stopped_by_string = filter_.hit();
  e.worker_reason = filter_.hit() ? common::STOP : reason;
  e.finish_reason = FinishReasonName(e.worker_reason, tool_calls_);
  e.usage = usage;
  e.usage.reasoning_tokens = reasoning_tokens_;
  out.push_back(std::move(e));
}

}  // namespace flotilla::coordinator
