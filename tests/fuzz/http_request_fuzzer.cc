// Fuzz target: the OpenAI HTTP request mapping, as the HTTP server runs it.
// Input: one selector byte (bit 0: 0 = /v1/chat/completions, 1 =
// /v1/completions) and then the request body. The body goes through
// ParseBody -> PrepareChatRequest (Harmony mapping and renderer, then the
// tokenizer) or PrepareCompletionRequest; an error becomes the client's error
// JSON. Properties: nothing crashes; an accepted request has a non-empty
// prompt of valid ids that decodes to valid UTF-8 (every text in a body is
// UTF-8, and a chat prompt ends with `<|start|>assistant`); the response side
// runs with the request's stop strings and logprobs.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "coordinator/openai_pipeline.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

constexpr std::string_view kModel = "gpt-oss-20b";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace flotilla;
  using namespace flotilla::coordinator;
  if (size < 1) return 0;
  const tokenizer::Tokenizer& tok = fuzz::SharedTokenizer();
  static const harmony::OpenAiRequestOptions options = [] {
    harmony::OpenAiRequestOptions o;
    o.date = "2025-06-28";
    return o;
  }();
  const bool chat = (data[0] & 1) == 0;
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);

  absl::StatusOr<Json> json = ParseBody(body);
  absl::StatusOr<PreparedRequest> prepared =
      !json.ok() ? absl::StatusOr<PreparedRequest>(json.status())
      : chat     ? PrepareChatRequest(*json, kModel, tok, options)
                 : PrepareCompletionRequest(*json, kModel, tok);
  if (!prepared.ok()) {
    const ApiError error = ErrorFromStatus(prepared.status());
    FLOTILLA_FUZZ_CHECK(error.http_status >= 400 && error.http_status < 600);
    const std::string wire = DumpJson(ErrorJson(error));
    FLOTILLA_FUZZ_CHECK(!wire.empty());
    return 0;
  }
  FLOTILLA_FUZZ_CHECK(!prepared->prompt.empty());
  for (tokenizer::TokenId id : prepared->prompt)
    FLOTILLA_FUZZ_CHECK(tokenizer::Tokenizer::IsValid(id));
  absl::StatusOr<std::string> text = tok.DecodeUtf8(prepared->prompt);
  FLOTILLA_FUZZ_CHECK(text.ok());
  if (chat) {
    constexpr std::string_view kTail = "<|start|>assistant";
    FLOTILLA_FUZZ_CHECK(text->size() >= kTail.size() &&
                        std::string_view(*text).substr(text->size() - kTail.size()) == kTail);
  }
  // The response side with the request's own stop strings: the prompt's
  // tokens stand in for generated ones.
  ResponseBuilder builder(&tok, prepared->endpoint, "fuzz-id", std::string(kModel), 0,
                          prepared->stop, prepared->logprobs);
  std::vector<Json> chunks = builder.Begin();
  const size_t n = std::min<size_t>(prepared->prompt.size(), 256);
  for (size_t i = 0; i < n && !builder.stopped_by_string(); i += 7) {
    std::vector<tokenizer::TokenId> piece(prepared->prompt.begin() + i,
                                          prepared->prompt.begin() + std::min(n, i + 7));
    for (Json& c : builder.Feed(piece, {})) chunks.push_back(std::move(c));
  }
  for (Json& c : builder.Finish(common::LENGTH, std::nullopt, 1, static_cast<uint32_t>(n))) {
    chunks.push_back(std::move(c));
  }
  chunks.push_back(builder.Response());
  for (const Json& c : chunks) FLOTILLA_FUZZ_CHECK(!DumpJson(c).empty());
  return 0;
}
