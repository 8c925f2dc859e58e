// Fuzz target: the validation of the gRPC client requests. Input: one selector
// byte, then the serialized request.
//   selector bit 0 = 0: flotilla.v1.ChatRequest -> PrepareChat (the checks of
//     the proto fields, the OpenAI mapping, Harmony rendering), as the Chat
//     call runs it;
//   selector bit 0 = 1: flotilla.v1.GenerateRequest -> the Generate call's
//     steps (model name, the prompt: ids, or text encoded with special tokens
//     allowed) -> ClusterManager::Submit, whose prompt checks run before it
//     looks for workers (this manager has none, so an accepted request ends
//     UNAVAILABLE; nothing is sent anywhere).
// Properties: nothing crashes; a chat prompt is valid ids ending with
// `<|start|>assistant`, and its reply stream (the prompt's tokens played back
// with the request's stop strings) always ends; Submit accepts only prompts
// of ids inside the vocabulary, and refuses bad ids or sampling fields as
// INVALID_ARGUMENT although no worker is there (validation before
// availability).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/sampling_check.h"
#include "coordinator/cluster/cluster_manager.h"
#include "coordinator/grpc/chat_pipeline.h"
#include "google/protobuf/stubs/logging.h"
#include "proto/flotilla.pb.h"
#include "spdlog/spdlog.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using namespace flotilla;
using namespace flotilla::coordinator;

constexpr std::string_view kModel = "gpt-oss-20b";

ClusterManager& Manager() {
  static ClusterManager* manager = [] {
    ClusterOptions options;
    options.model = ModelConfig::Gptoss20b();
    auto m = ClusterManager::Create(options);
    FLOTILLA_FUZZ_CHECK(m.ok());
    return m->release();
  }();
  return *manager;
}

void FuzzChat(const uint8_t* data, size_t size, const tokenizer::Tokenizer& tok) {
  static const harmony::OpenAiRequestOptions options;
  v1::ChatRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return;
  absl::StatusOr<PreparedRequest> prepared = PrepareChat(request, kModel, tok, options);
  if (!prepared.ok()) {
    FLOTILLA_FUZZ_CHECK(!prepared.status().message().empty());
    return;
  }
  for (tokenizer::TokenId id : prepared->prompt)
    FLOTILLA_FUZZ_CHECK(tokenizer::Tokenizer::IsValid(id));
  absl::StatusOr<std::string> text = tok.DecodeUtf8(prepared->prompt);
  FLOTILLA_FUZZ_CHECK(text.ok());
  constexpr std::string_view kTail = "<|start|>assistant";
  FLOTILLA_FUZZ_CHECK(text->size() >= kTail.size() &&
                      std::string_view(*text).substr(text->size() - kTail.size()) == kTail);
  // The reply stream with the request's stop strings: the prompt's tokens
  // stand in for generated ones, in updates of up to 5, then a finish.
  ChatStream stream(&tok, "1", "chat-fuzz-1", prepared->stop,
                    static_cast<uint32_t>(prepared->prompt.size()), request.return_token_ids());
  (void)stream.Begin();
  const size_t n = std::min<size_t>(prepared->prompt.size(), 256);
  for (size_t i = 0; i < n && !stream.finished(); i += 5) {
    cluster::SequenceUpdate u;
    u.set_request_id(1);
    for (size_t k = i; k < std::min(n, i + 5); ++k) {
      u.add_token_ids(static_cast<int32_t>(prepared->prompt[k]));
    }
    (void)stream.Feed(u);
  }
  if (!stream.finished()) {
    cluster::SequenceUpdate end;
    end.set_request_id(1);
    end.set_finish_reason(common::LENGTH);
    end.set_prompt_tokens(static_cast<uint32_t>(prepared->prompt.size()));
    end.set_completion_tokens(static_cast<uint32_t>(n));
    std::optional<v1::ChatResponse> last = stream.Feed(end);
    FLOTILLA_FUZZ_CHECK(stream.finished());
    FLOTILLA_FUZZ_CHECK(last.has_value());
  }
}

void FuzzGenerate(const uint8_t* data, size_t size, const tokenizer::Tokenizer& tok) {
  v1::GenerateRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return;
  if (!request.model().empty() && request.model() != kModel) return;  // NOT_FOUND
  cluster::SubmitSequence submit;
  if (request.prompt_case() == v1::GenerateRequest::kPromptIds) {
    *submit.mutable_prompt_ids() = request.prompt_ids().ids();
  } else if (request.prompt_case() == v1::GenerateRequest::kText) {
    absl::StatusOr<std::vector<tokenizer::TokenId>> ids =
        tok.Encode(request.text(), tokenizer::SpecialTokenPolicy::All());
    if (!ids.ok()) return;  // INVALID_ARGUMENT
    for (tokenizer::TokenId id : *ids) submit.add_prompt_ids(static_cast<int32_t>(id));
  } else {
    return;  // INVALID_ARGUMENT: no prompt
  }
  *submit.mutable_sampling() = request.sampling();
  submit.set_return_prompt_logits(request.return_prompt_logits());
  bool valid_ids = submit.prompt_ids_size() > 0;
  for (int32_t id : submit.prompt_ids()) {
    valid_ids = valid_ids && id >= 0 && static_cast<uint32_t>(id) < tokenizer::kVocabSize;
  }
  RequestCallbacks cb;
  cb.on_update = [](const cluster::SequenceUpdate&) {};
  cb.on_done = [](const absl::Status&) {};
  absl::StatusOr<uint64_t> id = Manager().Submit(std::move(submit), std::move(cb));
  FLOTILLA_FUZZ_CHECK(!id.ok());  // no workers: never routed
  const bool valid_sampling =
      CheckSamplingParams(request.sampling(), static_cast<int>(tokenizer::kVocabSize)).ok();
  if (!valid_ids || !valid_sampling) {
    FLOTILLA_FUZZ_CHECK(id.status().code() == absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const bool quiet = [] {
    spdlog::set_level(spdlog::level::off);
    // Protobuf logs every string field that is not UTF-8; the parse failure is enough.
    google::protobuf::SetLogHandler(nullptr);
    return true;
  }();
  (void)quiet;
  const tokenizer::Tokenizer& tok = fuzz::SharedTokenizer();
  if ((data[0] & 1) == 0) {
    FuzzChat(data + 1, size - 1, tok);
  } else {
    FuzzGenerate(data + 1, size - 1, tok);
  }
  return 0;
}
