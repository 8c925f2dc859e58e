// Helpers for the checkpoint tests: scratch directories, hand-made
// safetensors files (valid or deliberately broken) and small configurations.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/model_config.h"
#include "worker/model/safetensors.h"

namespace flotilla::testing_util {

// A fresh empty directory under the test's temporary directory.
inline std::string ScratchDir(const std::string& name) {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string dir = ::testing::TempDir() + "/flotilla_model_" + info->test_suite_name() + "_" +
                    info->name() + "_" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

struct Entry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// The tensors of a safetensors file, copied out.
inline std::vector<Entry> ReadEntries(const std::string& path) {
  std::vector<Entry> out;
  auto f = SafetensorsFile::Open(path);
  EXPECT_TRUE(f.ok()) << f.status();
  if (!f.ok()) return out;
  for (const TensorInfo& t : (*f)->tensors()) {
    out.push_back({t.name, DTypeName(t.dtype), t.shape,
                   std::vector<uint8_t>(t.data, t.data + t.nbytes)});
  }
  return out;
}

inline void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A file image: the 8-byte little-endian `length` (the header's real length
// unless given), the header text and the data.
inline std::string FileImage(const std::string& header, const std::string& data,
                             int64_t length = -1) {
  uint64_t n = length < 0 ? header.size() : static_cast<uint64_t>(length);
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

// Writes `entries` contiguously in order, as a well-formed file would be.
inline void WriteSafetensors(const std::string& path, const std::vector<Entry>& entries) {
  nlohmann::json h = nlohmann::json::object();
  std::string data;
  for (const Entry& e : entries) {
    h[e.name] = {{"dtype", e.dtype},
                 {"shape", e.shape},
                 {"data_offsets", {data.size(), data.size() + e.bytes.size()}}};
    data.append(e.bytes.begin(), e.bytes.end());
  }
  std::string text = h.dump();
  while (text.size() % 8 != 0) text.push_back(' ');
  WriteBytes(path, FileImage(text, data));
}

// The tiny preset with a vocabulary of `vocab` ids, its end and padding ids
// the last two.
inline ModelConfig TinyWithVocab(int vocab) {
  ModelConfig c = ModelConfig::Tiny();
  c.vocab_size = vocab;
  c.eos_token_ids = {vocab - 1};
  c.pad_token_id = vocab - 2;
  return c;
}

}  // namespace flotilla::testing_util
