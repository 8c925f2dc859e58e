// The demo model's compact checkpoint and its expansion: the built-in image
// expands into a checkpoint that validates, each vocabulary row is the
// compact row of its token or the shared one, synthetic:demo opens it, and a
// damaged image is refused naming what is wrong.
#include "worker/model/demo_model.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/model_config.h"
#include "common/model_spec.h"
#include "worker/model/checkpoint.h"
#include "worker/model/model_source.h"
#include "worker/model/safetensors.h"

namespace flotilla {
namespace {

std::string TempDir(const std::string& name) {
  return ::testing::TempDir() + "demo_model_test_" + name + "_" + std::to_string(getpid());
}

TEST(DemoModel, ExpandsIntoACheckpointWithTheFullVocabulary) {
  const std::string dir = TempDir("expand");
  ASSERT_TRUE(WriteDemoCheckpoint(DemoCompactImage(), dir).ok());
  auto ck = Checkpoint::Open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status();
  ASSERT_TRUE((*ck)->Validate().ok());
  EXPECT_EQ((*ck)->config().ToJson(), ModelConfig::Demo().ToJson());

  auto compact = SafetensorsFile::Parse(DemoCompactImage().data(),
                                        static_cast<int64_t>(DemoCompactImage().size()), "image");
  ASSERT_TRUE(compact.ok());
  const TensorInfo* ids = (*compact)->Find("vocab_ids");
  ASSERT_NE(ids, nullptr);
  std::vector<int32_t> vocab(static_cast<size_t>(ids->shape[0]));
  std::memcpy(vocab.data(), ids->data, static_cast<size_t>(ids->nbytes));
  ASSERT_GT(vocab.size(), 100u);
  for (const char* name : {"model.embed_tokens.weight", "lm_head.weight"}) {
    const TensorInfo* small = (*compact)->Find(name);
    const TensorInfo* full = (*ck)->Find(name);
    ASSERT_NE(full, nullptr);
    const int64_t row = full->nbytes / full->shape[0];
    ASSERT_EQ(full->shape[0], ModelConfig::Demo().vocab_size);
    // A used token's row, and an unused one (one past the last used id)
    // carrying the shared last row.
    for (size_t i : {size_t{0}, vocab.size() / 2, vocab.size() - 1}) {
      EXPECT_EQ(std::memcmp(full->data + vocab[i] * row, small->data + i * row, row), 0) << name;
    }
    const int64_t unused = vocab.back() + 1 < full->shape[0] ? vocab.back() + 1 : vocab[0] - 1;
    EXPECT_EQ(std::memcmp(full->data + unused * row, small->data + vocab.size() * row, row), 0);
  }
  std::filesystem::remove_all(dir);
}

TEST(DemoModel, SyntheticDemoOpensTheExpandedCheckpoint) {
  setenv("XDG_CACHE_HOME", TempDir("cache").c_str(), 1);
  auto source = ModelSource::Open("synthetic:demo");
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ((*source)->synthetic(), nullptr);  // a checkpoint, not generated weights
  EXPECT_EQ((*source)->config().ToJson(), ModelConfig::Demo().ToJson());
  // Opened again, the cached expansion serves.
  EXPECT_TRUE(ModelSource::Open("synthetic:demo").ok());
  std::filesystem::remove_all(TempDir("cache"));
}

TEST(DemoModel, RefusesASeedOrALayerCount) {
  auto spec = ParseSyntheticModel("synthetic:demo:3");
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find("takes no seed"), std::string::npos) << spec.status();
}

TEST(DemoModel, RefusesADamagedImage) {
  const auto image = DemoCompactImage();
  // Not safetensors at all.
  const std::vector<uint8_t> junk(64, 0xff);
  absl::Status st = WriteDemoCheckpoint(junk, TempDir("junk"));
  EXPECT_FALSE(st.ok());
  // The format named in the metadata changed.
  std::vector<uint8_t> copy(image.begin(), image.end());
  const std::string format = "flotilla-demo-v1";
  auto at = std::search(copy.begin(), copy.end(), format.begin(), format.end());
  ASSERT_NE(at, copy.end());
  at[format.size() - 1] = '9';
  st = WriteDemoCheckpoint(copy, TempDir("format"));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("format"), std::string::npos) << st;
}

}  // namespace
}  // namespace flotilla
