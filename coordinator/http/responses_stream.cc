#include "coordinator/http/responses_stream.h"

#include "absl/strings/str_cat.h"
#include "common/harmony/openai.h"

namespace flotilla::coordinator {
namespace {

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

ResponsesStream::ResponsesStream(std::string id, std::string model, Json settings,
                                 int64_t created_at, const ReasoningCipher* seal)
    : id_(std::move(id)),
      model_(std::move(model)),
      settings_(std::move(settings)),
      created_at_(created_at),
      seal_(seal) {}

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

void ResponsesStream::OpenItem(Kind kind, const ToolCallPiece& call, std::vector<Json>& out) {
  CloseItem("completed", out);
  const size_t index = output_.size();
  Json item;
  switch (kind) {
    case Kind::kFunctionCall:
      item = Json{{"id", ItemId("fc_", id_, index)},
                  {"type", "function_call"},
                  {"status", "in_progress"},
                  {"arguments", ""},
                  {"call_id", call.id},
                  {"name", call.name}};
      break;
    case Kind::kReasoning:
      item = Json{{"id", ItemId("rs_", id_, index)},
                  {"type", "reasoning"},
                  {"summary", Json::array()},
                  {"content", Json::array()},
                  {"status", "in_progress"}};
      break;
    default:
      item = Json{{"id", ItemId("msg_", id_, index)},
                  {"type", "message"},
                  {"status", "in_progress"},
                  {"role", "assistant"},
                  {"content", Json::array()}};
      break;
  }
  open_ = kind;
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
    if (reasoning && seal_ != nullptr) {
      absl::StatusOr<std::string> sealed = seal_->Seal(open_text_);
      item["encrypted_content"] = sealed.ok() ? Json(*sealed) : Json(nullptr);
    }
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

void ResponsesStream::Handle(const RequestEvent& e, std::vector<Json>& out) {
  using EventKind = RequestEvent::Kind;
  switch (e.kind) {
    case EventKind::kMessageStart:
      if (e.message_kind == EventKind::kReasoning) {
        OpenItem(Kind::kReasoning, {}, out);
      } else if (e.message_kind == EventKind::kContent) {
        OpenItem(Kind::kMessage, {}, out);
      }
      break;  // a function call's item opens with its first piece, which has its id
    case EventKind::kReasoning:
    case EventKind::kContent:
      AppendDelta(e.text, out);
      break;
    case EventKind::kToolCall:
      if (!e.tool_call.id.empty()) OpenItem(Kind::kFunctionCall, e.tool_call, out);
      AppendDelta(e.tool_call.arguments, out);
      break;
    case EventKind::kMessageEnd:
      CloseItem("completed", out);
      break;
    case EventKind::kFinish:
      cut_ = e.finish_reason == "length";
      CloseItem(cut_ ? "incomplete" : "completed", out);
      break;
    case EventKind::kUsage:
      End(e.usage, out);
      break;
    case EventKind::kTokens:
    case EventKind::kError:
      break;
  }
}

std::vector<Json> ResponsesStream::Consume(const std::vector<RequestEvent>& events) {
  std::vector<Json> out;
  for (const RequestEvent& e : events) {
    if (finished_) break;
    Handle(e, out);
  }
  return out;
}

void ResponsesStream::End(const TokenUsage& usage, std::vector<Json>& out) {
  CloseItem(cut_ ? "incomplete" : "completed", out);
  usage_ = usage;
  finished_ = true;
  if (cut_) {
    status_ = "incomplete";
    incomplete_details_ = Json{{"reason", "max_output_tokens"}};
    out.push_back(Event("response.incomplete", Json{{"response", Response()}}));
  } else {
    status_ = "completed";
    out.push_back(Event("response.completed", Json{{"response", Response()}}));
  }
}

std::vector<Json> ResponsesStream::Abort(const char* status, Json error) {
  std::vector<Json> out;
  if (finished_) return out;
  CloseItem("incomplete", out);
  finished_ = true;
  status_ = status;
  error_ = std::move(error);
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
  r["error"] = error_;
  r["incomplete_details"] = incomplete_details_;
  r["model"] = model_;
  r["output"] = finished_ ? output_ : Json::array();
  for (const auto& [key, value] : settings_.items()) r[key] = value;
  if (finished_ && error_.is_null() && status_ != "cancelled") {
    r["usage"] = Json{{"input_tokens", usage_.prompt_tokens},
                      {"input_tokens_details", {{"cached_tokens", 0}}},
                      {"output_tokens", usage_.completion_tokens},
                      {"output_tokens_details", {{"reasoning_tokens", usage_.reasoning_tokens}}},
                      {"total_tokens", usage_.prompt_tokens + usage_.completion_tokens}};
  } else {
    r["usage"] = nullptr;
  }
  return r;
}

}  // namespace flotilla::coordinator
