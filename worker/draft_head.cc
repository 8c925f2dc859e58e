#include "worker/draft_head.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/model/eagle3_synthetic.h"
#include "worker/model/synthetic_tensors.h"

namespace flotilla::worker {
namespace {

// The synthetic target's embedding [V, H], generated on the host.
absl::Status UseSyntheticEmbedding(const SyntheticModelSpec& target, Eagle3Head* head) {
  const ModelConfig& c = target.config;
  auto table = std::make_shared<std::vector<uint16_t>>(static_cast<size_t>(c.vocab_size) *
                                                       static_cast<size_t>(c.hidden_size));
  FillSyntheticElements(
      SyntheticTensorFor(c, target.weights(), "model.embed_tokens.weight", DType::kBF16), 0,
      static_cast<int64_t>(table->size()), table->data());
  const Bf16Matrix view{table->data(), c.vocab_size, c.hidden_size, c.hidden_size};
  return head->UseTargetEmbedding(view, std::move(table));
}

absl::Status GiveEmbedding(const ModelSource& model, const ModelWeights& host_weights,
                           Eagle3Head* head) {
  if (head->has_embedding()) return absl::OkStatus();
  if (host_weights.embed.data != nullptr) {
    return head->UseTargetEmbedding(host_weights.embed, host_weights.keepalive);
  }
  if (model.synthetic() != nullptr) return UseSyntheticEmbedding(*model.synthetic(), head);
  return absl::FailedPreconditionError(
      "the head has no embed_tokens.weight and the target's embedding is not in host memory");
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Eagle3Head>> LoadDraftHead(const std::string& spec,
                                                                const ModelSource& model,
                                                                const ModelWeights& host_weights) {
  auto fail = [&](const absl::Status& st) {
    return absl::Status(st.code(), absl::StrCat("--speculative-model ", spec, ": ", st.message()));
  };
  absl::StatusOr<std::unique_ptr<Eagle3Head>> head = OpenEagle3Head(spec, model.config());
  if (!head.ok()) return fail(head.status());
  if (absl::Status st = GiveEmbedding(model, host_weights, head->get()); !st.ok()) return fail(st);
  return std::shared_ptr<const Eagle3Head>(*std::move(head));
}

}  // namespace flotilla::worker
