#include "worker/worker_messages.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace flotilla::worker {
namespace {

// Bytes an update adds to a TokenBatch: itself plus its tag and length prefix.
size_t FramedSize(const cluster::SequenceUpdate& update) {
  const size_t n = update.ByteSizeLong();
  size_t prefix = 1;
  for (size_t v = n; v >= 0x80; v >>= 7) ++prefix;
  return 1 + prefix + n;
}

cluster::SequenceUpdate TooLarge(const cluster::SequenceUpdate& update, size_t max_bytes) {
  cluster::SequenceUpdate error;
  error.set_request_id(update.request_id());
  error.set_finish_reason(common::ERROR);
  error.set_error_code(static_cast<int>(absl::StatusCode::kResourceExhausted));
  error.set_error(absl::StrCat("one update of this request needs ", update.ByteSizeLong(),
                               " bytes, over the worker's message limit of ", max_bytes));
  return error;
}

}  // namespace

void AppendPromptLogits(uint64_t request_id, const std::vector<float>& logits, int64_t vocab,
                        cluster::TokenBatch* batch) {
  if (vocab <= 0) return;
  const size_t row_bytes = static_cast<size_t>(vocab) * sizeof(float);
  const size_t rows_per_update = std::max<size_t>(1, kPromptLogitsChunkBytes / row_bytes);
  const size_t rows = logits.size() / static_cast<size_t>(vocab);
  for (size_t first = 0; first < rows; first += rows_per_update) {
    const size_t n = std::min(rows_per_update, rows - first);
    cluster::SequenceUpdate* u = batch->add_updates();
    u->set_request_id(request_id);
    u->mutable_prompt_logits()->Add(logits.begin() + first * vocab,
                                    logits.begin() + (first + n) * vocab);
  }
}

std::vector<cluster::WorkerMessage> SplitWorkerMessage(const cluster::WorkerMessage& message,
                                                       size_t max_bytes) {
  std::vector<cluster::WorkerMessage> out;
  ForEachWorkerMessagePart(message, max_bytes,
                           [&out](const cluster::WorkerMessage& part) { out.push_back(part); });
  return out;
}

void ForEachWorkerMessagePart(const cluster::WorkerMessage& message, size_t max_bytes,
                              const std::function<void(const cluster::WorkerMessage&)>& write) {
  if (message.ByteSizeLong() <= max_bytes ||
      message.kind_case() != cluster::WorkerMessage::kTokens) {
    write(message);
    return;
  }
  // Room for the WorkerMessage and TokenBatch framing and the step number.
  const size_t budget = max_bytes > 32 ? max_bytes - 32 : 0;
  cluster::WorkerMessage part;
  size_t used = 0;
  for (const cluster::SequenceUpdate& update : message.tokens().updates()) {
    cluster::SequenceUpdate replacement;
    const cluster::SequenceUpdate* piece = &update;
    if (FramedSize(update) > budget) {
      replacement = TooLarge(update, max_bytes);
      piece = &replacement;
    }
    const size_t size = FramedSize(*piece);
    if (part.has_tokens() && used + size > budget) {
      write(part);
      part.Clear();
      used = 0;
    }
    if (!part.has_tokens()) part.mutable_tokens()->set_step(message.tokens().step());
    *part.mutable_tokens()->add_updates() = *piece;
    used += size;
  }
  if (part.has_tokens()) write(part);
}

}  // namespace flotilla::worker
