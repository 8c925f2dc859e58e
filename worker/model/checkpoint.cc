#include "worker/model/checkpoint.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace flotilla {
namespace {

using nlohmann::json;

bool FileExists(const std::string& path) {
  std::ifstream f(path);
  return f.good();
}

std::string DTypeList(const std::vector<DType>& dtypes) {
  std::string s;
  for (size_t i = 0; i < dtypes.size(); ++i) absl::StrAppend(&s, i ? " or " : "", DTypeName(dtypes[i]));
  return s;
}

}  // namespace

std::string LayerTensorName(int layer, absl::string_view suffix) {
  return absl::StrCat("model.layers.", layer, ".", suffix);
}

std::vector<TensorSpec> ExpectedTensors(const ModelConfig& c, DType sinks_dtype) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, E = c.num_local_experts;
  const int64_t D = c.head_dim, NH = c.num_attention_heads, NKV = c.num_key_value_heads;
  const int64_t V = c.vocab_size;
  std::vector<TensorSpec> out;
  out.push_back({"model.embed_tokens.weight", DType::kBF16, {V, H}});
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    auto add = [&](absl::string_view suffix, DType dtype, std::vector<int64_t> shape) {
      out.push_back({LayerTensorName(l, suffix), dtype, std::move(shape)});
    };
    add("input_layernorm.weight", DType::kBF16, {H});
    add("self_attn.q_proj.weight", DType::kBF16, {NH * D, H});
    add("self_attn.q_proj.bias", DType::kBF16, {NH * D});
    add("self_attn.k_proj.weight", DType::kBF16, {NKV * D, H});
    add("self_attn.k_proj.bias", DType::kBF16, {NKV * D});
    add("self_attn.v_proj.weight", DType::kBF16, {NKV * D, H});
    add("self_attn.v_proj.bias", DType::kBF16, {NKV * D});
    add("self_attn.o_proj.weight", DType::kBF16, {H, NH * D});
    add("self_attn.o_proj.bias", DType::kBF16, {H});
    add("self_attn.sinks", sinks_dtype, {NH});
    add("post_attention_layernorm.weight", DType::kBF16, {H});
    add("mlp.router.weight", DType::kBF16, {E, H});
    add("mlp.router.bias", DType::kBF16, {E});
    add("mlp.experts.gate_up_proj_blocks", DType::kU8, {E, 2 * I, H / 32, 16});
    add("mlp.experts.gate_up_proj_scales", DType::kU8, {E, 2 * I, H / 32});
    add("mlp.experts.gate_up_proj_bias", DType::kBF16, {E, 2 * I});
    add("mlp.experts.down_proj_blocks", DType::kU8, {E, H, I / 32, 16});
    add("mlp.experts.down_proj_scales", DType::kU8, {E, H, I / 32});
    add("mlp.experts.down_proj_bias", DType::kBF16, {E, H});
  }
  out.push_back({"model.norm.weight", DType::kBF16, {H}});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", DType::kBF16, {V, H}});
  return out;
}

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir) {
  std::unique_ptr<Checkpoint> ck(new Checkpoint());
  ck->dir_ = dir;
  if (!FileExists(dir + "/config.json")) {
    return absl::NotFoundError(absl::StrCat(dir, ": no config.json (not a checkpoint directory?)"));
  }
  FLOTILLA_ASSIGN_OR_RETURN(ck->config_, ModelConfig::Load(dir));
  if (!ck->config_.mxfp4_experts) {
    return absl::UnimplementedError(absl::StrCat(
        dir, "/config.json: only checkpoints with MXFP4 experts (quantization_config.quant_method "
             "\"mxfp4\") are supported"));
  }

  std::vector<std::string> files;
  std::map<std::string, std::string> weight_map;  // tensor -> file, from the index
  const std::string single = dir + "/model.safetensors";
  const std::string index_path = dir + "/model.safetensors.index.json";
  if (FileExists(single)) {
    files.push_back("model.safetensors");
  } else if (FileExists(index_path)) {
    std::ifstream in(index_path);
    std::stringstream ss;
    ss << in.rdbuf();
    json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": not a valid JSON object"));
    }
    auto wm = j.find("weight_map");
    if (wm == j.end() || !wm->is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": missing object 'weight_map'"));
    }
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it.value().is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path, ": weight_map['", it.key(), "'] is not a file name"));
      }
      std::string file = it.value().get<std::string>();
      if (file.empty() || file[0] == '/' || file.find("..") != std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat(
            index_path, ": weight_map['", it.key(), "'] = '", file,
            "' must be a file name inside the checkpoint directory"));
      }
      weight_map[it.key()] = file;
      if (std::find(files.begin(), files.end(), file) == files.end()) files.push_back(file);
    }
    if (files.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map is empty"));
    }
  } else {
    return absl::NotFoundError(absl::StrCat(
        dir, ": neither model.safetensors nor model.safetensors.index.json is present"));
  }

  std::map<std::string, const SafetensorsFile*> by_file;
  for (const std::string& name : files) {
    FLOTILLA_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> f,
                              SafetensorsFile::Open(dir + "/" + name));
    by_file[name] = f.get();
    ck->files_.push_back(std::move(f));
  }
  if (weight_map.empty()) {
    for (const TensorInfo& t : ck->files_[0]->tensors()) ck->tensors_[t.name] = &t;
  } else {
    for (const auto& [tensor, file] : weight_map) {
      const TensorInfo* t = by_file[file]->Find(tensor);
      if (t == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            index_path, ": weight_map puts '", tensor, "' in ", file, ", which does not hold it"));
      }
      ck->tensors_[tensor] = t;
    }
  }
  return ck;
}

const TensorInfo* Checkpoint::Find(absl::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second;
}

absl::StatusOr<const TensorInfo*> Checkpoint::Get(absl::string_view name,
                                                  const std::vector<DType>& dtypes,
                                                  const std::vector<int64_t>& shape) const {
  const TensorInfo* t = Find(name);
  if (t == nullptr) {
    return absl::NotFoundError(absl::StrCat(dir_, ": missing tensor '", name, "' (expected ",
                                            DTypeList(dtypes), " ", ShapeString(shape), ")"));
  }
  if (std::find(dtypes.begin(), dtypes.end(), t->dtype) == dtypes.end()) {
    return absl::InvalidArgumentError(absl::StrCat(dir_, ": tensor '", name, "' has dtype ",
                                                   DTypeName(t->dtype), ", expected ",
                                                   DTypeList(dtypes)));
  }
  if (t->shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat(dir_, ": tensor '", name, "' has shape ",
                                                   ShapeString(t->shape), ", expected ",
                                                   ShapeString(shape), " from config.json"));
  }
  return t;
}

absl::StatusOr<const TensorInfo*> Checkpoint::Get(const TensorSpec& expected) const {
  return Get(expected.name, {expected.dtype}, expected.shape);
}

absl::Status Checkpoint::Validate() const {
  for (const TensorSpec& spec : ExpectedTensors(config_)) {
    if (spec.name.ends_with(".self_attn.sinks")) {
      FLOTILLA_RETURN_IF_ERROR(Get(spec.name, {DType::kBF16, DType::kF32}, spec.shape).status());
    } else {
      FLOTILLA_RETURN_IF_ERROR(Get(spec).status());
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> Checkpoint::TensorNames() const {
  std::vector<std::string> names;
  for (const auto& [name, t] : tensors_) names.push_back(name);
  return names;
}

}  // namespace flotilla
