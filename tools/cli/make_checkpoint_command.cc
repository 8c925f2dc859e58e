#include "tools/cli/make_checkpoint_command.h"

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "common/model_spec.h"
#include "tools/checkpoint/synthetic_checkpoint.h"
#include "worker/model/checkpoint.h"
#include "worker/model/demo_model.h"

namespace flotilla::cli {
namespace {

int ReadBack(const std::string& out);

struct MakeCheckpointOptions {
  std::string out;
  std::string preset = "tiny";
  std::string config;
  std::vector<std::string> sets;
  uint64_t seed = 0;
  int shards = 1;
  std::string sinks_dtype = "bf16";
  std::vector<int> hot_experts;
  float hot_bias = 8;
};

// --preset demo: the trained demo model's built-in compact checkpoint, expanded.
absl::Status WriteDemo(const MakeCheckpointOptions& o) {
  if (!o.config.empty() || !o.sets.empty() || o.seed != 0 || o.shards != 1 ||
      o.sinks_dtype != "bf16" || !o.hot_experts.empty()) {
    return absl::InvalidArgumentError(
        "--preset demo writes the trained demo model as it is: it takes none of --config, --set, "
        "--seed, --shards, --sinks-dtype, --hot-experts");
  }
  return WriteDemoCheckpoint(DemoCompactImage(), o.out);
}

int RunMakeCheckpoint(const MakeCheckpointOptions& o) {
  if (o.preset == kDemoPreset) {
    if (absl::Status st = WriteDemo(o); !st.ok()) {
      std::cerr << "flotilla make-checkpoint: " << st.message() << "\n";
      return st.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
    }
    return ReadBack(o.out);
  }
  absl::StatusOr<ModelConfig> config = MakeSyntheticConfig(o.preset, o.config, o.sets);
  if (!config.ok()) {
    std::cerr << "flotilla make-checkpoint: " << config.status().message() << "\n";
    return 2;
  }
  SyntheticCheckpointOptions opts;
  opts.seed = o.seed;
  opts.chain = IsChainPreset(o.preset);
  opts.shards = o.shards;
  opts.sinks_dtype = o.sinks_dtype == "f32" ? DType::kF32 : DType::kBF16;
  opts.hot_experts = o.hot_experts;
  opts.hot_bias = o.hot_experts.empty() ? 0 : o.hot_bias;
  if (absl::Status st = WriteSyntheticCheckpoint(*config, opts, o.out); !st.ok()) {
    std::cerr << "flotilla make-checkpoint: " << st.message() << "\n";
    return 1;
  }
  return ReadBack(o.out);
}

// What was written must open and validate.
int ReadBack(const std::string& out) {
  absl::StatusOr<std::unique_ptr<Checkpoint>> ck = Checkpoint::Open(out);
  absl::Status st = ck.ok() ? (*ck)->Validate() : ck.status();
  if (!st.ok()) {
    std::cerr << "flotilla make-checkpoint: written checkpoint does not read back: " << st.message()
              << "\n";
    return 1;
  }
  int64_t bytes = 0;
  for (const auto& f : (*ck)->files()) bytes += f->file_size();
  std::cout << "wrote " << out << ": " << (*ck)->TensorNames().size() << " tensors in "
            << (*ck)->files().size() << " file(s), " << bytes << " bytes\n";
  return 0;
}

}  // namespace

void AddMakeCheckpointCommand(CLI::App& app) {
  auto o = std::make_shared<MakeCheckpointOptions>();
  CLI::App* cmd = app.add_subcommand(
      "make-checkpoint", "Write a synthetic gpt-oss checkpoint (Hugging Face layout)");
  cmd->add_option("--out", o->out, "Output directory")->required();
  cmd->add_option(
         "--preset", o->preset,
         "Shape preset: tiny, 20b or 120b (default tiny), each also with -chain (the same shapes, "
         "every token's next token clear: common/model_spec.h); demo: the trained demo model")
      ->check(CLI::IsMember({"tiny", "20b", "120b", "demo"}));
  cmd->add_option("--config", o->config, "Start from this config.json instead of a preset")
      ->check(CLI::ExistingFile);
  cmd->add_option("--set", o->sets, "Override a config field: key=value (repeatable)");
  cmd->add_option("--seed", o->seed, "Random seed (default 0)");
  cmd->add_option("--shards", o->shards, "Number of .safetensors files (default 1)")
      ->check(CLI::Range(1, 99999));
  cmd->add_option("--sinks-dtype", o->sinks_dtype, "dtype of self_attn.sinks: bf16 or f32")
      ->check(CLI::IsMember({"bf16", "f32"}));
  cmd->add_option("--hot-experts", o->hot_experts,
                  "experts (ids, comma-separated) made hot in every layer by a raised router bias")
      ->delimiter(',');
  cmd->add_option("--hot-bias", o->hot_bias, "what --hot-experts adds to their router bias (default 8)");
  cmd->callback([o] {
    int rc = RunMakeCheckpoint(*o);
    if (rc != 0) throw CLI::RuntimeError(rc);  // CLI11 exits with rc, printing nothing more
  });
}

}  // namespace flotilla::cli
