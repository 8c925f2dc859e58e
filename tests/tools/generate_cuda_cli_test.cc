// `flotilla generate --device cuda` as a user runs it, on a checkpoint with
// gpt-oss-120b's dimensions and 4 layers written by `flotilla make-checkpoint`:
// the engine comes from the worker's engine factory, its KV cache sized by
// the engine's own admission math over both KV groups (full-attention and
// sliding-window layers), so a 150-token prompt fits. Skips without a GPU.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

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
  // The GPU suite runs a bundle: its programs are where FLOTILLA_BIN_DIR says.
  const char* bin_dir = std::getenv("FLOTILLA_BIN_DIR");
  const std::string bin = bin_dir != nullptr ? std::string(bin_dir) + "/flotilla" : FLOTILLA_BIN;
  auto [rc, out] = RunCommandWithStderr(bin + " make-checkpoint --preset 120b --set "
                                              "num_hidden_layers=4 --out " + dir.string());
  ASSERT_EQ(rc, 0) << out;
  const std::string args = " --device cuda --prompt-ids " + PromptIds() +
                           " --max-tokens 8 --temperature 0 --logprobs 2 --json";
  auto [rc_dir, from_dir] = flotilla::testing_util::RunCommand(
      bin + " generate --model " + dir.string() + args);
  std::filesystem::remove_all(dir);
  ASSERT_EQ(rc_dir, 0) << from_dir;
  const nlohmann::json j = nlohmann::json::parse(from_dir);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 150);
  EXPECT_EQ(j["tokens"].size(), 8u) << from_dir;
  EXPECT_EQ(j["finish_reason"], "length");
  // The same weights generated on the GPU (synthetic:PRESET:SEED:LAYERS)
  // give the same greedy tokens, up to the first near tie. The CUDA MoE adds
  // a token's expert outputs with float atomics, in no fixed order, so two
  // runs of the same weights differ a little: at these widths with random
  // weights, top logprobs by up to ~0.05 and a choice with a 0.12 margin
  // flipped (H200). After a tie the two runs continue different texts. A
  // wrong weight (layout, scale, name) moves logprobs by far more.
  auto [rc_synthetic, synthetic] =
      flotilla::testing_util::RunCommand(bin + " generate --model synthetic:120b:0:4" + args);
  ASSERT_EQ(rc_synthetic, 0) << synthetic;
  const nlohmann::json k = nlohmann::json::parse(synthetic);
  ASSERT_EQ(k["tokens"].size(), j["tokens"].size()) << synthetic;
  constexpr double kNear = 0.1;  // top logprobs of the same text
  constexpr double kTie = 0.25;  // a top-2 margin that run-to-run rounding may flip
  for (size_t i = 0; i < j["tokens"].size(); ++i) {
    const nlohmann::json& mine = j["logprobs"][i]["top_logprobs"];
    const nlohmann::json& theirs = k["logprobs"][i]["top_logprobs"];
    EXPECT_NEAR(mine[0]["logprob"].get<double>(), theirs[0]["logprob"].get<double>(), kNear)
        << "position " << i << ": " << from_dir << "\n"
        << synthetic;
    if (j["tokens"][i] == k["tokens"][i]) continue;
    const double margin = mine[0]["logprob"].get<double>() - mine[1]["logprob"].get<double>();
    EXPECT_LT(margin, kTie) << "position " << i << " differs without a tie: " << from_dir << "\n"
                            << synthetic;
    EXPECT_EQ(mine[1]["token"], k["tokens"][i]) << "position " << i;
    break;
  }
}

}  // namespace
