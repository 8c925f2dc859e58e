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
#include <string>
#include <vector>

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

}  // namespace flotilla::testing_golden
