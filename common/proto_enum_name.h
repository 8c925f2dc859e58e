// The word a proto enum value is spelled as in JSON and on terminals: its
// name in the .proto in lower case ("TOOL_CALLS" -> "tool_calls"), so the
// proto stays the one list of a closed set's names.
#pragma once

#include <optional>
#include <string>

#include "absl/strings/ascii.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/generated_enum_reflection.h"

namespace flotilla {

// nullopt for zero (every Flotilla enum's UNSPECIFIED: no word) and for a
// number the enum does not have.
template <typename E>
std::optional<std::string> LowerCaseEnumName(E value) {
  if (static_cast<int>(value) == 0) return std::nullopt;
  const google::protobuf::EnumValueDescriptor* entry =
      google::protobuf::GetEnumDescriptor<E>()->FindValueByNumber(static_cast<int>(value));
  if (entry == nullptr) return std::nullopt;
  return absl::AsciiStrToLower(entry->name());
}

}  // namespace flotilla
