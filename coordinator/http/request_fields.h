// The request field policy of the OpenAI-shaped APIs (chat completions,
// completions, Responses): which top-level fields each endpoint knows (every
// field of OpenAI's current request schemas, plus vLLM's extras this server
// acts on), and what happens to a field it does not know: by default it is
// ignored and reported (the `x-flotilla-ignored-fields` response header and
// a log line), under --strict-request-fields it is a 400 naming it. Which
// known fields are acted on and which are documented no-ops is the table in
// coordinator/README.md ("Request fields").
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace flotilla::coordinator {

enum class UnknownFields {
  kIgnore,  // ignored, named in the response header and the log
  kRefuse,  // INVALID_ARGUMENT naming the field (--strict-request-fields)
};

// The response header naming the fields a request carried that were ignored.
inline constexpr char kIgnoredFieldsHeader[] = "x-flotilla-ignored-fields";

// The top-level fields each endpoint knows.
absl::Span<const char* const> ChatFields();
absl::Span<const char* const> CompletionFields();
absl::Span<const char* const> ResponsesFields();

// Checks the members of one object of a request against what is known there
// and keeps the names of those ignored.
class FieldCheck {
 public:
  explicit FieldCheck(UnknownFields policy) : policy_(policy) {}

  // Every member of `object` not in `known`: ignored (its name, `prefix` +
  // key, noted), or under kRefuse INVALID_ARGUMENT "NAME: is not a field ..."
  // for the first. `object` must be a JSON object.
  absl::Status Check(const nlohmann::ordered_json& object, absl::Span<const char* const> known,
                     const std::string& prefix = "");
  // One unknown member, named in full (e.g. "chat_template_kwargs.builtin_tools").
  absl::Status Unknown(const std::string& field);

  const std::vector<std::string>& ignored() const { return ignored_; }

 private:
  UnknownFields policy_;
  std::vector<std::string> ignored_;
};

// The header's value for `ignored` (empty: send no header): the names joined
// with ",", each cut to 64 bytes with bytes outside [A-Za-z0-9_.\-[]] as '?',
// at most 16 names, then "...(N more)": a request cannot make the header
// large or smuggle a line break into it.
std::string IgnoredFieldsHeaderValue(const std::vector<std::string>& ignored);

}  // namespace flotilla::coordinator
