// Names of a closed set, written once as a table: each value beside the word
// flags, logs and metrics spell it, so the name of a value and the parser of a
// name read the same lines and cannot drift apart.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace flotilla {

template <typename E>
struct EnumName {
  E value;
  const char* name;
};

// The name `table` gives `value`; null when the table does not list it.
template <typename E, size_t N>
const char* NameIn(const EnumName<E> (&table)[N], E value) {
  for (const EnumName<E>& entry : table) {
    if (entry.value == value) return entry.name;
  }
  return nullptr;
}

// The value `table` names `name`; nullopt when no entry spells it.
template <typename E, size_t N>
std::optional<E> ValueIn(const EnumName<E> (&table)[N], std::string_view name) {
  for (const EnumName<E>& entry : table) {
    if (name == entry.name) return entry.value;
  }
  return std::nullopt;
}

// Every name of `table` in its order, joined by ", " (for messages and --help).
template <typename E, size_t N>
std::string NamesIn(const EnumName<E> (&table)[N]) {
  std::string out;
  for (const EnumName<E>& entry : table) {
    if (!out.empty()) out += ", ";
    out += entry.name;
  }
  return out;
}

}  // namespace flotilla
