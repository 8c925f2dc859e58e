// The transformers golden fixtures under tests/data/golden (see its README),
// shared by the engine tests. FLOTILLA_GOLDEN_DIR (compile definition) names
// the source tree's folder; the same variable in the environment overrides it
// (test binaries carried to a GPU machine).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/checkpoint.h"
#include "worker/model/load_weights.h"

namespace flotilla::testing_golden {

inline std::string GoldenDir() {
  const char* env = std::getenv("FLOTILLA_GOLDEN_DIR");
  return env != nullptr && *env != '\0' ? env : FLOTILLA_GOLDEN_DIR;
}

// Names of the fixture folders (those with a golden.json), sorted.
inline std::vector<std::string> Fixtures() {
  namespace fs = std::filesystem;
  std::vector<std::string> names;
  if (!fs::is_directory(GoldenDir())) return names;
  for (const auto& entry : fs::directory_iterator(GoldenDir())) {
    if (entry.is_directory() && fs::exists(entry.path() / "golden.json")) {
      names.push_back(entry.path().filename().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

// A raw little-endian f32 file.
inline std::vector<float> ReadF32(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot open " << path;
  in.seekg(0, std::ios::end);
  std::vector<float> v(static_cast<size_t>(in.tellg()) / sizeof(float));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()), v.size() * sizeof(float));
  return v;
}

// A fixture's transformers results (golden.json) and its checkpoint's
// weights, whole (no sharding).
struct LoadedFixture {
  nlohmann::json golden;
  ModelWeights weights;
};

inline absl::StatusOr<LoadedFixture> LoadFixture(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::path(GoldenDir()) / name;
  std::ifstream in(dir / "golden.json");
  nlohmann::json golden = nlohmann::json::parse(in);
  absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(dir.string());
  if (!checkpoint.ok()) return checkpoint.status();
  absl::StatusOr<ModelWeights> weights =
      LoadWeights(std::shared_ptr<const Checkpoint>(*std::move(checkpoint)), ShardSpec{});
  if (!weights.ok()) return weights.status();
  return LoadedFixture{std::move(golden), *std::move(weights)};
}

}  // namespace flotilla::testing_golden
