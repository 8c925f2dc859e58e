#include "worker/model/eagle3_head.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/bf16.h"
#include "common/status.h"
#include "worker/model/safetensors.h"

namespace flotilla {
namespace {

using json = nlohmann::json;

absl::Status ConfigError(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("EAGLE3 head config.json: ", what));
}

// A positive integer at `key` (or `fallback` when absent and fallback > 0).
absl::StatusOr<int64_t> PositiveInt(const json& j, const char* key, int64_t fallback = 0) {
  if (!j.contains(key) || j[key].is_null()) {
    if (fallback > 0) return fallback;
    return ConfigError(absl::StrCat("missing key '", key, "'"));
  }
  if (!j[key].is_number_integer() || j[key].get<int64_t>() <= 0) {
    return ConfigError(absl::StrCat("'", key, "' must be a positive integer"));
  }
  return j[key].get<int64_t>();
}

absl::StatusOr<double> PositiveNumber(const json& j, const char* key, double fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_number() || j[key].get<double>() <= 0) {
    return ConfigError(absl::StrCat("'", key, "' must be a positive number"));
  }
  return j[key].get<double>();
}

absl::Status CheckArchitecture(const json& j) {
  if (!j.contains("architectures")) return absl::OkStatus();
  if (!j["architectures"].is_array()) return ConfigError("'architectures' must be a list");
  for (const json& a : j["architectures"]) {
    if (a.is_string() && a.get<std::string>().find("Eagle3") != std::string::npos) {
      return absl::OkStatus();
    }
  }
  return ConfigError(absl::StrCat("'architectures' ", j["architectures"].dump(),
                                  " names no EAGLE3 head (LlamaForCausalLMEagle3)"));
}

// What the loader does not implement: refused rather than computed wrongly.
absl::Status CheckUnsupported(const json& j) {
  if (j.contains("num_hidden_layers") && j["num_hidden_layers"] != 1) {
    return ConfigError(absl::StrCat("num_hidden_layers is ", j["num_hidden_layers"].dump(),
                                    "; an EAGLE3 head has one decoder layer"));
  }
  if (j.contains("hidden_act") && j["hidden_act"] != "silu") {
    return ConfigError(absl::StrCat("hidden_act ", j["hidden_act"].dump(), " (only silu)"));
  }
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (j.contains(key) && j[key] == true) {
      return ConfigError(absl::StrCat("'", key, "' is true; heads with biases are not supported"));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseRopeScaling(const json& j, Eagle3Config* c) {
  if (!j.contains("rope_scaling") || j["rope_scaling"].is_null()) return absl::OkStatus();
  const json& r = j["rope_scaling"];
  std::string type = r.value("rope_type", r.value("type", std::string()));
  if (type == "default") return absl::OkStatus();
  if (type != "yarn") {
    return ConfigError(absl::StrCat("rope_scaling type \"", type, "\" (only yarn or none)"));
  }
  c->yarn = true;
  FLOTILLA_ASSIGN_OR_RETURN(c->yarn_factor, PositiveNumber(r, "factor", 1.0));
  FLOTILLA_ASSIGN_OR_RETURN(c->yarn_original_max_position,
                            PositiveNumber(r, "original_max_position_embeddings", 4096));
  FLOTILLA_ASSIGN_OR_RETURN(c->yarn_beta_fast, PositiveNumber(r, "beta_fast", 32));
  FLOTILLA_ASSIGN_OR_RETURN(c->yarn_beta_slow, PositiveNumber(r, "beta_slow", 1));
  return absl::OkStatus();
}

absl::Status ParseAuxLayers(const json& j, const ModelConfig& target, Eagle3Config* c) {
  c->aux_layers = DefaultEagle3AuxLayers(target.num_hidden_layers);
  if (!j.contains("eagle_config") ||
      !j["eagle_config"].contains("eagle_aux_hidden_state_layer_ids")) {
    return absl::OkStatus();
  }
  const json& ids = j["eagle_config"]["eagle_aux_hidden_state_layer_ids"];
  if (!ids.is_array() || ids.empty()) {
    return ConfigError("eagle_config.eagle_aux_hidden_state_layer_ids must be a list of layers");
  }
  c->aux_layers.clear();
  for (const json& id : ids) {
    if (!id.is_number_integer() || id.get<int>() < 0 || id.get<int>() >= target.num_hidden_layers) {
      return ConfigError(absl::StrCat("eagle_aux_hidden_state_layer_ids names layer ", id.dump(),
                                      "; the target has layers 0..", target.num_hidden_layers - 1));
    }
    c->aux_layers.push_back(id.get<int>());
  }
  return absl::OkStatus();
}

absl::Status CheckFitsTarget(const Eagle3Config& c, const ModelConfig& target) {
  if (c.vocab_size != target.vocab_size) {
    return ConfigError(absl::StrCat("vocab_size ", c.vocab_size, " is not the target's ",
                                    target.vocab_size, "; the head was trained for another model"));
  }
  if (c.target_hidden_size != target.hidden_size) {
    return ConfigError(absl::StrCat("the head fuses target states of ", c.target_hidden_size,
                                    " values (target_hidden_size or hidden_size) but the target's "
                                    "hidden size is ",
                                    target.hidden_size));
  }
  if (c.draft_vocab_size > c.vocab_size) {
    return ConfigError(absl::StrCat("draft_vocab_size ", c.draft_vocab_size,
                                    " is larger than vocab_size ", c.vocab_size));
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return ConfigError(absl::StrCat("num_attention_heads ", c.num_attention_heads,
                                    " is not a multiple of num_key_value_heads ",
                                    c.num_key_value_heads));
  }
  if (c.head_dim % 2 != 0) return ConfigError("head_dim must be even (RoPE)");
  return absl::OkStatus();
}

// ---- tensors ----

float HalfToFloat(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 31, mant = h & 1023;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -24);  // zero or subnormal
  } else if (exp == 31) {
    v = mant == 0 ? std::numeric_limits<float>::infinity() : std::nanf("");
  } else {
    v = std::ldexp(static_cast<float>(mant + 1024), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

// The name without the optional leading "model.", and the layer prefix
// ("midlayer." or "layers.0.") as "layer.".
std::string CanonicalName(const std::string& name) {
  std::string n = name.rfind("model.", 0) == 0 ? name.substr(6) : name;
  for (const char* prefix : {"midlayer.", "layers.0."}) {
    if (n.rfind(prefix, 0) == 0) return "layer." + n.substr(std::strlen(prefix));
  }
  return n;
}

struct Files {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::map<std::string, const TensorInfo*> by_name;  // canonical name -> tensor
};

absl::StatusOr<Files> OpenFiles(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> paths;
  bool has_bin = false;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() == ".safetensors") paths.push_back(e.path().string());
    if (e.path().extension() == ".bin" || e.path().extension() == ".pt") has_bin = true;
  }
  if (ec) return absl::NotFoundError(absl::StrCat(dir, ": cannot list: ", ec.message()));
  if (paths.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir, ": no .safetensors file",
        has_bin ? " (only PyTorch pickles, which are not read: convert them to safetensors)" : ""));
  }
  std::sort(paths.begin(), paths.end());
  Files files;
  for (const std::string& path : paths) {
    FLOTILLA_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> f, SafetensorsFile::Open(path));
    for (const TensorInfo& t : f->tensors()) {
      if (t.name.find("rotary_emb.inv_freq") != std::string::npos) continue;  // recomputed
      const std::string canonical = CanonicalName(t.name);
      if (!files.by_name.emplace(canonical, &t).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": tensor ", t.name, " is given twice in ", dir));
      }
    }
    files.files.push_back(std::move(f));
  }
  return files;
}

// A floating tensor of exactly `shape`, in bf16.
absl::StatusOr<std::vector<uint16_t>> TakeBf16(Files& files, const std::string& name,
                                               const std::vector<int64_t>& shape) {
  auto it = files.by_name.find(name);
  if (it == files.by_name.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("EAGLE3 head: tensor ", name, " is missing (", ShapeString(shape), ")"));
  }
  const TensorInfo& t = *it->second;
  files.by_name.erase(it);
  if (t.shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat("EAGLE3 head: tensor ", t.name, " is ",
                                                   ShapeString(t.shape), "; the config implies ",
                                                   ShapeString(shape)));
  }
  const int64_t n = t.num_elements();
  std::vector<uint16_t> out(n);
  switch (t.dtype) {
    case DType::kBF16:
      std::memcpy(out.data(), t.data, n * sizeof(uint16_t));
      break;
    case DType::kF32:
      for (int64_t i = 0; i < n; ++i) {
        float v;
        std::memcpy(&v, t.data + i * 4, 4);
        out[i] = FloatToBf16(v);
      }
      break;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, t.data + i * 2, 2);
        out[i] = FloatToBf16(HalfToFloat(h));
      }
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("EAGLE3 head: tensor ", t.name, " is ",
                                                     DTypeName(t.dtype),
                                                     "; expected BF16, F16 or F32"));
  }
  return out;
}

// d2t: draft id -> target id offsets (I64 or I32); t2d, the target's
// membership mask, is checked for its shape and count.
absl::Status TakeVocabularyMaps(Files& files, Eagle3Head* head) {
  const Eagle3Config& c = head->config;
  head->draft_to_target.resize(c.draft_vocab_size);
  auto d2t = files.by_name.find("d2t");
  if (d2t == files.by_name.end()) {
    if (c.draft_vocab_size != c.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("EAGLE3 head: tensor d2t is missing; it is needed when draft_vocab_size (",
                       c.draft_vocab_size, ") is smaller than vocab_size (", c.vocab_size, ")"));
    }
    for (int64_t d = 0; d < c.draft_vocab_size; ++d)
      head->draft_to_target[d] = static_cast<int32_t>(d);
  } else {
    const TensorInfo& t = *d2t->second;
    if (t.shape != std::vector<int64_t>{c.draft_vocab_size} ||
        (t.dtype != DType::kI64 && t.dtype != DType::kI32)) {
      return absl::InvalidArgumentError(
          absl::StrCat("EAGLE3 head: d2t is ", DTypeName(t.dtype), " ", ShapeString(t.shape),
                       "; expected I64 or I32 [", c.draft_vocab_size, "]"));
    }
    for (int64_t d = 0; d < c.draft_vocab_size; ++d) {
      int64_t offset = 0;
      if (t.dtype == DType::kI64) {
        std::memcpy(&offset, t.data + d * 8, 8);
      } else {
        int32_t o32;
        std::memcpy(&o32, t.data + d * 4, 4);
        offset = o32;
      }
      const int64_t target = d + offset;
      if (target < 0 || target >= c.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("EAGLE3 head: d2t maps draft id ", d, " to ",
                                                       target, ", outside the target's [0, ",
                                                       c.vocab_size, ")"));
      }
      head->draft_to_target[d] = static_cast<int32_t>(target);
    }
    files.by_name.erase(d2t);
  }
  auto t2d = files.by_name.find("t2d");
  if (t2d != files.by_name.end()) {
    if (t2d->second->shape != std::vector<int64_t>{c.vocab_size}) {
      return absl::InvalidArgumentError(absl::StrCat("EAGLE3 head: t2d is ",
                                                     ShapeString(t2d->second->shape),
                                                     "; expected [", c.vocab_size, "]"));
    }
    files.by_name.erase(t2d);
  }
  return absl::OkStatus();
}

absl::Status TakeLayer(Files& files, Eagle3Head* head) {
  const Eagle3Config& c = head->config;
  const int64_t H = c.hidden_size, D = c.head_dim, I = c.intermediate_size;
  const int64_t aux = static_cast<int64_t>(c.aux_layers.size());
  FLOTILLA_ASSIGN_OR_RETURN(head->fc,
                            TakeBf16(files, "fc.weight", {H, aux * c.target_hidden_size}));
  FLOTILLA_ASSIGN_OR_RETURN(head->input_norm, TakeBf16(files, "layer.input_layernorm.weight", {H}));
  FLOTILLA_ASSIGN_OR_RETURN(head->hidden_norm, TakeBf16(files, "layer.hidden_norm.weight", {H}));
  FLOTILLA_ASSIGN_OR_RETURN(head->q_proj, TakeBf16(files, "layer.self_attn.q_proj.weight",
                                                   {c.num_attention_heads * D, 2 * H}));
  FLOTILLA_ASSIGN_OR_RETURN(head->k_proj, TakeBf16(files, "layer.self_attn.k_proj.weight",
                                                   {c.num_key_value_heads * D, 2 * H}));
  FLOTILLA_ASSIGN_OR_RETURN(head->v_proj, TakeBf16(files, "layer.self_attn.v_proj.weight",
                                                   {c.num_key_value_heads * D, 2 * H}));
  FLOTILLA_ASSIGN_OR_RETURN(head->o_proj, TakeBf16(files, "layer.self_attn.o_proj.weight",
                                                   {H, c.num_attention_heads * D}));
  FLOTILLA_ASSIGN_OR_RETURN(head->post_attention_norm,
                            TakeBf16(files, "layer.post_attention_layernorm.weight", {H}));
  FLOTILLA_ASSIGN_OR_RETURN(head->gate_proj, TakeBf16(files, "layer.mlp.gate_proj.weight", {I, H}));
  FLOTILLA_ASSIGN_OR_RETURN(head->up_proj, TakeBf16(files, "layer.mlp.up_proj.weight", {I, H}));
  FLOTILLA_ASSIGN_OR_RETURN(head->down_proj, TakeBf16(files, "layer.mlp.down_proj.weight", {H, I}));
  FLOTILLA_ASSIGN_OR_RETURN(head->final_norm, TakeBf16(files, "norm.weight", {H}));
  FLOTILLA_ASSIGN_OR_RETURN(head->lm_head,
                            TakeBf16(files, "lm_head.weight", {c.draft_vocab_size, H}));
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot read"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

std::vector<int> DefaultEagle3AuxLayers(int target_layers) {
  const int L = std::max(1, target_layers);
  if (L >= 8) return {1, L / 2 - 1, L - 4};
  return {0, (L - 1) / 2, L - 1};
}

absl::StatusOr<Eagle3Config> ParseEagle3Config(const std::string& json_text,
                                               const ModelConfig& target) {
  const json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return ConfigError("not a JSON object");
  FLOTILLA_RETURN_IF_ERROR(CheckArchitecture(j));
  FLOTILLA_RETURN_IF_ERROR(CheckUnsupported(j));
  Eagle3Config c;
  FLOTILLA_ASSIGN_OR_RETURN(c.hidden_size, PositiveInt(j, "hidden_size"));
  FLOTILLA_ASSIGN_OR_RETURN(c.target_hidden_size,
                            PositiveInt(j, "target_hidden_size", c.hidden_size));
  FLOTILLA_ASSIGN_OR_RETURN(c.intermediate_size, PositiveInt(j, "intermediate_size"));
  FLOTILLA_ASSIGN_OR_RETURN(c.num_attention_heads, PositiveInt(j, "num_attention_heads"));
  FLOTILLA_ASSIGN_OR_RETURN(c.num_key_value_heads,
                            PositiveInt(j, "num_key_value_heads", c.num_attention_heads));
  FLOTILLA_ASSIGN_OR_RETURN(c.head_dim,
                            PositiveInt(j, "head_dim", c.hidden_size / c.num_attention_heads));
  FLOTILLA_ASSIGN_OR_RETURN(c.vocab_size, PositiveInt(j, "vocab_size"));
  FLOTILLA_ASSIGN_OR_RETURN(c.draft_vocab_size, PositiveInt(j, "draft_vocab_size", c.vocab_size));
  FLOTILLA_ASSIGN_OR_RETURN(c.rms_norm_eps, PositiveNumber(j, "rms_norm_eps", 1e-5));
  FLOTILLA_ASSIGN_OR_RETURN(c.rope_theta, PositiveNumber(j, "rope_theta", 10000.0));
  FLOTILLA_RETURN_IF_ERROR(ParseRopeScaling(j, &c));
  c.norm_before_residual = j.value("norm_before_residual", false);
  FLOTILLA_RETURN_IF_ERROR(ParseAuxLayers(j, target, &c));
  FLOTILLA_RETURN_IF_ERROR(CheckFitsTarget(c, target));
  return c;
}

absl::Status Eagle3Head::UseTargetEmbedding(const Bf16Matrix& embed,
                                            std::shared_ptr<const void> owner) {
  if (embed.data == nullptr || embed.rows != config.vocab_size ||
      embed.cols != config.hidden_size) {
    return absl::FailedPreconditionError(
        absl::StrCat("EAGLE3 head: it has no embed_tokens.weight and the target's embedding (",
                     embed.rows, " x ", embed.cols, ") is not the [", config.vocab_size, ", ",
                     config.hidden_size, "] it needs"));
  }
  embedding = embed;
  embedding_owner = std::move(owner);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Eagle3Head>> LoadEagle3Head(const std::string& dir,
                                                           const ModelConfig& target) {
  absl::StatusOr<std::string> text = ReadText(dir + "/config.json");
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("EAGLE3 head in ", dir, ": no config.json (", text.status().message(), ")"));
  }
  auto head = std::make_unique<Eagle3Head>();
  FLOTILLA_ASSIGN_OR_RETURN(head->config, ParseEagle3Config(*text, target));
  FLOTILLA_ASSIGN_OR_RETURN(Files files, OpenFiles(dir));
  FLOTILLA_RETURN_IF_ERROR(TakeLayer(files, head.get()));
  FLOTILLA_RETURN_IF_ERROR(TakeVocabularyMaps(files, head.get()));
  const Eagle3Config& c = head->config;
  if (files.by_name.count("embed_tokens.weight")) {
    FLOTILLA_ASSIGN_OR_RETURN(
        head->own_embedding, TakeBf16(files, "embed_tokens.weight", {c.vocab_size, c.hidden_size}));
    head->embedding =
        Bf16Matrix{head->own_embedding.data(), c.vocab_size, c.hidden_size, c.hidden_size};
  }
  if (!files.by_name.empty()) {
    std::vector<std::string> extra;
    for (const auto& [name, t] : files.by_name) extra.push_back(t->name);
    return absl::InvalidArgumentError(
        absl::StrCat("EAGLE3 head in ", dir,
                     ": tensors this loader does not know: ", absl::StrJoin(extra, ", ")));
  }
  return head;
}

}  // namespace flotilla
