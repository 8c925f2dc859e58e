// `flotilla generate --device cuda` as a user runs it, on a checkpoint with
// gpt-oss-120b's dimensions and 4 layers written by `flotilla make-checkpoint`:
// the engine comes from the worker's engine factory, its KV cache sized by
// the engine's own admission math over both KV groups (full-attention and
// sliding-window layers), so a 150-token prompt fits. Skips without a GPU.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <unistd.h>

#include "kernels/cuda/device.h"
#include "tests/run_command.h"

namespace {

using flotilla::testing_util::RunCommandWithStderr;

// 150 ids, none of them a special token.
std::string PromptIds() {
  std::string ids;
  for (int i = 0; i < 150; ++i) {
    if (i > 0) ids.push_back(',');
    ids.append(std::to_string(1000 + (i * 7919) % 90000));
  }
  return ids;
}

TEST(GenerateCudaCli, A150TokenPromptOnA4Layer120bCheckpoint) {
  if (flotilla::kernels::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("flotilla_generate_cuda_" + std::to_string(getpid()));
  const std::string bin = FLOTILLA_BIN;
  auto [rc, out] = RunCommandWithStderr(bin + " make-checkpoint --preset 120b --set "
                                              "num_hidden_layers=4 --out " + dir.string());
  ASSERT_EQ(rc, 0) << out;
  const std::string args =
      " --device cuda --prompt-ids " + PromptIds() + " --max-tokens 8 --temperature 0 --json";
  auto [rc_dir, from_dir] = flotilla::testing_util::RunCommand(
      bin + " generate --model " + dir.string() + args);
  std::filesystem::remove_all(dir);
  ASSERT_EQ(rc_dir, 0) << from_dir;
  const nlohmann::json j = nlohmann::json::parse(from_dir);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 150);
  EXPECT_EQ(j["tokens"].size(), 8u) << from_dir;
  EXPECT_EQ(j["finish_reason"], "length");
  // The same weights generated on the GPU (synthetic:PRESET:SEED:LAYERS)
  // give the same greedy tokens.
  auto [rc_synthetic, synthetic] =
      flotilla::testing_util::RunCommand(bin + " generate --model synthetic:120b:0:4" + args);
  ASSERT_EQ(rc_synthetic, 0) << synthetic;
  EXPECT_EQ(nlohmann::json::parse(synthetic)["tokens"], j["tokens"]);
}

}  // namespace
