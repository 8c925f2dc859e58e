#include "coordinator/http/responses_items.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "coordinator/json_fields.h"

namespace flotilla::coordinator {
namespace {

using json_fields::Field;
using json_fields::Invalid;
using json_fields::RequiredString;

// The text of a content array, each part one of `types` (or a string).
absl::StatusOr<std::string> PartsText(const Json& content, const std::string& where,
                                      std::initializer_list<const char*> types) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return Invalid(where, "must be a string or an array of content parts");
  std::string text;
  for (size_t k = 0; k < content.size(); ++k) {
    const std::string pw = absl::StrCat(where, "[", k, "]");
    const Json& part = content[k];
    if (!part.is_object()) return Invalid(pw, "must be an object");
    FLOTILLA_ASSIGN_OR_RETURN(std::string type, RequiredString(part, "type", pw));
    bool allowed = false;
    for (const char* t : types) allowed = allowed || type == t;
    if (!allowed) {
      std::string list;
      for (const char* t : types) absl::StrAppend(&list, list.empty() ? "" : ", ", t);
      return Invalid(pw + ".type",
                     absl::StrCat("'", type, "' is not supported here (expected ", list, ")"));
    }
    FLOTILLA_ASSIGN_OR_RETURN(std::string piece, RequiredString(part, "text", pw));
    text += piece;
  }
  return text;
}

}  // namespace

ChatMessageBuilder::ChatMessageBuilder(std::vector<harmony::ChatMessage>* messages,
                                       const ReasoningCipher* cipher)
    : messages_(messages), cipher_(cipher) {}

absl::Status ChatMessageBuilder::Add(const Json& item, const std::string& where, Naming naming) {
  if (!item.is_object()) return Invalid(where, "must be an object");
  naming_ = naming;
  std::string type = "message";  // EasyInputMessage: {role, content} without a type
  if (const Json* t = Field(item, "type"); t != nullptr) {
    if (!t->is_string()) return Invalid(where + ".type", "must be a string");
    type = t->get<std::string>();
  }
  if (type == "message") return AddMessage(item, where);
  if (type == "reasoning") return AddReasoning(item, where);
  if (type == "function_call") return AddCall(item, where);
  if (type == "function_call_output") return AddOutput(item, where);
  return Invalid(where + ".type", absl::StrCat("item type '", type,
                                               "' is not supported (expected message, reasoning, "
                                               "function_call or function_call_output)"));
}

void ChatMessageBuilder::Flush() {
  if (!pending_) return;
  messages_->push_back(*std::move(pending_));
  pending_.reset();
  pending_reasoning_ = pending_content_ = false;
}

absl::Status ChatMessageBuilder::AddMessage(const Json& item, const std::string& where) {
  FLOTILLA_ASSIGN_OR_RETURN(std::string role, RequiredString(item, "role", where));
  const Json* content = Field(item, "content");
  if (content == nullptr) return Invalid(where + ".content", "is required");
  if (role == "assistant") {
    FLOTILLA_ASSIGN_OR_RETURN(
        std::string text, PartsText(*content, where + ".content", {"output_text", "input_text"}));
    if (pending_content_ || (pending_ && !pending_->tool_calls.empty())) Flush();
    harmony::ChatMessage& m = Pending(where);
    m.content = std::move(text);
    m.content_field = Part(where, ".content");
    pending_content_ = true;
    return absl::OkStatus();
  }
  harmony::ChatMessage m;
  if (role == "user") {
    m.role = harmony::ChatRole::kUser;
  } else if (role == "system") {
    m.role = harmony::ChatRole::kSystem;
  } else if (role == "developer") {
    m.role = harmony::ChatRole::kDeveloper;
  } else {
    return Invalid(
        where + ".role",
        absl::StrCat("unknown role '", role, "' (expected user, system, developer or assistant)"));
  }
  FLOTILLA_ASSIGN_OR_RETURN(m.content, PartsText(*content, where + ".content", {"input_text"}));
  m.field = where;
  m.content_field = Part(where, ".content");
  Push(std::move(m));
  return absl::OkStatus();
}

absl::Status ChatMessageBuilder::AddReasoning(const Json& item, const std::string& where) {
  std::string text;
  std::string field = Part(where, ".content");
  if (const Json* sealed = Field(item, "encrypted_content"); sealed != nullptr) {
    // The server's own words: they stand for the item, whatever its content says.
    FLOTILLA_ASSIGN_OR_RETURN(text, OpenReasoning(*sealed, where + ".encrypted_content"));
    field = Part(where, ".encrypted_content");
  } else if (const Json* content = Field(item, "content"); content != nullptr) {
    FLOTILLA_ASSIGN_OR_RETURN(text, PartsText(*content, where + ".content", {"reasoning_text"}));
  }
  if (text.empty()) {
    if (const Json* summary = Field(item, "summary"); summary != nullptr) {
      FLOTILLA_ASSIGN_OR_RETURN(text, PartsText(*summary, where + ".summary", {"summary_text"}));
      field = Part(where, ".summary");
    }
  }
  if (pending_reasoning_ || pending_content_ || (pending_ && !pending_->tool_calls.empty())) {
    Flush();
  }
  harmony::ChatMessage& m = Pending(where);
  m.reasoning = std::move(text);
  m.reasoning_field = std::move(field);
  pending_reasoning_ = true;
  return absl::OkStatus();
}

absl::StatusOr<std::string> ChatMessageBuilder::OpenReasoning(const Json& sealed,
                                                              const std::string& where) const {
  if (!sealed.is_string()) return Invalid(where, "must be a string");
  if (cipher_ == nullptr) return Invalid(where, "cannot be opened here (no reasoning key)");
  absl::StatusOr<std::string> text = cipher_->Open(sealed.get_ref<const std::string&>());
  if (!text.ok()) return Invalid(where, std::string(text.status().message()));
  return text;
}

absl::Status ChatMessageBuilder::AddCall(const Json& item, const std::string& where) {
  harmony::ChatToolCall call;
  FLOTILLA_ASSIGN_OR_RETURN(call.id, RequiredString(item, "call_id", where));
  FLOTILLA_ASSIGN_OR_RETURN(call.name, RequiredString(item, "name", where));
  FLOTILLA_ASSIGN_OR_RETURN(call.arguments, RequiredString(item, "arguments", where));
  call.field = where;
  Pending(where).tool_calls.push_back(std::move(call));
  return absl::OkStatus();
}

absl::Status ChatMessageBuilder::AddOutput(const Json& item, const std::string& where) {
  harmony::ChatMessage m;
  m.role = harmony::ChatRole::kTool;
  FLOTILLA_ASSIGN_OR_RETURN(m.tool_call_id, RequiredString(item, "call_id", where));
  const Json* output = Field(item, "output");
  if (output == nullptr) return Invalid(where + ".output", "is required");
  FLOTILLA_ASSIGN_OR_RETURN(m.content, PartsText(*output, where + ".output", {"input_text"}));
  m.field = where;
  m.tool_call_id_field = Part(where, ".call_id");
  m.content_field = Part(where, ".output");
  Push(std::move(m));
  return absl::OkStatus();
}

std::string ChatMessageBuilder::Part(const std::string& where, const char* suffix) const {
  return naming_ == Naming::kWholeItem ? where : where + suffix;
}

harmony::ChatMessage& ChatMessageBuilder::Pending(const std::string& where) {
  if (!pending_) {
    pending_.emplace();
    pending_->role = harmony::ChatRole::kAssistant;
    pending_->field = where;
  }
  return *pending_;
}

void ChatMessageBuilder::Push(harmony::ChatMessage message) {
  Flush();
  messages_->push_back(std::move(message));
}

}  // namespace flotilla::coordinator
