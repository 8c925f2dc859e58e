#include "worker/model/demo_model.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/model_config.h"
#include "common/status.h"
#include "worker/model/checkpoint.h"
#include "worker/model/safetensors.h"

namespace flotilla {
namespace {

using nlohmann::json;

constexpr char kFormat[] = "flotilla-demo-v1";

// The compact image, checked: its config, vocabulary and every tensor but the
// two vocabulary-sized ones exactly as the expanded checkpoint holds them.
struct CompactModel {
  std::unique_ptr<SafetensorsFile> file;
  ModelConfig config;
  std::vector<int32_t> vocab_ids;  // ascending; row i of embed/lm_head is token vocab_ids[i]
};

absl::Status Invalid(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("demo model: ", what));
}

absl::StatusOr<CompactModel> ReadCompact(absl::Span<const uint8_t> image) {
  CompactModel m;
  FLOTILLA_ASSIGN_OR_RETURN(m.file,
                            SafetensorsFile::Parse(image.data(), static_cast<int64_t>(image.size()),
                                                   "the demo model's compact checkpoint"));
  const auto& meta = m.file->metadata();
  if (auto it = meta.find("format"); it == meta.end() || it->second != kFormat) {
    return Invalid(
        absl::StrCat("not a compact checkpoint (metadata 'format' is not '", kFormat, "')"));
  }
  auto it = meta.find("config");
  if (it == meta.end()) return Invalid("no 'config' in the metadata");
  const json config = json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded()) return Invalid("the metadata's config is not JSON");
  FLOTILLA_ASSIGN_OR_RETURN(m.config, ModelConfig::FromJson(config));
  if (m.config.ToJson() != ModelConfig::Demo().ToJson()) {
    return Invalid("its config is not ModelConfig::Demo() (retrain, or change both together)");
  }
  const TensorInfo* vocab = m.file->Find("vocab_ids");
  if (vocab == nullptr || vocab->dtype != DType::kI32 || vocab->shape.size() != 1) {
    return Invalid("no vocab_ids tensor of I32 [U]");
  }
  m.vocab_ids.resize(static_cast<size_t>(vocab->shape[0]));
  std::memcpy(m.vocab_ids.data(), vocab->data, static_cast<size_t>(vocab->nbytes));
  for (size_t i = 0; i < m.vocab_ids.size(); ++i) {
    const int32_t id = m.vocab_ids[i];
    if (id < 0 || id >= m.config.vocab_size || (i > 0 && id <= m.vocab_ids[i - 1])) {
      return Invalid(
          absl::StrCat("vocab_ids[", i, "] = ", id, " (ids must ascend inside the vocabulary)"));
    }
  }
  const int64_t rows = static_cast<int64_t>(m.vocab_ids.size()) + 1;
  for (const TensorSpec& spec : ExpectedTensors(m.config)) {
    std::vector<int64_t> shape = spec.shape;
    if (spec.name == "model.embed_tokens.weight" || spec.name == "lm_head.weight") shape[0] = rows;
    const TensorInfo* t = m.file->Find(spec.name);
    if (t == nullptr || t->dtype != spec.dtype || t->shape != shape) {
      return Invalid(absl::StrCat(
          spec.name, " is ",
          t ? absl::StrCat(DTypeName(t->dtype), " ", ShapeString(t->shape)) : "missing",
          ", expected ", DTypeName(spec.dtype), " ", ShapeString(shape)));
    }
  }
  return m;
}

// Row r of the full vocabulary's [V, H] table: the compact row of token r, or
// the shared last row.
void WriteVocabTable(const CompactModel& m, const TensorInfo& compact, std::ostream& out) {
  const int64_t row_bytes = compact.nbytes / compact.shape[0];
  const uint8_t* shared = compact.data + (compact.shape[0] - 1) * row_bytes;
  size_t next = 0;
  for (int32_t token = 0; token < m.config.vocab_size; ++token) {
    const uint8_t* row = shared;
    if (next < m.vocab_ids.size() && m.vocab_ids[next] == token) {
      row = compact.data + static_cast<int64_t>(next) * row_bytes;
      ++next;
    }
    out.write(reinterpret_cast<const char*>(row), row_bytes);
  }
}

absl::Status WriteModelFile(const CompactModel& m, const std::string& path) {
  const std::vector<TensorSpec> specs = ExpectedTensors(m.config);
  return WriteSafetensorsWith(path, specs, [&](size_t i, std::ostream& out) {
    const TensorInfo& compact = *m.file->Find(specs[i].name);
    if (specs[i].name == "model.embed_tokens.weight" || specs[i].name == "lm_head.weight") {
      WriteVocabTable(m, compact, out);
    } else {
      out.write(reinterpret_cast<const char*>(compact.data), compact.nbytes);
    }
  });
}

uint64_t Fnv1a(absl::Span<const uint8_t> bytes) {
  uint64_t h = 1469598103934665603ull;
  for (uint8_t b : bytes) h = (h ^ b) * 1099511628211ull;
  return h;
}

}  // namespace

std::string ModelCacheRoot() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return (std::filesystem::path(xdg) / "flotilla").string();
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return (std::filesystem::path(home) / ".cache" / "flotilla").string();
  }
  std::error_code ec;
  return (std::filesystem::temp_directory_path(ec) / "flotilla").string();
}

absl::Status WriteDemoCheckpoint(absl::Span<const uint8_t> image, const std::string& dir) {
  FLOTILLA_ASSIGN_OR_RETURN(CompactModel m, ReadCompact(image));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat(dir, ": cannot create: ", ec.message()));
  FLOTILLA_RETURN_IF_ERROR(WriteModelFile(m, dir + "/model.safetensors"));
  // config.json last: readers start from it.
  std::ofstream config(dir + "/config.json", std::ios::trunc);
  config << m.config.ToJson().dump(2) << "\n";
  config.close();
  if (!config) return absl::InternalError(absl::StrCat(dir, "/config.json: write failed"));
  return absl::OkStatus();
}

absl::StatusOr<std::string> DemoCheckpointDir() {
  namespace fs = std::filesystem;
  const absl::Span<const uint8_t> image = DemoCompactImage();
  const fs::path root = ModelCacheRoot();
  const fs::path dir = root / absl::StrFormat("demo-%016x", Fnv1a(image));
  std::error_code ec;
  if (fs::exists(dir / "config.json", ec)) return dir.string();
  const fs::path staging = root / absl::StrFormat(".demo.partial-%d", getpid());
  fs::remove_all(staging, ec);
  if (absl::Status st = WriteDemoCheckpoint(image, staging.string()); !st.ok()) {
    fs::remove_all(staging, ec);
    return st;
  }
  fs::rename(staging, dir, ec);
  if (ec) {
    fs::remove_all(staging, ec);
    std::error_code exists_ec;
    if (!fs::exists(dir / "config.json", exists_ec)) {
      return absl::PermissionDeniedError(
          absl::StrCat(dir.string(), ": cannot write the demo model there"));
    }
  }
  return dir.string();
}

}  // namespace flotilla
