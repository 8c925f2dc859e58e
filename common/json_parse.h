// Parsing of untrusted JSON with its nesting bounded while it is read.
//
// nlohmann's parser is iterative, but much of what walks a parsed value is
// not: dump(), copies, comparisons and our own validators recurse once per
// level, so a 100 KB body of 50,000 '[' overflows a thread's stack wherever it
// is first walked. ParseJson stops at the first container past `max_depth`,
// before anything deeper exists, so every value it returns is safe to walk
// recursively. Every entry point that takes JSON from a client (HTTP bodies,
// JSON-carrying proto fields, schemas) parses through here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace flotilla {

// The deepest nesting a client's JSON may have (objects and arrays together).
// OpenAI-style requests need about 8; JSON Schemas a few more.
inline constexpr int kMaxJsonDepth = 64;

namespace json_parse_internal {

// A SAX consumer that builds the value as nlohmann's own DOM parser does,
// and refuses the first object or array that would open past `max_depth`.
template <class BasicJson>
class DepthBoundedDom {
 public:
  using number_integer_t = typename BasicJson::number_integer_t;
  using number_unsigned_t = typename BasicJson::number_unsigned_t;
  using number_float_t = typename BasicJson::number_float_t;
  using string_t = typename BasicJson::string_t;
  using binary_t = typename BasicJson::binary_t;

  DepthBoundedDom(BasicJson& root, int max_depth)
      : dom_(root, /*allow_exceptions=*/false), max_depth_(max_depth) {}

  bool null() { return dom_.null(); }
  bool boolean(bool v) { return dom_.boolean(v); }
  bool number_integer(number_integer_t v) { return dom_.number_integer(v); }
  bool number_unsigned(number_unsigned_t v) { return dom_.number_unsigned(v); }
  bool number_float(number_float_t v, const string_t& s) { return dom_.number_float(v, s); }
  bool string(string_t& v) { return dom_.string(v); }
  bool binary(binary_t& v) { return dom_.binary(v); }
  bool key(string_t& v) { return dom_.key(v); }
  bool start_object(std::size_t n) { return Open() && dom_.start_object(n); }
  bool end_object() { return Close() && dom_.end_object(); }
  bool start_array(std::size_t n) { return Open() && dom_.start_array(n); }
  bool end_array() { return Close() && dom_.end_array(); }

  template <class Exception>
  bool parse_error(std::size_t position, const std::string& /*last_token*/, const Exception& e) {
    error_position_ = position;
    error_ = e.what();
    return false;
  }

  bool too_deep() const { return too_deep_; }
  std::size_t error_position() const { return error_position_; }
  const std::string& error() const { return error_; }

 private:
  bool Open() {
    if (++depth_ <= max_depth_) return true;
    too_deep_ = true;
    return false;
  }
  bool Close() {
    --depth_;
    return true;
  }

  nlohmann::detail::json_sax_dom_parser<BasicJson> dom_;
  int max_depth_;
  int depth_ = 0;
  bool too_deep_ = false;
  std::size_t error_position_ = 0;
  std::string error_;
};

}  // namespace json_parse_internal

// Parses `text` as one JSON value nested at most `max_depth` deep.
// INVALID_ARGUMENT naming `what` when it is not JSON (with the byte where
// reading stopped) or is nested deeper (without building the deeper part).
template <class BasicJson = nlohmann::json>
absl::StatusOr<BasicJson> ParseJson(std::string_view text, const std::string& what,
                                    int max_depth = kMaxJsonDepth) {
  BasicJson value;
  json_parse_internal::DepthBoundedDom<BasicJson> dom(value, max_depth);
  const bool ok = BasicJson::sax_parse(text.begin(), text.end(), &dom,
                                       nlohmann::detail::input_format_t::json, /*strict=*/true);
  if (dom.too_deep()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is nested more than ", max_depth, " levels deep"));
  }
  if (!ok || value.is_discarded()) {
    if (dom.error().empty()) return absl::InvalidArgumentError(absl::StrCat(what, " is not valid JSON"));
    return absl::InvalidArgumentError(absl::StrCat(what, " is not valid JSON (byte ",
                                                   dom.error_position(), ")"));
  }
  return value;
}

}  // namespace flotilla
