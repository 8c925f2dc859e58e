// flotilla-worker: one per device. Registers with the coordinator, loads the
// shards it is assigned, joins its peers and runs the step loop. Every flag
// also reads a FLOTILLA_* environment variable.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <iostream>
#include <map>
#include <optional>
#include <thread>

#include "common/cluster_token.h"
#include "common/command_line.h"
#include "common/config_file.h"
#include "common/logging.h"
#include "spdlog/spdlog.h"
#include "worker/worker_runtime.h"

namespace {
// Set by SIGINT/SIGTERM; a thread turns it into WorkerRuntime::Stop (which
// takes locks, so it cannot run inside the handler).
std::atomic<bool> g_signalled{false};
void OnSignal(int) { g_signalled = true; }
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"flotilla-worker: holds weight shards and runs the step loop"};
  flotilla::worker::WorkerOptions o;
  int comm_timeout_ms = 10000;
  app.add_option("--coordinator", o.coordinator, "coordinator address host:port")
      ->envname("FLOTILLA_COORDINATOR")->capture_default_str();
  app.add_option("--worker-id", o.worker_id, "stable id (default: host-pid)")
      ->envname("FLOTILLA_WORKER_ID");
  app.add_option("--node", o.node, "node name (default: host name)")->envname("FLOTILLA_NODE");
  app.add_option("--threads", o.threads, "CPU threads for the engine (0 = all cores)")
      ->envname("FLOTILLA_THREADS")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--kv-tokens", o.kv_tokens, "KV capacity in tokens over all sequences")
      ->envname("FLOTILLA_KV_TOKENS")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--device", o.device,
                 "engine device: cpu, or cuda (one GPU holds the whole model; one-worker instances)")
      ->envname("FLOTILLA_DEVICE")->capture_default_str()->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--cuda-device", o.cuda_device, "CUDA device ordinal for --device cuda")
      ->envname("FLOTILLA_CUDA_DEVICE")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--gpu-memory-utilization", o.gpu_memory_utilization,
                 "--device cuda: fraction of the GPU's memory for weights, workspaces and KV cache")
      ->envname("FLOTILLA_GPU_MEMORY_UTILIZATION")->capture_default_str()
      ->check(CLI::Range(0.05, 1.0));
  app.add_option("--kv-cache-dtype", o.kv_cache_dtype,
                 "full-attention layers' KV cache: bf16, fp8 (e4m3 with a scale per position and "
                 "head; sliding-window layers stay bf16) or auto (bf16); a coordinator's "
                 "--kv-cache-dtype other than auto wins")
      ->envname("FLOTILLA_KV_CACHE_DTYPE")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "bf16", "fp8"}));
  app.add_option("--step-profile-steps", o.step_profile_steps,
                 "every N working steps, log where their wall time went (plan, exchange with "
                 "the other ranks, engine step, bookkeeping: medians and 99th percentiles); 0 "
                 "= off")
      ->envname("FLOTILLA_STEP_PROFILE_STEPS")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--group-logits", o.group_logits,
                 "a tensor-parallel group's decode steps split lm_head by vocabulary over its "
                 "ranks (each a share, joined by an all-reduce) instead of the leader reading it "
                 "all; used while every rank has it on")
      ->envname("FLOTILLA_GROUP_LOGITS")
      ->capture_default_str();
  app.add_option("--tp-sum-in-projection", o.tp_sum_in_projection,
                 "CUDA, tensor parallel over CUDA IPC: steps of up to 8 tokens sum the O "
                 "projection over the TP group inside the projection's launch (its blocks send "
                 "their rows to the peers as they finish) instead of a separate all-reduce "
                 "launch; the same bits either way")
      ->envname("FLOTILLA_TP_SUM_IN_PROJECTION")
      ->capture_default_str();
  app.add_option("--moe-activation", o.moe_activation,
                 "the experts' inputs: bf16 (the engine's own precision), fp8 (MXFP8 blocks of 32 "
                 "values, the numerics of a W4A8 MoE; CPU engine only) or auto (bf16); a "
                 "coordinator's --moe-activation other than auto wins")
      ->envname("FLOTILLA_MOE_ACTIVATION")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "bf16", "fp8"}));
  app.add_option("--moe-gemm-min-pairs", o.moe_gemm_min_pairs,
                 "CUDA tuning: the MoE runs grouped GEMMs instead of its decode kernels from "
                 "this many routed (token, expert) pairs per expert on average (0: always; "
                 "negative: never; unset: the kernels' default, kernels/cuda/moe.h)")
      ->envname("FLOTILLA_MOE_GEMM_MIN_PAIRS");
  app.add_flag("--deterministic", o.deterministic,
               "the same step on the same state gives the same bits (the CUDA engine sums each "
               "token's expert outputs in a fixed order and keeps projections from splitting "
               "their input over blocks that meet in float atomics; the CPU engine ignores it)")
      ->envname("FLOTILLA_DETERMINISTIC");
  app.add_option("--kv-host-cache-gb", o.kv_host_cache_gb,
                 "GiB of host memory keeping the prefix cache's KV blocks the engine evicts, "
                 "copied back on a later hit instead of computed again (0: off)")
      ->envname("FLOTILLA_KV_HOST_CACHE_GB")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 4096.0));
  app.add_flag("--prefix-cache,!--no-prefix-cache", o.prefix_cache,
               "share the KV blocks of identical prompt prefixes between requests (default on)")
      ->envname("FLOTILLA_PREFIX_CACHE");
  std::string speculative_method = "off";
  app.add_option("--speculative-method", speculative_method,
                 "speculative decoding for requests that do not choose: ngram (prompt lookup "
                 "over the request's prompt and output), suffix (suffix matching over the "
                 "request and recent outputs), eagle3 (the --speculative-model head), replay "
                 "(benchmarks only: needs "
                 "--allow-replay-drafter) or off; drafts are verified exactly by the CPU and "
                 "CUDA engines")
      ->envname("FLOTILLA_SPECULATIVE_METHOD")
      ->capture_default_str();
  app.add_option("--speculative-model", o.speculative_model,
                 "the EAGLE3 draft head for --speculative-method eagle3 and requests choosing "
                 "it: a directory in the published layout (config.json, safetensors) or "
                 "synthetic:eagle3[:SEED] (random weights shaped for the model, for tests); "
                 "the coordinator's wins")
      ->envname("FLOTILLA_SPECULATIVE_MODEL");
  app.add_option("--num-speculative-tokens", o.speculative.num_tokens,
                 "tokens drafted per decode step with --speculative-method")
      ->envname("FLOTILLA_NUM_SPECULATIVE_TOKENS")
      ->capture_default_str();
  app.add_option("--speculative-max-batch", o.speculative_max_batch,
                 "steps with more decoding sequences than this draft nothing (0 = no bound)")
      ->envname("FLOTILLA_SPECULATIVE_MAX_BATCH")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--speculative-governor", o.speculative_governor,
                 "on: below --speculative-max-batch, whether a step drafts is measured per "
                 "batch size (drafted and plain steps' times, tokens accepted); off: every "
                 "step drafts")
      ->envname("FLOTILLA_SPECULATIVE_GOVERNOR")
      ->transform(
          CLI::CheckedTransformer(std::map<std::string, bool>{{"on", true}, {"off", false}}))
      ->default_str("on");
  app.add_option("--grammar-drafts", o.grammar_drafts,
                 "on: a structured-output request whose grammar admits one continuation (JSON "
                 "punctuation, a required key, a header with one form left, the end token) "
                 "drafts its tokens for verification; off: never")
      ->envname("FLOTILLA_GRAMMAR_DRAFTS")
      ->transform(
          CLI::CheckedTransformer(std::map<std::string, bool>{{"on", true}, {"off", false}}))
      ->default_str("on");
  app.add_flag("--allow-replay-drafter", o.speculative.allow_replay,
               "benchmarks only: requests may choose the replay drafter, which proposes the "
               "recorded output of an earlier identical request (recorded while this is set)")
      ->envname("FLOTILLA_ALLOW_REPLAY_DRAFTER");
  app.add_option("--replay-error-rate", o.speculative.replay_error_rate,
                 "replay drafter: probability that each drafted token is replaced by a wrong "
                 "one (sets the acceptance length)")
      ->envname("FLOTILLA_REPLAY_ERROR_RATE")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  int reconnect_backoff_max_ms = 2000;
  app.add_option("--reconnect-backoff-max-ms", reconnect_backoff_max_ms,
                 "longest wait between attempts to reach the coordinator (the worker retries "
                 "until it is up, and again whenever it restarts; from 100 ms, doubling)")
      ->envname("FLOTILLA_RECONNECT_BACKOFF_MAX_MS")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--comm-timeout-ms", comm_timeout_ms, "how long a collective waits for a peer")
      ->envname("FLOTILLA_COMM_TIMEOUT_MS")->capture_default_str()->check(CLI::PositiveNumber);
  std::string cluster_token_file;
  app.add_option("--cluster-token-file", cluster_token_file,
                 "file holding the coordinator's cluster token (first line)")
      ->envname("FLOTILLA_CLUSTER_TOKEN_FILE");
  app.add_option("--advertise-address", o.advertise_address,
                 "address peers reach this worker at; its interface is the only one peer "
                 "listeners use (default: the local address toward the coordinator)")
      ->envname("FLOTILLA_ADVERTISE_ADDRESS");
  app.add_option("--tls-ca", o.tls.ca, "PEM CA of the coordinator's certificate: connect over TLS")
      ->envname("FLOTILLA_TLS_CA");
  app.add_option("--tls-cert", o.tls.cert,
                 "PEM client certificate for a coordinator with --tls-client-ca (with --tls-key)")
      ->envname("FLOTILLA_TLS_CERT");
  app.add_option("--tls-key", o.tls.key, "PEM private key of --tls-cert")
      ->envname("FLOTILLA_TLS_KEY");
  flotilla::LogOptions log_options;
  flotilla::AddLogFlags(app, &log_options);
  flotilla::AddVersionFlag(app, "flotilla-worker");
  flotilla::AddConfigFlag(app);
  if (std::optional<int> exit_code = flotilla::ParseCommandLine(app, argc, argv)) return *exit_code;
  if (absl::Status st = flotilla::ConfigureLogging(log_options); !st.ok()) {
    std::cerr << "flotilla-worker: " << st.message() << "\n";
    return 2;
  }
  if (absl::Status st = flotilla::worker::SetSpeculativeMethod(speculative_method, &o.speculative);
      !st.ok()) {
    std::cerr << "flotilla-worker: " << st.message() << "\n";
    return 2;
  }
  if (o.speculative.method == flotilla::worker::SpeculativeMethod::kEagle3 &&
      o.speculative_model.empty()) {
    std::cerr << "flotilla-worker: --speculative-method eagle3 needs --speculative-model DIR "
                 "(or synthetic:eagle3)\n";
    return 2;
  }
  o.comm_timeout = absl::Milliseconds(comm_timeout_ms);
  o.reconnect_backoff_max = absl::Milliseconds(reconnect_backoff_max_ms);
  o.reconnect_backoff = std::min(o.reconnect_backoff, o.reconnect_backoff_max);
  if (absl::Status tls = flotilla::CheckClientFiles(o.tls); !tls.ok()) {
    std::cerr << "flotilla-worker: " << tls.message() << "\n";
    return 2;
  }
  if (!cluster_token_file.empty()) {
    absl::StatusOr<std::string> token = flotilla::ReadClusterTokenFile(cluster_token_file);
    if (!token.ok()) {
      std::cerr << "flotilla-worker: --cluster-token-file: " << token.status().message() << "\n";
      return 2;
    }
    o.cluster_token = *std::move(token);
  }

  auto runtime = flotilla::worker::WorkerRuntime::Create(o);
  if (!runtime.ok()) {
    std::cerr << "flotilla-worker: " << runtime.status().message() << "\n";
    return 2;
  }
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  std::atomic<bool> done{false};
  std::thread stopper([&] {
    while (!done && !g_signalled) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (g_signalled) (*runtime)->Stop();
  });
  absl::Status st = (*runtime)->Run();
  done = true;
  stopper.join();
  if (!st.ok()) {
    spdlog::error("worker ended: {}", st.ToString());
    return 1;
  }
  return 0;
}
