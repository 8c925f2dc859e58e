// Fuzz target: the OpenAI HTTP request mapping, as the HTTP server runs it.
// Input: one selector byte (its value mod 5: 0 = /v1/chat/completions, 1 =
// /v1/completions, 2 = /v1/responses, 3 = /tokenize, 4 = /detokenize) and
// then the request body. The body goes through ParseBody (nesting bounded
// while parsing) -> PrepareChatRequest (Harmony mapping and renderer, then
// the tokenizer), PrepareCompletionRequest, ParseResponsesRequest ->
// PrepareResponsesRequest, Tokenize or Detokenize; an error becomes the
// client's error JSON. Properties: nothing crashes; an accepted request has a non-empty
// prompt of valid ids that decodes to valid UTF-8 (every text in a body is
// UTF-8, and a chat prompt ends with `<|start|>assistant`); the response side
// runs with the request's stop strings and logprobs.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "coordinator/http/openai_pipeline.h"
#include "coordinator/http/responses_request.h"
#include "coordinator/http/tokenize_api.h"
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
  const int route = data[0] % 5;
  const bool chat = route == 0 || route == 2;  // a responses request renders as a chat
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);

  absl::StatusOr<Json> json = ParseBody(body);
  if (json.ok() && route >= 3) {
    const TokenizeContext context{&tok, options, std::string(kModel), 131072, 0};
    absl::StatusOr<Json> answer = route == 3 ? Tokenize(*json, context) : Detokenize(*json, context);
    FLOTILLA_FUZZ_CHECK(!DumpJson(answer.ok() ? *answer : ErrorJson(ErrorFromStatus(answer.status()))).empty());
    return 0;
  }
  absl::StatusOr<PreparedRequest> prepared = absl::InternalError("no route");
  if (!json.ok()) prepared = json.status();
  if (json.ok() && route == 0) prepared = PrepareChatRequest(*json, kModel, tok, options);
  if (json.ok() && route == 1) prepared = PrepareCompletionRequest(*json, kModel, tok);
  if (json.ok() && route == 2) {
    absl::StatusOr<ResponsesRequest> request = ParseResponsesRequest(*json);
    prepared = request.ok() ? PrepareResponsesRequest(*request, Json::array(), std::string(kModel),
                                                      tok, options)
                            : absl::StatusOr<PreparedRequest>(request.status());
  }
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
