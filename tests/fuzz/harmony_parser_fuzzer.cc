// Fuzz target: the streaming Harmony parser and the response side that runs
// on top of it. Input: one flags byte, then a token stream in the encoding of
// token_stream.h.
//   flags bit 0: strict parser      bit 1: stream begins inside an assistant header
//   bits 2-3:    stop strings of the ResponseBuilder (none, "\n", "<|", "ab")
//   bit 4:       ResponseBuilder for /v1/completions instead of chat
//   bit 5:       with logprobs
// Properties: nothing crashes; a non-strict parser fails only on ids outside
// the vocabulary and always finishes; each completed message has its end
// token; ParseCompletion agrees with the streaming parser; every response
// chunk serializes.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/harmony/parser.h"
#include "coordinator/http/openai_pipeline.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/token_stream.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace flotilla;
  using namespace flotilla::coordinator;
  if (size < 1) return 0;
  const tokenizer::Tokenizer& tok = fuzz::SharedTokenizer();
  const uint8_t flags = data[0];
  const std::vector<tokenizer::TokenId> ids = fuzz::DecodeTokenStream(tok, data + 1, size - 1);

  harmony::ParserOptions options;
  options.strict = (flags & 1) != 0;
  if (flags & 2) options.start_role = harmony::Role::kAssistant;

  // The streaming parser, token by token.
  harmony::StreamParser parser(&tok, options);
  bool failed = false;
  for (tokenizer::TokenId id : ids) {
    absl::StatusOr<harmony::StreamParser::Event> ev = parser.Process(id);
    if (!ev.ok()) {
      FLOTILLA_FUZZ_CHECK(options.strict || !tokenizer::Tokenizer::IsValid(id));
      failed = true;
      break;
    }
  }
  if (!failed) {
    const absl::Status finished = parser.Finish();
    FLOTILLA_FUZZ_CHECK(options.strict || finished.ok());
    failed = !finished.ok();
  }
  FLOTILLA_FUZZ_CHECK(parser.messages().size() == parser.end_tokens().size());

  // The whole-completion parser must agree with the streaming one.
  absl::StatusOr<std::vector<harmony::Message>> whole = harmony::ParseCompletion(tok, ids, options);
  FLOTILLA_FUZZ_CHECK(whole.ok() == !failed);
  if (whole.ok()) FLOTILLA_FUZZ_CHECK(whole->size() == parser.messages().size());

  // The HTTP response side: stop strings, parser, delta mapper, detokenizer.
  std::vector<std::string> stop;
  switch ((flags >> 2) & 3) {
    case 1:
      stop = {"\n"};
      break;
    case 2:
      stop = {"<|"};
      break;
    case 3:
      stop = {"ab", "b"};
      break;
    default:
      break;
  }
  const Endpoint endpoint = (flags & 16) ? Endpoint::kCompletions : Endpoint::kChat;
  const bool logprobs = (flags & 32) != 0;
  ResponseBuilder builder(&tok, endpoint, "fuzz-id", "gpt-oss-20b", 0, stop, logprobs);
  std::vector<Json> chunks = builder.Begin();
  // A stream that ends on <|return|> or <|call|> stopped on it: the worker
  // reports that token as the stop token, not as generated text.
  const bool by_token =
      !ids.empty() && (ids.back() == tokenizer::kReturn || ids.back() == tokenizer::kCall);
  const size_t fed = by_token ? ids.size() - 1 : ids.size();
  // Feed in uneven pieces: 1, 2, 3, ... tokens.
  size_t pos = 0;
  for (size_t n = 1; pos < fed; ++n) {
    std::vector<tokenizer::TokenId> piece(ids.begin() + pos, ids.begin() + std::min(fed, pos + n));
    std::vector<common::TokenLogprob> lps;
    if (logprobs) {
      for (tokenizer::TokenId id : piece) {
        common::TokenLogprob lp;
        lp.set_token_id(static_cast<int32_t>(id));
        lp.set_logprob(-0.5f);
        common::TopLogprob* top = lp.add_top();
        top->set_token_id(static_cast<int32_t>(id ^ 1));
        top->set_logprob(-1.0f);
        lps.push_back(lp);
      }
    }
    for (Json& c : builder.Feed(piece, lps)) chunks.push_back(std::move(c));
    pos += piece.size();
  }
  for (Json& c :
       builder.Finish(by_token ? common::STOP : common::LENGTH,
                      by_token ? std::optional<tokenizer::TokenId>(ids.back()) : std::nullopt, 7,
                      static_cast<uint32_t>(fed))) {
    chunks.push_back(std::move(c));
  }
  chunks.push_back(builder.UsageChunk());
  chunks.push_back(builder.Response());
  for (const Json& c : chunks) FLOTILLA_FUZZ_CHECK(!DumpJson(c).empty());
  return 0;
}
