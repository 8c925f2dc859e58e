#include "common/model_config.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status.h"

namespace flotilla {
namespace {

using nlohmann::json;

absl::Status Missing(absl::string_view field) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: missing field '", field, "'"));
}

absl::Status Wrong(absl::string_view field, absl::string_view expected, const json& got) {
  // Arrays and objects by type name only: dumping recurses once per nesting level.
  const std::string what = got.is_structured() ? got.type_name() : got.dump();
  return absl::InvalidArgumentError(absl::StrCat("config.json: field '", field, "' must be ",
                                                 expected, ", got ", what));
}

absl::StatusOr<int64_t> GetInt(const json& j, absl::string_view field, bool positive = true) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return Missing(field);
  if (!it->is_number_integer() &&
      !(it->is_number_float() && it->get<double>() == static_cast<int64_t>(it->get<double>()))) {
    return Wrong(field, "an integer", *it);
  }
  int64_t v = it->is_number_integer() ? it->get<int64_t>() : static_cast<int64_t>(it->get<double>());
  if (positive && v <= 0) return Wrong(field, "positive", *it);
  return v;
}

absl::StatusOr<double> GetDouble(const json& j, absl::string_view field) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return Missing(field);
  if (!it->is_number()) return Wrong(field, "a number", *it);
  return it->get<double>();
}

absl::StatusOr<int> GetSmallInt(const json& j, absl::string_view field) {
  FLOTILLA_ASSIGN_OR_RETURN(int64_t v, GetInt(j, field));
  if (v > (int64_t{1} << 30)) return Wrong(field, "below 2^30", j.at(std::string(field)));
  return static_cast<int>(v);
}

absl::StatusOr<RopeScaling> ParseRope(const json& r, absl::string_view where) {
  RopeScaling s;
  if (!r.is_object()) return Wrong(where, "an object", r);
  auto type = r.find("rope_type");
  if (type == r.end()) type = r.find("type");
  if (type == r.end() || !type->is_string()) return Missing(absl::StrCat(where, ".rope_type"));
  s.rope_type = type->get<std::string>();
  if (s.rope_type == "default") {
    s.factor = 1.0;
    return s;
  }
  if (s.rope_type != "yarn") {
    return Wrong(absl::StrCat(where, ".rope_type"), "\"yarn\" or \"default\"", *type);
  }
  FLOTILLA_ASSIGN_OR_RETURN(s.factor, GetDouble(r, "factor"));
  FLOTILLA_ASSIGN_OR_RETURN(s.original_max_position_embeddings,
                            GetInt(r, "original_max_position_embeddings"));
  s.beta_fast = r.value("beta_fast", 32.0);
  s.beta_slow = r.value("beta_slow", 1.0);
  s.truncate = r.value("truncate", false);
  if (s.factor < 1.0) return Wrong(absl::StrCat(where, ".factor"), ">= 1", r.at("factor"));
  return s;
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfig::FromJson(const json& j) {
  if (!j.is_object()) return absl::InvalidArgumentError("config.json: not a JSON object");
  ModelConfig c;
  FLOTILLA_ASSIGN_OR_RETURN(c.num_hidden_layers, GetSmallInt(j, "num_hidden_layers"));
  FLOTILLA_ASSIGN_OR_RETURN(c.num_local_experts, GetSmallInt(j, "num_local_experts"));
  if (j.contains("num_experts_per_tok")) {
    FLOTILLA_ASSIGN_OR_RETURN(c.num_experts_per_tok, GetSmallInt(j, "num_experts_per_tok"));
  } else {
    FLOTILLA_ASSIGN_OR_RETURN(c.num_experts_per_tok, GetSmallInt(j, "experts_per_token"));
  }
  FLOTILLA_ASSIGN_OR_RETURN(c.hidden_size, GetSmallInt(j, "hidden_size"));
  FLOTILLA_ASSIGN_OR_RETURN(c.intermediate_size, GetSmallInt(j, "intermediate_size"));
  FLOTILLA_ASSIGN_OR_RETURN(c.num_attention_heads, GetSmallInt(j, "num_attention_heads"));
  FLOTILLA_ASSIGN_OR_RETURN(c.num_key_value_heads, GetSmallInt(j, "num_key_value_heads"));
  FLOTILLA_ASSIGN_OR_RETURN(c.head_dim, GetSmallInt(j, "head_dim"));
  FLOTILLA_ASSIGN_OR_RETURN(c.vocab_size, GetSmallInt(j, "vocab_size"));
  FLOTILLA_ASSIGN_OR_RETURN(c.sliding_window, GetSmallInt(j, "sliding_window"));
  FLOTILLA_ASSIGN_OR_RETURN(c.max_position_embeddings, GetInt(j, "max_position_embeddings"));
  FLOTILLA_ASSIGN_OR_RETURN(c.rms_norm_eps, GetDouble(j, "rms_norm_eps"));
  FLOTILLA_ASSIGN_OR_RETURN(c.swiglu_limit, GetDouble(j, "swiglu_limit"));

  // Transformers 4.x writes rope_theta + rope_scaling; 5.x may write
  // rope_parameters holding both.
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
    const json& rp = j["rope_parameters"];
    FLOTILLA_ASSIGN_OR_RETURN(c.rope_scaling, ParseRope(rp, "rope_parameters"));
    if (rp.contains("rope_theta")) {
      FLOTILLA_ASSIGN_OR_RETURN(c.rope_theta, GetDouble(rp, "rope_theta"));
    } else {
      FLOTILLA_ASSIGN_OR_RETURN(c.rope_theta, GetDouble(j, "rope_theta"));
    }
  } else {
    FLOTILLA_ASSIGN_OR_RETURN(c.rope_theta, GetDouble(j, "rope_theta"));
    if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
      FLOTILLA_ASSIGN_OR_RETURN(c.rope_scaling, ParseRope(j["rope_scaling"], "rope_scaling"));
    } else {
      c.rope_scaling = RopeScaling{.rope_type = "default", .factor = 1.0};
    }
  }

  if (j.contains("layer_types")) {
    const json& lt = j["layer_types"];
    if (!lt.is_array()) return Wrong("layer_types", "an array", lt);
    for (const json& t : lt) {
      if (t == "sliding_attention") {
        c.layer_types.push_back(LayerType::kSlidingAttention);
      } else if (t == "full_attention") {
        c.layer_types.push_back(LayerType::kFullAttention);
      } else {
        return Wrong("layer_types[]", "\"sliding_attention\" or \"full_attention\"", t);
      }
    }
    if (static_cast<int>(c.layer_types.size()) != c.num_hidden_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json: layer_types has ", c.layer_types.size(),
                       " entries but num_hidden_layers is ", c.num_hidden_layers));
    }
  } else {
    // The transformers default: sliding on even layers, full on odd.
    for (int i = 0; i < c.num_hidden_layers; ++i) {
      c.layer_types.push_back(i % 2 == 0 ? LayerType::kSlidingAttention
                                         : LayerType::kFullAttention);
    }
  }

  if (j.contains("eos_token_id") && !j["eos_token_id"].is_null()) {
    const json& e = j["eos_token_id"];
    if (e.is_number_integer()) {
      c.eos_token_ids.push_back(e.get<int>());
    } else if (e.is_array()) {
      for (const json& x : e) {
        if (!x.is_number_integer()) return Wrong("eos_token_id", "an integer or list of them", e);
        c.eos_token_ids.push_back(x.get<int>());
      }
    } else {
      return Wrong("eos_token_id", "an integer or list of them", e);
    }
  }
  if (j.contains("pad_token_id") && j["pad_token_id"].is_number_integer()) {
    c.pad_token_id = j["pad_token_id"].get<int>();
  }
  c.tie_word_embeddings = j.value("tie_word_embeddings", false);

  c.mxfp4_experts = false;
  if (j.contains("quantization_config") && j["quantization_config"].is_object()) {
    const json& q = j["quantization_config"];
    std::string method = q.value("quant_method", "");
    if (method != "mxfp4") {
      return Wrong("quantization_config.quant_method", "\"mxfp4\"", q.value("quant_method", json()));
    }
    c.mxfp4_experts = true;
    if (q.contains("modules_to_not_convert") && q["modules_to_not_convert"].is_array()) {
      for (const json& m : q["modules_to_not_convert"]) {
        if (m.is_string()) c.modules_to_not_convert.push_back(m.get<std::string>());
      }
    }
  }

  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.json: num_attention_heads (", c.num_attention_heads,
        ") must be a multiple of num_key_value_heads (", c.num_key_value_heads, ")"));
  }
  if (c.num_experts_per_tok > c.num_local_experts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.json: num_experts_per_tok (", c.num_experts_per_tok,
        ") exceeds num_local_experts (", c.num_local_experts, ")"));
  }
  if (c.hidden_size % 32 != 0 || c.intermediate_size % 32 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.json: hidden_size (", c.hidden_size, ") and intermediate_size (",
        c.intermediate_size, ") must be multiples of 32 (the MXFP4 block)"));
  }
  if (c.head_dim % 2 != 0) {
    return absl::InvalidArgumentError("config.json: head_dim must be even (RoPE rotates halves)");
  }
  for (int e : c.eos_token_ids) {
    if (e < 0) return Wrong("eos_token_id", "non-negative", e);
  }
  return c;
}

absl::StatusOr<ModelConfig> ModelConfig::Load(const std::string& path) {
  std::string file = path;
  {
    std::ifstream probe(path + "/config.json");
    if (probe.good()) file = path + "/config.json";
  }
  std::ifstream in(file);
  if (!in.good()) return absl::NotFoundError(absl::StrCat("cannot open ", file));
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(file, ": not valid JSON"));
  return FromJson(j);
}

json ModelConfig::ToJson() const {
  json lt = json::array();
  for (LayerType t : layer_types) {
    lt.push_back(t == LayerType::kSlidingAttention ? "sliding_attention" : "full_attention");
  }
  json j = {
      {"architectures", {"GptOssForCausalLM"}},
      {"model_type", "gpt_oss"},
      {"attention_bias", true},
      {"attention_dropout", 0.0},
      {"hidden_act", "silu"},
      {"initializer_range", 0.02},
      {"num_hidden_layers", num_hidden_layers},
      {"num_local_experts", num_local_experts},
      {"num_experts_per_tok", num_experts_per_tok},
      {"experts_per_token", num_experts_per_tok},
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"num_attention_heads", num_attention_heads},
      {"num_key_value_heads", num_key_value_heads},
      {"head_dim", head_dim},
      {"vocab_size", vocab_size},
      {"sliding_window", sliding_window},
      {"max_position_embeddings", max_position_embeddings},
      {"initial_context_length", rope_scaling.original_max_position_embeddings},
      {"layer_types", lt},
      {"rope_theta", rope_theta},
      {"rms_norm_eps", rms_norm_eps},
      {"swiglu_limit", swiglu_limit},
      {"tie_word_embeddings", tie_word_embeddings},
      {"use_cache", true},
      {"output_router_logits", false},
      {"router_aux_loss_coef", 0.9},
  };
  if (rope_scaling.rope_type == "yarn") {
    j["rope_scaling"] = {
        {"rope_type", "yarn"},
        {"factor", rope_scaling.factor},
        {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings},
        {"beta_fast", rope_scaling.beta_fast},
        {"beta_slow", rope_scaling.beta_slow},
        {"truncate", rope_scaling.truncate},
    };
  } else {
    j["rope_scaling"] = nullptr;
  }
  if (eos_token_ids.size() == 1) {
    j["eos_token_id"] = eos_token_ids[0];
  } else {
    j["eos_token_id"] = eos_token_ids;
  }
  if (pad_token_id >= 0) j["pad_token_id"] = pad_token_id;
  if (mxfp4_experts) {
    j["quantization_config"] = {{"quant_method", "mxfp4"},
                                {"modules_to_not_convert", modules_to_not_convert}};
  }
  return j;
}

namespace {
void AlternateLayers(ModelConfig& c) {
  c.layer_types.clear();
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    c.layer_types.push_back(i % 2 == 0 ? LayerType::kSlidingAttention : LayerType::kFullAttention);
  }
}

// gpt-oss as released: `layers` layers of `experts` experts, sliding and full
// attention alternating.
ModelConfig Gptoss(int layers, int experts) {
  ModelConfig c{.num_hidden_layers = layers,
                .num_local_experts = experts,
                .num_experts_per_tok = 4,
                .hidden_size = 2880,
                .intermediate_size = 2880,
                .num_attention_heads = 64,
                .num_key_value_heads = 8,
                .head_dim = 64,
                .vocab_size = 201088,
                .sliding_window = 128,
                .max_position_embeddings = 131072,
                .layer_types = {},
                .rope_theta = 150000,
                .rope_scaling = RopeScaling{},
                .rms_norm_eps = 1e-5,
                .swiglu_limit = 7.0,
                .eos_token_ids = {200002},
                .pad_token_id = 199999,
                .tie_word_embeddings = false,
                .mxfp4_experts = true,
                .modules_to_not_convert = {"model.layers.*.self_attn", "model.layers.*.mlp.router",
                                           "model.embed_tokens", "lm_head"}};
  AlternateLayers(c);
  return c;
}

// The shape the tiny and demo presets share: 4 layers of 8 experts, 64 wide,
// heads of 16 with 2 KV heads.
ModelConfig SmallGptoss(int attention_heads, int sliding_window) {
  ModelConfig c = Gptoss(4, 8);
  c.hidden_size = 64;
  c.intermediate_size = 64;
  c.num_attention_heads = attention_heads;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.sliding_window = sliding_window;
  return c;
}

}  // namespace

ModelConfig ModelConfig::Gptoss120b() { return Gptoss(36, 128); }

ModelConfig ModelConfig::Gptoss20b() { return Gptoss(24, 32); }

ModelConfig ModelConfig::Tiny() {
  ModelConfig c = SmallGptoss(/*attention_heads=*/8, /*sliding_window=*/16);
  c.vocab_size = 1024;
  c.max_position_embeddings = 4096;
  c.eos_token_ids = {1000};
  c.pad_token_id = 1001;
  return c;
}

ModelConfig ModelConfig::Demo() {
  ModelConfig c = SmallGptoss(/*attention_heads=*/4, /*sliding_window=*/64);
  c.num_experts_per_tok = 2;
  return c;
}

}  // namespace flotilla
