#include "tools/cli/generate_command.h"

#include <charconv>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cpu/thread_pool.h"
#include "common/parallel_config.h"
#include "worker/engine_factory.h"
#include "worker/engine/generate.h"
#include "worker/model/model_source.h"
#include "tools/cli/tls_flags.h"
#include "tools/sdk/client.h"

namespace flotilla::cli {
namespace {

struct GenerateFlags {
  TlsClientFiles tls;
  std::string model;
  std::string coordinator;
  std::string api_key;
  double timeout_s = 600;
  std::string prompt_ids;
  // The sampling flags bind to these fields (their defaults are the flags'
  // defaults); --logprobs and --stop-token-ids are read apart.
  SamplingParams sampling;
  std::optional<std::string> stop_token_ids;
  std::optional<int> logprobs;
  std::string logits_out;
  int threads = 0;
  std::string device = "cpu";
  int64_t prefill_chunk = 0;
  int64_t kv_block_size = 16;
  std::string moe_activation = "auto";
  bool json = false;
};

// "1,2,3" -> ids; the error names the flag and the bad piece.
absl::StatusOr<std::vector<int>> ParseIds(const std::string& flag, const std::string& text,
                                          bool allow_empty) {
  std::vector<int> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    std::string piece = text.substr(pos, comma - pos);
    while (!piece.empty() && piece.front() == ' ') piece.erase(piece.begin());
    while (!piece.empty() && piece.back() == ' ') piece.pop_back();
    if (!(piece.empty() && allow_empty && text.find_first_not_of(' ') == std::string::npos)) {
      int v = 0;
      auto [end, ec] = std::from_chars(piece.data(), piece.data() + piece.size(), v);
      if (piece.empty() || ec != std::errc() || end != piece.data() + piece.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            flag, ": '", piece, "' is not an integer token id (expected e.g. 1,2,3)"));
      }
      ids.push_back(v);
    }
    pos = comma + 1;
  }
  if (ids.empty() && !allow_empty) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": no token ids given"));
  }
  return ids;
}

nlohmann::json ResultJson(const GenerationResult& r, bool with_logprobs) {
  nlohmann::json j;
  j["tokens"] = r.tokens;
  j["finish_reason"] = r.finish_reason;
  j["stop_token"] = r.stop_token >= 0 ? nlohmann::json(r.stop_token) : nlohmann::json(nullptr);
  j["usage"] = {{"prompt_tokens", r.prompt_tokens},
                {"completion_tokens", r.completion_tokens},
                {"total_tokens", r.prompt_tokens + r.completion_tokens}};
  if (with_logprobs) {
    nlohmann::json lps = nlohmann::json::array();
    for (const TokenLogprob& lp : r.logprobs) {
      nlohmann::json top = nlohmann::json::array();
      for (const auto& [t, v] : lp.top) top.push_back({{"token", t}, {"logprob", v}});
      lps.push_back({{"token", lp.token}, {"logprob", lp.logprob}, {"top_logprobs", top}});
    }
    j["logprobs"] = lps;
  }
  return j;
}

// The engine `--device` names, built by the worker's engine factory for an
// instance of one rank serving one sequence of up to `tokens`, as a worker
// given that assignment would build it: the KV cache sized by the engine's
// own admission math (every KV group: full-attention and sliding-window
// layers), a synthetic model generated on the GPU under --device cuda.
absl::StatusOr<worker::RankEngine> BuildEngine(const GenerateFlags& f, const ModelSource& source,
                                               int64_t tokens, int64_t step_tokens,
                                               kernels::cpu::ThreadPool* pool) {
  worker::EngineFactories factories = worker::DefaultEngineFactories();
  auto factory = factories.find(f.device);
  if (factory == factories.end()) {
    return absl::InvalidArgumentError(absl::StrCat("--device ", f.device, ": no such engine"));
  }
  const ModelConfig& config = source.config();
  FLOTILLA_ASSIGN_OR_RETURN(ParallelConfig parallel, ParallelConfig::Create(1, 1, config));
  cluster::Assignment assignment;
  assignment.set_world_size(1);
  assignment.set_tp_size(1);
  assignment.set_max_sequences(1);
  assignment.set_max_batch_tokens(static_cast<uint32_t>(step_tokens));
  assignment.set_max_model_len(static_cast<uint32_t>(tokens));
  worker::WorkerOptions options;
  options.device = f.device;
  options.threads = f.threads;
  options.kv_block_size = f.kv_block_size;
  options.moe_activation = f.moe_activation;
  options.kv_tokens = tokens;
  cluster::StartComm start;
  worker::EngineSpec spec;
  spec.assignment = &assignment;
  spec.start = &start;
  spec.parallel = &parallel;
  spec.model = &source;
  spec.pool = pool;
  spec.options = &options;
  if (factory->second->WantsHostWeights(source)) {
    FLOTILLA_ASSIGN_OR_RETURN(spec.weights, source.LoadShard(ShardSpec{}));
  } else {
    spec.weights.config = config;
  }
  return factory->second->Create(std::move(spec));
}

// The same request sent to a running cluster through the client API.
absl::Status PrintResult(const GenerateFlags& f, const GenerationResult& result,
                         size_t prompt_size);

absl::Status RunRemote(const GenerateFlags& f, const std::vector<int>& prompt) {
  v1::GenerateRequest req;
  for (int t : prompt) req.mutable_prompt_ids()->add_ids(t);
  common::SamplingParams* s = req.mutable_sampling();
  s->set_temperature(f.sampling.temperature);
  s->set_top_p(f.sampling.top_p);
  s->set_top_k(f.sampling.top_k);
  s->set_min_p(f.sampling.min_p);
  if (f.sampling.seed) s->set_seed(*f.sampling.seed);
  s->set_frequency_penalty(f.sampling.frequency_penalty);
  s->set_presence_penalty(f.sampling.presence_penalty);
  s->set_max_tokens(static_cast<uint32_t>(f.sampling.max_tokens));
  if (f.logprobs) {
    s->set_return_logprobs(true);
    s->set_logprobs(*f.logprobs);
  }
  if (f.stop_token_ids) {
    FLOTILLA_ASSIGN_OR_RETURN(std::vector<int> stops,
                              ParseIds("--stop-token-ids", *f.stop_token_ids, true));
    // As in-process: the list replaces the model's end tokens.
    s->set_ignore_eos(true);
    for (int t : stops) s->add_stop_token_ids(t);
  }
  req.set_return_prompt_logits(!f.logits_out.empty());
  client::ClientOptions co;
  co.address = f.coordinator;
  co.api_key = f.api_key;
  co.tls = f.tls;
  co.deadline = absl::Milliseconds(static_cast<int64_t>(f.timeout_s * 1000));
  FLOTILLA_ASSIGN_OR_RETURN(std::unique_ptr<client::Client> c, client::Client::Create(co));
  absl::StatusOr<client::GenerateResult> res = c->Generate(req);
  if (!res.ok()) {
    return absl::Status(res.status().code(),
                        absl::StrCat(f.coordinator, ": ", res.status().message()));
  }
  GenerationResult r;
  r.tokens = res->token_ids;
  for (const common::TokenLogprob& l : res->logprobs) {
    TokenLogprob lp;
    lp.token = l.token_id();
    lp.logprob = l.logprob();
    for (const auto& t : l.top()) lp.top.push_back({t.token_id(), t.logprob()});
    r.logprobs.push_back(std::move(lp));
  }
  r.finish_reason = res->finish_reason == common::STOP ? "stop" : "length";
  r.prompt_tokens = res->prompt_tokens;
  r.completion_tokens = res->completion_tokens;
  if (res->stop_token) r.stop_token = *res->stop_token;
  r.prompt_logits = std::move(res->prompt_logits);
  return PrintResult(f, r, prompt.size());
}

absl::Status RunGenerate(const GenerateFlags& f) {
  FLOTILLA_ASSIGN_OR_RETURN(std::vector<int> prompt_ints,
                            ParseIds("--prompt-ids", f.prompt_ids, false));
  if (!f.coordinator.empty()) return RunRemote(f, prompt_ints);
  if (f.model.empty()) {
    return absl::InvalidArgumentError(
        "give --model DIR (or synthetic:PRESET[:SEED]) or --coordinator HOST:PORT");
  }
  GenerateOptions opts;
  opts.sampling = f.sampling;
  SamplingParams& s = opts.sampling;
  if (f.logprobs) {
    s.logprobs = true;
    s.top_logprobs = *f.logprobs;
  }
  if (f.stop_token_ids) {
    FLOTILLA_ASSIGN_OR_RETURN(s.stop_token_ids, ParseIds("--stop-token-ids", *f.stop_token_ids, true));
  }
  opts.prefill_chunk = f.prefill_chunk;
  opts.return_prompt_logits = !f.logits_out.empty();

  absl::StatusOr<std::unique_ptr<ModelSource>> source = ModelSource::Open(f.model);
  if (!source.ok() && IsSyntheticModel(f.model)) return source.status();  // names the spec
  if (!source.ok()) {
    return absl::Status(source.status().code(),
                        absl::StrCat("--model ", f.model, ": ", source.status().message()));
  }
  const ModelConfig config = (*source)->config();
  FLOTILLA_RETURN_IF_ERROR(s.Validate(config.vocab_size));

  std::vector<int32_t> prompt(prompt_ints.begin(), prompt_ints.end());
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("--prompt-ids: token id ", prompt[i],
                                                     " at index ", i, " is out of range [0, ",
                                                     config.vocab_size, ")"));
    }
  }
  if (static_cast<int64_t>(prompt.size()) > config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--prompt-ids: ", prompt.size(), " tokens is longer than the context (max_position_embeddings ",
        config.max_position_embeddings, ")"));
  }
  if (f.threads < 0) return absl::InvalidArgumentError("--threads must be >= 0 (0 = all cores)");
  const int64_t tokens = std::min<int64_t>(
      config.max_position_embeddings, static_cast<int64_t>(prompt.size()) + f.sampling.max_tokens);
  // The GPU engine's step holds at most 4096 prompt tokens (its workspaces
  // are sized for that); the CPU engine takes the whole prompt unless
  // --prefill-chunk says otherwise.
  constexpr int64_t kCudaStepTokens = 4096;
  if (f.device == "cuda" && (opts.prefill_chunk == 0 || opts.prefill_chunk > kCudaStepTokens)) {
    opts.prefill_chunk = kCudaStepTokens;
  }
  const int64_t step_tokens =
      opts.prefill_chunk > 0 ? opts.prefill_chunk : static_cast<int64_t>(prompt.size());
  kernels::cpu::ThreadPool pool(f.device == "cpu" ? f.threads : 1);
  FLOTILLA_ASSIGN_OR_RETURN(worker::RankEngine built,
                            BuildEngine(f, **source, tokens, step_tokens, &pool));
  FLOTILLA_ASSIGN_OR_RETURN(GenerationResult result, Generate(*built.engine, prompt, opts));
  return PrintResult(f, result, prompt.size());
}

absl::Status PrintResult(const GenerateFlags& f, const GenerationResult& result,
                         size_t prompt_size) {
  if (!f.logits_out.empty()) {
    std::ofstream out(f.logits_out);
    if (!out) return absl::InvalidArgumentError(absl::StrCat("--logits-out: cannot write ", f.logits_out));
    const int64_t V = prompt_size ? result.prompt_logits.size() / prompt_size : 0;
    out << "[";
    for (size_t t = 0; t < prompt_size; ++t) {
      out << (t ? ",\n[" : "\n[");
      for (int64_t v = 0; v < V; ++v) {
        if (v) out << ",";
        out << nlohmann::json(result.prompt_logits[t * V + v]).dump();
      }
      out << "]";
    }
    out << "\n]\n";
    if (!out) return absl::InternalError(absl::StrCat("--logits-out: write to ", f.logits_out, " failed"));
  }
  if (f.json) {
    std::cout << ResultJson(result, f.logprobs.has_value()).dump() << std::endl;
  } else {
    std::cout << "tokens:";
    for (int32_t t : result.tokens) std::cout << " " << t;
    std::cout << "\nfinish_reason: " << result.finish_reason << "\n";
  }
  return absl::OkStatus();
}

}  // namespace

void AddGenerateCommand(CLI::App& app) {
  auto f = std::make_shared<GenerateFlags>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate tokens in-process (--model) or on a cluster (--coordinator)");
  auto* model = cmd->add_option("--model", f->model,
                                "Checkpoint directory, or synthetic:PRESET[:SEED] (the weights "
                                "make-checkpoint would write, generated in memory): generate in "
                                "this process");
  auto* coord = cmd->add_option("--coordinator", f->coordinator,
                                "HOST:PORT of a running cluster: send the request there");
  model->excludes(coord);
  cmd->add_option("--api-key", f->api_key,
                  "API key for --coordinator, sent as \"Authorization: Bearer KEY\"")
      ->envname("FLOTILLA_API_KEY");
  AddClientTlsFlags(cmd, &f->tls);
  cmd->add_option("--timeout", f->timeout_s, "Seconds before a --coordinator request gives up")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--prompt-ids", f->prompt_ids, "Prompt token ids, comma-separated: 1,2,3")->required();
  cmd->add_option("--max-tokens", f->sampling.max_tokens, "Most tokens to generate (default 16)");
  cmd->add_option("--temperature", f->sampling.temperature, "0 = greedy (default 1)");
  cmd->add_option("--top-p", f->sampling.top_p, "Nucleus sampling mass in (0, 1] (default 1)");
  cmd->add_option("--top-k", f->sampling.top_k, "Keep the k most likely tokens; 0 = off");
  cmd->add_option("--min-p", f->sampling.min_p, "Drop tokens below min_p * p(top) (default 0)");
  cmd->add_option("--seed", f->sampling.seed, "Sampling seed: same seed, same tokens");
  cmd->add_option("--frequency-penalty", f->sampling.frequency_penalty, "In [-2, 2] (default 0)");
  cmd->add_option("--presence-penalty", f->sampling.presence_penalty, "In [-2, 2] (default 0)");
  cmd->add_option("--stop-token-ids", f->stop_token_ids,
                  "Stop tokens, comma-separated (default: the config's eos ids; empty = none)");
  cmd->add_option("--logprobs", f->logprobs,
                  "Report each token's logprob and this many alternatives (0-20)");
  cmd->add_option("--logits-out", f->logits_out,
                  "Write the logits of every prompt position to FILE as a JSON array [T][V]");
  cmd->add_option("--device", f->device, "engine: cpu (reference) or cuda (one GPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--threads", f->threads, "CPU threads (default: all cores)")
      ->check(CLI::Range(0, 1024));
  cmd->add_option("--prefill-chunk", f->prefill_chunk, "Prompt tokens per step (default: all)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--kv-block-size", f->kv_block_size, "Tokens per KV block (default 16)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--moe-activation", f->moe_activation,
                  "the experts' inputs: bf16 (the engine's own precision), fp8 (MXFP8 blocks of 32 "
                  "values, the numerics of a W4A8 MoE; --device cpu only) or auto (bf16)")
      ->check(CLI::IsMember({"auto", "bf16", "fp8"}));
  cmd->add_flag("--json", f->json, "Print one JSON object");
  cmd->callback([f] {
    absl::Status st = RunGenerate(*f);
    if (!st.ok()) {
      std::cerr << "flotilla generate: " << st.message() << "\n";
      throw CLI::RuntimeError(st.code() == absl::StatusCode::kInvalidArgument ? 2 : 1);
    }
  });
}

}  // namespace flotilla::cli
