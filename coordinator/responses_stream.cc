#include "coordinator/responses_stream.h"

#include "absl/strings/str_cat.h"
#include "coordinator/harmony/openai.h"

namespace flotilla::coordinator {
namespace {

constexpr char kFunctions[] = "functions.";

// "msg_" + 24 hex digits derived from the response id and the item's index:
// unique per response, and the same streamed or whole.
std::string ItemId(const char* prefix, const std::string& response_id, size_t index) {
  const std::string call_id = harmony::ToolCallId(response_id, index, prefix);  // "call_" + hex
  return absl::StrCat(prefix, call_id.substr(5));
}

Json TextPart(const char* type, const std::string& text) {
  Json part{{"type", type}, {"text", text}};
  if (std::string_view(type) == "output_text") {
    part["annotations"] = Json::array();
    part["logprobs"] = Json::array();
  }
  return part;
}

}  // namespace

ResponsesStream::ResponsesStream(const tokenizer::Tokenizer* tokenizer, std::string id,
                                 std::string model, Json settings, int64_t created_at)
    : tok_(tokenizer),
      id_(std::move(id)),
      model_(std::move(model)),
      settings_(std::move(settings)),
      created_at_(created_at),
      parser_(tokenizer, harmony::ParserOptions{harmony::Role::kAssistant, /*strict=*/false}) {}

Json ResponsesStream::Event(const char* type, Json fields) {
  Json e{{"type", type}, {"sequence_number", sequence_++}};
  for (auto& [key, value] : fields.items()) e[key] = std::move(value);
  return e;
}

Json ResponsesStream::ItemFields() const {
  Json e{{"item_id", output_.back()["id"]}, {"output_index", output_.size() - 1}};
  if (open_ != Kind::kFunctionCall) e["content_index"] = 0;
  return e;
}

std::vector<Json> ResponsesStream::Begin() {
  std::vector<Json> out;
  out.push_back(Event("response.created", Json{{"response", Response()}}));
  out.push_back(Event("response.in_progress", Json{{"response", Response()}}));
  return out;
}

void ResponsesStream::OpenItem(const harmony::Message& header, std::vector<Json>& out) {
  open_ = Kind::kNone;
  if (header.role != harmony::Role::kAssistant) return;
  const size_t index = output_.size();
  Json item;
  const bool function = header.recipient.rfind(kFunctions, 0) == 0;
  if (!function && !header.recipient.empty()) return;  // a built-in tool's call: not shown
  if (function) {
    const std::string name = header.recipient.substr(sizeof(kFunctions) - 1);
    open_ = Kind::kFunctionCall;
    item = Json{{"id", ItemId("fc_", id_, index)},
                {"type", "function_call"},
                {"status", "in_progress"},
                {"arguments", ""},
                {"call_id", harmony::ToolCallId(id_, function_calls_++, name)},
                {"name", name}};
  } else if (header.channel == "analysis") {
    open_ = Kind::kReasoning;
    item = Json{{"id", ItemId("rs_", id_, index)},
                {"type", "reasoning"},
                {"summary", Json::array()},
                {"content", Json::array()},
                {"status", "in_progress"}};
  } else {
    open_ = Kind::kMessage;
    item = Json{{"id", ItemId("msg_", id_, index)},
                {"type", "message"},
                {"status", "in_progress"},
                {"role", "assistant"},
                {"content", Json::array()}};
  }
  open_text_.clear();
  output_.push_back(item);
  out.push_back(Event("response.output_item.added", Json{{"output_index", index}, {"item", item}}));
  if (open_ == Kind::kFunctionCall) return;
  Json fields = ItemFields();
  fields["part"] = TextPart(open_ == Kind::kReasoning ? "reasoning_text" : "output_text", "");
  out.push_back(Event("response.content_part.added", std::move(fields)));
}

void ResponsesStream::AppendDelta(const std::string& delta, std::vector<Json>& out) {
  if (open_ == Kind::kNone || delta.empty()) return;
  open_text_ += delta;
  Json fields = ItemFields();
  fields["delta"] = delta;
  switch (open_) {
    case Kind::kReasoning:
      out.push_back(Event("response.reasoning_text.delta", std::move(fields)));
      break;
    case Kind::kMessage:
      fields["logprobs"] = Json::array();
      out.push_back(Event("response.output_text.delta", std::move(fields)));
      break;
    default:
      out.push_back(Event("response.function_call_arguments.delta", std::move(fields)));
      break;
  }
}

void ResponsesStream::CloseItem(const char* status, std::vector<Json>& out) {
  if (open_ == Kind::kNone) return;
  Json& item = OpenItemJson();
  Json fields = ItemFields();
  if (open_ == Kind::kFunctionCall) {
    item["arguments"] = open_text_;
    fields["arguments"] = open_text_;
    out.push_back(Event("response.function_call_arguments.done", std::move(fields)));
  } else {
    const bool reasoning = open_ == Kind::kReasoning;
    Json part = TextPart(reasoning ? "reasoning_text" : "output_text", open_text_);
    item["content"] = Json::array({part});
    fields["text"] = open_text_;
    if (!reasoning) fields["logprobs"] = Json::array();
    out.push_back(
        Event(reasoning ? "response.reasoning_text.done" : "response.output_text.done", fields));
    fields.erase("text");
    fields.erase("logprobs");
    fields["part"] = std::move(part);
    out.push_back(Event("response.content_part.done", std::move(fields)));
  }
  item["status"] = status;
  out.push_back(Event("response.output_item.done",
                      Json{{"output_index", output_.size() - 1}, {"item", item}}));
  open_ = Kind::kNone;
  open_text_.clear();
}

void ResponsesStream::ProcessToken(tokenizer::TokenId token, std::vector<Json>& out) {
  absl::StatusOr<harmony::StreamParser::Event> event = parser_.Process(token);
  if (!event.ok()) return;  // non-strict: only ids outside the vocabulary fail; skip them
  using E = harmony::StreamParser::Event;
  switch (*event) {
    case E::kMessageStarted:
      OpenItem(parser_.current(), out);
      break;
    case E::kContentDelta:
      if (open_ == Kind::kReasoning) ++reasoning_tokens_;
      AppendDelta(parser_.last_content_delta(), out);
      break;
    case E::kMessageEnded:
      if (open_ == Kind::kReasoning) ++reasoning_tokens_;
      AppendDelta(parser_.last_content_delta(), out);
      CloseItem("completed", out);
      break;
    default:
      break;
  }
}

std::vector<Json> ResponsesStream::Feed(const std::vector<tokenizer::TokenId>& tokens) {
  std::vector<Json> out;
  if (finished_) return out;
  for (tokenizer::TokenId t : tokens) ProcessToken(t, out);
  return out;
}

std::vector<Json> ResponsesStream::FeedUpdate(const cluster::SequenceUpdate& update) {
  return Feed(
      std::vector<tokenizer::TokenId>(update.token_ids().begin(), update.token_ids().end()));
}

std::vector<Json> ResponsesStream::Finish(common::FinishReason reason,
                                          std::optional<tokenizer::TokenId> stop_token,
                                          uint32_t prompt_tokens, uint32_t completion_tokens) {
  std::vector<Json> out;
  if (finished_) return out;
  if (stop_token) ProcessToken(*stop_token, out);
  const bool cut = reason == common::LENGTH;
  const bool in_header = parser_.state() == harmony::StreamParser::State::kHeader;
  const size_t before = parser_.messages().size();
  // Non-strict: a header the limit cut off is recovered into a message whose
  // text was never streamed; it becomes an item now, as chat completions
  // shows it (a random or confused model may never reach `<|message|>`).
  if (parser_.Finish().ok() && in_header && parser_.messages().size() > before) {
    const harmony::Message& recovered = parser_.messages().back();
    if (recovered.recipient.empty() && !recovered.content.empty()) {
      OpenItem(recovered, out);
      AppendDelta(recovered.content, out);
    }
  }
  CloseItem(cut ? "incomplete" : "completed", out);
  prompt_tokens_ = prompt_tokens;
  completion_tokens_ = completion_tokens;
  finished_ = true;
  if (cut) {
    status_ = "incomplete";
    incomplete_details_ = Json{{"reason", "max_output_tokens"}};
    out.push_back(Event("response.incomplete", Json{{"response", Response()}}));
  } else {
    status_ = "completed";
    out.push_back(Event("response.completed", Json{{"response", Response()}}));
  }
  return out;
}

Json ResponsesStream::ErrorEvent(const std::string& code, const std::string& message,
                                 const std::string& param) {
  return Event("error", Json{{"code", code.empty() ? Json(nullptr) : Json(code)},
                             {"message", message},
                             {"param", param.empty() ? Json(nullptr) : Json(param)}});
}

Json ResponsesStream::Response() const {
  Json r;
  r["id"] = id_;
  r["object"] = "response";
  r["created_at"] = created_at_;
  r["status"] = status_;
  r["error"] = nullptr;
  r["incomplete_details"] = incomplete_details_;
  r["model"] = model_;
  r["output"] = finished_ ? output_ : Json::array();
  for (const auto& [key, value] : settings_.items()) r[key] = value;
  if (finished_) {
    r["usage"] = Json{{"input_tokens", prompt_tokens_},
                      {"input_tokens_details", {{"cached_tokens", 0}}},
                      {"output_tokens", completion_tokens_},
                      {"output_tokens_details", {{"reasoning_tokens", reasoning_tokens_}}},
                      {"total_tokens", prompt_tokens_ + completion_tokens_}};
  } else {
    r["usage"] = nullptr;
  }
  return r;
}

}  // namespace flotilla::coordinator
