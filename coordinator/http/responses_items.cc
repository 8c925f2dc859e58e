#include "coordinator/http/responses_items.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "coordinator/json_fields.h"

namespace flotilla::coordinator {
namespace {

using json_fields::Invalid;
using json_fields::Field;
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

ChatMessageBuilder::ChatMessageBuilder(Json* messages, std::vector<std::string>* origin,
                                       const ReasoningCipher* cipher)
    : messages_(messages), origin_(origin), cipher_(cipher) {}

absl::Status ChatMessageBuilder::Add(const Json& item, const std::string& where) {
  if (!item.is_object()) return Invalid(where, "must be an object");
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
  if (pending_.is_null()) return;
  messages_->push_back(std::move(pending_));
  origin_->push_back(pending_origin_);
  pending_ = Json();
}

absl::Status ChatMessageBuilder::AddMessage(const Json& item, const std::string& where) {
  FLOTILLA_ASSIGN_OR_RETURN(std::string role, RequiredString(item, "role", where));
  const Json* content = Field(item, "content");
  if (content == nullptr) return Invalid(where + ".content", "is required");
  if (role == "assistant") {
    FLOTILLA_ASSIGN_OR_RETURN(
        std::string text, PartsText(*content, where + ".content", {"output_text", "input_text"}));
    if (Has("content") || Has("tool_calls")) Flush();
    Pending(where)["content"] = text;
    return absl::OkStatus();
  }
  if (role != "user" && role != "system" && role != "developer") {
    return Invalid(
        where + ".role",
        absl::StrCat("unknown role '", role, "' (expected user, system, developer or assistant)"));
  }
  FLOTILLA_ASSIGN_OR_RETURN(std::string text,
                            PartsText(*content, where + ".content", {"input_text"}));
  Push(Json{{"role", role}, {"content", text}}, where);
  return absl::OkStatus();
}

absl::Status ChatMessageBuilder::AddReasoning(const Json& item, const std::string& where) {
  std::string text;
  if (const Json* sealed = Field(item, "encrypted_content"); sealed != nullptr) {
    // The server's own words: they stand for the item, whatever its content says.
    FLOTILLA_ASSIGN_OR_RETURN(text, OpenReasoning(*sealed, where + ".encrypted_content"));
  } else if (const Json* content = Field(item, "content"); content != nullptr) {
    FLOTILLA_ASSIGN_OR_RETURN(text, PartsText(*content, where + ".content", {"reasoning_text"}));
  }
  if (text.empty()) {
    if (const Json* summary = Field(item, "summary"); summary != nullptr) {
      FLOTILLA_ASSIGN_OR_RETURN(text, PartsText(*summary, where + ".summary", {"summary_text"}));
    }
  }
  if (Has("reasoning_content") || Has("content") || Has("tool_calls")) Flush();
  Pending(where)["reasoning_content"] = text;
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
  FLOTILLA_ASSIGN_OR_RETURN(std::string call_id, RequiredString(item, "call_id", where));
  FLOTILLA_ASSIGN_OR_RETURN(std::string name, RequiredString(item, "name", where));
  FLOTILLA_ASSIGN_OR_RETURN(std::string arguments, RequiredString(item, "arguments", where));
  Json& pending = Pending(where);
  if (!pending.contains("tool_calls")) pending["tool_calls"] = Json::array();
  pending["tool_calls"].push_back(Json{{"id", call_id},
                                       {"type", "function"},
                                       {"function", {{"name", name}, {"arguments", arguments}}}});
  return absl::OkStatus();
}

absl::Status ChatMessageBuilder::AddOutput(const Json& item, const std::string& where) {
  FLOTILLA_ASSIGN_OR_RETURN(std::string call_id, RequiredString(item, "call_id", where));
  const Json* output = Field(item, "output");
  if (output == nullptr) return Invalid(where + ".output", "is required");
  FLOTILLA_ASSIGN_OR_RETURN(std::string text,
                            PartsText(*output, where + ".output", {"input_text"}));
  Push(Json{{"role", "tool"}, {"tool_call_id", call_id}, {"content", text}}, where);
  return absl::OkStatus();
}

bool ChatMessageBuilder::Has(const char* key) const {
  return pending_.is_object() && pending_.contains(key);
}

Json& ChatMessageBuilder::Pending(const std::string& where) {
  if (pending_.is_null()) {
    pending_ = Json{{"role", "assistant"}};
    pending_origin_ = where;
  }
  return pending_;
}

void ChatMessageBuilder::Push(Json message, const std::string& where) {
  Flush();
  messages_->push_back(std::move(message));
  origin_->push_back(where);
}

}  // namespace flotilla::coordinator
