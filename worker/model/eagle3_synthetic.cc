#include "worker/model/eagle3_synthetic.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/bf16.h"
#include "common/status.h"
#include "worker/model/demo_model.h"
#include "worker/model/safetensors.h"

namespace flotilla {
namespace {

using json = nlohmann::json;

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform values of standard deviation `scale` around `center`, the stream
// of (seed, tensor).
std::vector<uint16_t> RandomBf16(int64_t n, uint64_t seed, uint64_t tensor, float scale,
                                 float center = 0.0f) {
  std::vector<uint16_t> out(n);
  const uint64_t base = SplitMix(seed ^ SplitMix(tensor));
  for (int64_t i = 0; i < n; ++i) {
    const double u = static_cast<double>(SplitMix(base + static_cast<uint64_t>(i)) >> 11) * 0x1p-53;
    out[i] = FloatToBf16(center + scale * static_cast<float>((2.0 * u - 1.0) * std::sqrt(3.0)));
  }
  return out;
}

json SyntheticConfig(const ModelConfig& t) {
  const int64_t draft_vocab =
      std::min<int64_t>(t.vocab_size, t.vocab_size >= 64000 ? 32000 : t.vocab_size / 2);
  json j = {{"architectures", {"LlamaForCausalLMEagle3"}},
            {"model_type", "llama"},
            {"hidden_size", t.hidden_size},
            {"intermediate_size", 6 * t.hidden_size},
            {"num_attention_heads", t.num_attention_heads},
            {"num_key_value_heads", t.num_key_value_heads},
            {"head_dim", t.head_dim},
            {"num_hidden_layers", 1},
            {"hidden_act", "silu"},
            {"rms_norm_eps", 1e-5},
            {"rope_theta", 10000.0},
            {"max_position_embeddings", t.max_position_embeddings},
            {"vocab_size", t.vocab_size},
            {"draft_vocab_size", draft_vocab},
            {"tie_word_embeddings", false},
            {"torch_dtype", "bfloat16"}};
  j["eagle_config"] = {
      {"eagle_aux_hidden_state_layer_ids", DefaultEagle3AuxLayers(t.num_hidden_layers)}};
  return j;
}

absl::Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text << "\n";
  out.close();
  if (!out) return absl::InternalError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> SyntheticSeed(const std::string& spec) {
  const std::string rest = spec.substr(kSyntheticEagle3.size());
  if (rest.empty()) return 0;
  uint64_t seed = 0;
  if (rest[0] != ':' || !absl::SimpleAtoi(rest.substr(1), &seed)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--speculative-model \"", spec, "\": expected synthetic:eagle3 or synthetic:eagle3:SEED"));
  }
  return seed;
}

}  // namespace

absl::Status WriteSyntheticEagle3Head(const std::string& dir, const ModelConfig& target,
                                      uint64_t seed) {
  const json config = SyntheticConfig(target);
  FLOTILLA_ASSIGN_OR_RETURN(Eagle3Config c, ParseEagle3Config(config.dump(), target));
  const int64_t H = c.hidden_size, D = c.head_dim, I = c.intermediate_size;
  const int64_t NH = c.num_attention_heads, NKV = c.num_key_value_heads;
  const int64_t fused = static_cast<int64_t>(c.aux_layers.size()) * c.target_hidden_size;
  const float in_h = 1.0f / std::sqrt(static_cast<float>(H));
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<uint16_t> values;
  };
  uint64_t id = 0;
  auto random = [&](std::string name, std::vector<int64_t> shape, float scale, float center = 0) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return Tensor{std::move(name), shape, RandomBf16(n, seed, ++id, scale, center)};
  };
  std::vector<Tensor> tensors;
  tensors.push_back(random("fc.weight", {H, fused}, 1.0f / std::sqrt(static_cast<float>(fused))));
  tensors.push_back(random("midlayer.input_layernorm.weight", {H}, 0.05f, 1.0f));
  tensors.push_back(random("midlayer.hidden_norm.weight", {H}, 0.05f, 1.0f));
  const float in_2h = 1.0f / std::sqrt(static_cast<float>(2 * H));
  tensors.push_back(random("midlayer.self_attn.q_proj.weight", {NH * D, 2 * H}, in_2h));
  tensors.push_back(random("midlayer.self_attn.k_proj.weight", {NKV * D, 2 * H}, in_2h));
  tensors.push_back(random("midlayer.self_attn.v_proj.weight", {NKV * D, 2 * H}, in_2h));
  tensors.push_back(random("midlayer.self_attn.o_proj.weight", {H, NH * D},
                           1.0f / std::sqrt(static_cast<float>(NH * D))));
  tensors.push_back(random("midlayer.post_attention_layernorm.weight", {H}, 0.05f, 1.0f));
  tensors.push_back(random("midlayer.mlp.gate_proj.weight", {I, H}, in_h));
  tensors.push_back(random("midlayer.mlp.up_proj.weight", {I, H}, in_h));
  tensors.push_back(
      random("midlayer.mlp.down_proj.weight", {H, I}, 1.0f / std::sqrt(static_cast<float>(I))));
  tensors.push_back(random("norm.weight", {H}, 0.05f, 1.0f));
  tensors.push_back(random("lm_head.weight", {c.draft_vocab_size, H}, in_h));
  // The draft vocabulary: one target id from each stretch of V / DV ids.
  const int64_t V = c.vocab_size, DV = c.draft_vocab_size, stride = V / DV;
  std::vector<int64_t> d2t(DV);
  std::vector<uint8_t> t2d(V, 0);
  for (int64_t d = 0; d < DV; ++d) {
    const int64_t t = d * stride + static_cast<int64_t>(SplitMix(seed ^ (0xd2d2ull + d)) % stride);
    d2t[d] = t - d;
    t2d[t] = 1;
  }
  std::vector<TensorToWrite> write;
  for (const Tensor& t : tensors) write.push_back({t.name, DType::kBF16, t.shape, t.values.data()});
  write.push_back({"d2t", DType::kI64, {DV}, d2t.data()});
  write.push_back({"t2d", DType::kBool, {V}, t2d.data()});
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat(dir, ": cannot create: ", ec.message()));
  FLOTILLA_RETURN_IF_ERROR(WriteSafetensors(dir + "/model.safetensors", write));
  return WriteText(dir + "/config.json", config.dump(2));  // last: readers start from it
}

absl::StatusOr<std::string> Eagle3HeadDir(const std::string& spec, const ModelConfig& target) {
  namespace fs = std::filesystem;
  if (spec.rfind(std::string(kSyntheticEagle3), 0) != 0) return spec;
  FLOTILLA_ASSIGN_OR_RETURN(uint64_t seed, SyntheticSeed(spec));
  const fs::path root = ModelCacheRoot();
  const fs::path dir =
      root / absl::StrFormat("eagle3-h%d-l%d-nh%d-kv%d-d%d-v%d-s%d", target.hidden_size,
                             target.num_hidden_layers, target.num_attention_heads,
                             target.num_key_value_heads, target.head_dim, target.vocab_size, seed);
  std::error_code ec;
  if (fs::exists(dir / "config.json", ec)) return dir.string();
  // Processes starting at once each write a private copy; the first rename wins.
  const fs::path staging = root / absl::StrFormat(".eagle3.partial-%d", getpid());
  fs::remove_all(staging, ec);
  if (absl::Status st = WriteSyntheticEagle3Head(staging.string(), target, seed); !st.ok()) {
    fs::remove_all(staging, ec);
    return st;
  }
  fs::rename(staging, dir, ec);
  if (ec) {
    fs::remove_all(staging, ec);
    if (!fs::exists(dir / "config.json", ec)) {
      return absl::PermissionDeniedError(
          absl::StrCat(dir.string(), ": cannot write the head there"));
    }
  }
  return dir.string();
}

absl::StatusOr<std::unique_ptr<Eagle3Head>> OpenEagle3Head(const std::string& spec,
                                                           const ModelConfig& target) {
  FLOTILLA_ASSIGN_OR_RETURN(std::string dir, Eagle3HeadDir(spec, target));
  return LoadEagle3Head(dir, target);
}

}  // namespace flotilla
