#include "tools/checkpoint/synthetic_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/bf16.h"
#include "common/model_spec.h"
#include "common/status.h"
#include "worker/model/checkpoint.h"
#include "worker/model/synthetic_tensors.h"

namespace flotilla {
namespace {

using nlohmann::json;

int64_t NumElements(const TensorSpec& t) {
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  return n;
}

int64_t NumBytes(const TensorSpec& t) { return NumElements(t) * DTypeSize(t.dtype); }

// Generates `spec` chunk by chunk into `out`.
// --hot-experts: the router bias of those experts raised by `hot_bias` in
// every layer, so that they are picked for (nearly) every token.
void RaiseHotExperts(const SyntheticCheckpointOptions& o, const TensorSpec& spec, int64_t first,
                     int64_t n, uint8_t* data) {
  if (o.hot_experts.empty() || !spec.name.ends_with("mlp.router.bias") ||
      spec.dtype != DType::kBF16) {
    return;
  }
  uint16_t* bias = reinterpret_cast<uint16_t*>(data);
  for (int e : o.hot_experts) {
    if (e < first || e >= first + n) continue;
    bias[e - first] = FloatToBf16(Bf16ToFloat(bias[e - first]) + o.hot_bias);
  }
}

absl::Status WriteTensor(const ModelConfig& c, const SyntheticCheckpointOptions& o,
                         const TensorSpec& spec, std::ofstream& out, const std::string& path) {
  const SyntheticTensor tensor =
      SyntheticTensorFor(c, SyntheticWeights(o.seed, o.chain), spec.name, spec.dtype);
  const int64_t total = NumElements(spec);
  constexpr int64_t kChunk = int64_t{1} << 22;
  std::vector<uint8_t> buf;
  for (int64_t done = 0; done < total; done += kChunk) {
    const int64_t n = std::min(kChunk, total - done);
    buf.resize(static_cast<size_t>(n * DTypeSize(spec.dtype)));
    FillSyntheticElements(tensor, done, n, buf.data());
    RaiseHotExperts(o, spec, done, n, buf.data());
    out.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
    if (!out) return absl::InternalError(absl::StrCat(path, ": write failed (disk full?)"));
  }
  return absl::OkStatus();
}

absl::Status WriteShard(const ModelConfig& c, const SyntheticCheckpointOptions& o,
                        const std::vector<TensorSpec>& tensors, const std::string& path) {
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};
  int64_t offset = 0;
  for (const TensorSpec& t : tensors) {
    const int64_t nbytes = NumBytes(t);
    header[t.name] = {{"dtype", DTypeName(t.dtype)}, {"shape", t.shape},
                      {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text = header.dump();
  // Pad so the data area starts 8-byte aligned, as the reference writer does.
  while ((text.size() + 8) % 8 != 0) text.push_back(' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat(path, ": cannot create"));
  uint8_t len[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const TensorSpec& t : tensors) FLOTILLA_RETURN_IF_ERROR(WriteTensor(c, o, t, out, path));
  out.close();
  if (!out) return absl::InternalError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

absl::Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

std::string ShardName(int i, int n) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model-%05d-of-%05d.safetensors", i + 1, n);
  return buf;
}

bool IsCheckpointFile(const std::string& name) {
  return name == "config.json" || name == "model.safetensors" ||
         name == "model.safetensors.index.json" ||
         (name.starts_with("model-") && name.ends_with(".safetensors"));
}

// Moves the complete checkpoint in `staging` to `dir`: one rename when `dir`
// does not exist; otherwise the earlier layout goes and each file is renamed
// in, config.json last (readers start from it).
absl::Status MoveCheckpoint(const std::filesystem::path& staging, const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    fs::rename(staging, dir, ec);
    if (ec) return absl::PermissionDeniedError(absl::StrCat(dir.string(), ": cannot create: ", ec.message()));
    return absl::OkStatus();
  }
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (IsCheckpointFile(entry.path().filename().string())) fs::remove(entry.path(), ec);
  }
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(staging, ec)) files.push_back(entry.path());
  std::stable_partition(files.begin(), files.end(),
                        [](const fs::path& p) { return p.filename() != "config.json"; });
  for (const fs::path& file : files) {
    fs::rename(file, dir / file.filename(), ec);
    if (ec) return absl::PermissionDeniedError(absl::StrCat(dir.string(), ": cannot write: ", ec.message()));
  }
  fs::remove_all(staging, ec);
  return absl::OkStatus();
}

absl::Status WriteCheckpointFiles(const ModelConfig& config,
                                  const SyntheticCheckpointOptions& options,
                                  const std::string& dir) {
  if (options.sinks_dtype != DType::kBF16 && options.sinks_dtype != DType::kF32) {
    return absl::InvalidArgumentError("sinks dtype must be BF16 or F32");
  }
  // Round-trip the config through its own validation, so what we write reads back.
  FLOTILLA_RETURN_IF_ERROR(ModelConfig::FromJson(config.ToJson()).status());
  for (int e : options.hot_experts) {
    if (e < 0 || e >= config.num_local_experts) {
      return absl::InvalidArgumentError(absl::StrCat("hot expert ", e, " is not in [0, ",
                                                     config.num_local_experts, ")"));
    }
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat(dir, ": cannot create: ", ec.message()));

  const std::vector<TensorSpec> tensors = ExpectedTensors(config, options.sinks_dtype);
  const int n = options.shards;
  if (n < 1 || n > static_cast<int>(tensors.size())) {
    return absl::InvalidArgumentError(absl::StrCat("shards must be in [1, ", tensors.size(),
                                                   "] for this config, got ", n));
  }
  FLOTILLA_RETURN_IF_ERROR(WriteText(dir + "/config.json", config.ToJson().dump(2) + "\n"));
  if (n == 1) return WriteShard(config, options, tensors, dir + "/model.safetensors");

  // Contiguous runs of tensors, cut where the running byte count crosses k/n
  // of the total (a tensor starts the next shard when its midpoint lies past
  // the boundary), never leaving a shard empty.
  int64_t total = 0;
  for (const TensorSpec& t : tensors) total += NumBytes(t);
  std::vector<std::vector<TensorSpec>> shards(n);
  int64_t before = 0;
  int cur = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorSpec& t = tensors[i];
    const int64_t left = static_cast<int64_t>(tensors.size() - i);  // this one included
    const double mid = static_cast<double>(before) + static_cast<double>(NumBytes(t)) / 2;
    const double boundary = static_cast<double>(total) * (cur + 1) / n;
    if (!shards[cur].empty() && cur < n - 1 && (left <= n - 1 - cur || mid > boundary)) ++cur;
    shards[cur].push_back(t);
    before += NumBytes(t);
  }
  json weight_map = json::object();
  for (int s = 0; s < n; ++s) {
    if (shards[s].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("cannot split this checkpoint into ", n, " shards"));
    }
    const std::string name = ShardName(s, n);
    FLOTILLA_RETURN_IF_ERROR(WriteShard(config, options, shards[s], dir + "/" + name));
    for (const TensorSpec& t : shards[s]) weight_map[t.name] = name;
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  return WriteText(dir + "/model.safetensors.index.json", index.dump(2) + "\n");
}

}  // namespace

absl::Status WriteSyntheticCheckpoint(const ModelConfig& config,
                                      const SyntheticCheckpointOptions& options,
                                      const std::string& dir) {
  namespace fs = std::filesystem;
  fs::path final_dir = fs::path(dir).lexically_normal();
  if (final_dir.filename().empty()) final_dir = final_dir.parent_path();  // "out/"
  if (final_dir.empty()) return absl::InvalidArgumentError("the checkpoint directory is empty");
  const fs::path staging = final_dir.parent_path() /
                           absl::StrCat(".", final_dir.filename().string(), ".partial-", getpid());
  std::error_code ec;
  if (!final_dir.parent_path().empty()) fs::create_directories(final_dir.parent_path(), ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat(dir, ": cannot create: ", ec.message()));
  fs::remove_all(staging, ec);
  absl::Status written = WriteCheckpointFiles(config, options, staging.string());
  if (written.ok()) written = MoveCheckpoint(staging, final_dir);
  fs::remove_all(staging, ec);
  if (written.ok()) return written;
  // Errors name the directory the user gave, not the staging one.
  return absl::Status(written.code(), absl::StrReplaceAll(written.message(),
                                                          {{staging.string(), final_dir.string()}}));
}

absl::StatusOr<ModelConfig> MakeSyntheticConfig(absl::string_view preset,
                                                const std::string& config_file,
                                                const std::vector<std::string>& sets) {
  json j;
  if (!config_file.empty()) {
    std::ifstream in(config_file);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", config_file));
    std::stringstream ss;
    ss << in.rdbuf();
    j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(config_file, ": not a JSON object"));
    }
  } else {
    FLOTILLA_ASSIGN_OR_RETURN(ModelConfig base, SyntheticPresetConfig(preset));
    j = base.ToJson();
  }
  auto layers = [&j]() -> int {
    auto it = j.find("num_hidden_layers");
    return it != j.end() && it->is_number_integer() ? it->get<int>() : -1;
  };
  const int layers_before = layers();
  bool layer_types_set = false;
  bool experts_per_token_set = false;
  for (const std::string& s : sets) {
    const size_t eq = s.find('=');
    if (eq == std::string::npos || eq == 0) {
      return absl::InvalidArgumentError(absl::StrCat("--set '", s, "': expected key=value"));
    }
    const std::string key = s.substr(0, eq);
    const std::string text = s.substr(eq + 1);
    json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (value.is_discarded()) value = text;
    json* node = &j;
    std::vector<std::string> parts = absl::StrSplit(key, '.');
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      if (!node->contains(parts[i]) || !(*node)[parts[i]].is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--set '", s, "': '", parts[i], "' is not an object in the config"));
      }
      node = &(*node)[parts[i]];
    }
    (*node)[parts.back()] = value;
    if (key == "layer_types") layer_types_set = true;
    if (key == "experts_per_token") experts_per_token_set = true;
  }
  if (!layer_types_set && layers() != layers_before && layers() > 0) {
    json lt = json::array();
    for (int i = 0; i < layers(); ++i) {
      lt.push_back(i % 2 == 0 ? "sliding_attention" : "full_attention");
    }
    j["layer_types"] = lt;
  }
  // Both spellings exist in the wild; keep them equal, the last one set winning.
  if (j.contains("num_experts_per_tok") && j.contains("experts_per_token")) {
    if (experts_per_token_set) {
      j["num_experts_per_tok"] = j["experts_per_token"];
    } else {
      j["experts_per_token"] = j["num_experts_per_tok"];
    }
  }
  return ModelConfig::FromJson(j);
}

}  // namespace flotilla
