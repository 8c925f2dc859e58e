// What a worker is started with (flags and FLOTILLA_* environment variables).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "common/tls_credentials.h"
#include "worker/speculation.h"

namespace flotilla::worker {

struct WorkerOptions {
  std::string coordinator = "127.0.0.1:50051";
  std::string worker_id;  // stable across restarts; default host-pid
  std::string node;       // default: the host name
  int threads = 0;        // CPU threads for the engine (0 = all cores)
  int64_t kv_tokens =
      65536;  // KV capacity (tokens over all sequences) when the coordinator leaves it to us
  int64_t kv_block_size = 16;
  // "cpu" (the reference engine) or "cuda" (one GPU holds the whole model:
  // an instance of one worker).
  std::string device = "cpu";
  int cuda_device = 0;
  // --device cuda: the fraction of the GPU's memory this worker may use in
  // all (weights, workspaces, KV cache); the KV arena gets what is left.
  double gpu_memory_utilization = 0.90;
  // Share the KV blocks of identical prompt prefixes between requests.
  bool prefix_cache = true;
  // Full-attention layers' KV storage: auto (= bf16), bf16 or fp8
  // (worker/engine/kv_cache_dtype.h); a coordinator's other than auto wins.
  std::string kv_cache_dtype = "auto";
  // --moe-activation: auto/bf16 or fp8, the experts' inputs through MXFP8
  // blocks (worker/engine/moe_activation.h; the CPU engine only); a
  // coordinator's other than auto wins.
  std::string moe_activation = "auto";
  // GiB of host memory keeping the cached KV blocks the engine's arena
  // evicts (the prefix cache's host tier, worker/engine/kv_host_tier.h);
  // 0 = off (the default).
  double kv_host_cache_gb = 0;
  // --step-profile-steps N: every N working steps, a log line with where the
  // steps' wall time went (worker/step_profile.h); 0 = off (the default).
  int64_t step_profile_steps = 0;
  // --group-logits on|off: a TP group's decode steps split lm_head by
  // vocabulary over its ranks (StepItem::group_logits); used only while
  // every rank of the instance has it on.
  bool group_logits = true;
  // --tp-sum-in-projection on|off: a CUDA TP group's small steps sum the O
  // projection over the group inside the projection's own launch
  // (CudaEngineOptions::tp_sum_in_projection_max_tokens); ranks may differ.
  bool tp_sum_in_projection = true;
  // --moe-gemm-min-pairs N: the CUDA MoE runs grouped GEMMs instead of its
  // decode kernels once a step routes N (token, expert) pairs per expert
  // (kernels::cuda::MoeTuning::gemm_min_pairs_per_expert); unset: the
  // kernels' default. A tuning knob for measurements.
  std::optional<int> moe_gemm_min_pairs;
  // --deterministic: the CUDA engine's numerics repeat bit for bit
  // (CudaEngineOptions::deterministic); the CPU engine ignores it.
  bool deterministic = false;
  // Speculative decoding for requests that do not choose
  // (--speculative-method, --num-speculative-tokens, --replay-error-rate,
  // --allow-replay-drafter); off by default.
  SpeculativeConfig speculative;
  // --speculative-max-batch: steps with more decoding sequences draft
  // nothing (SchedulerLimits::speculative_max_batch); a coordinator's
  // nonzero value wins.
  int64_t speculative_max_batch = kDefaultSpeculativeMaxBatch;
  // --speculative-governor on|off: below that bound, whether a step drafts
  // is measured per batch size (worker/speculation_governor.h); off: every
  // step drafts.
  bool speculative_governor = true;
  // --grammar-drafts on|off: structured-output requests draft the text
  // their grammar forces (SchedulerLimits::grammar_drafts).
  bool grammar_drafts = true;
  // --speculative-model: the EAGLE3 head's directory or synthetic:eagle3
  // (worker/draft_head.h); the coordinator's nonempty one wins.
  std::string speculative_model;
  absl::Duration comm_timeout = absl::Seconds(10);
  absl::Duration connect_timeout = absl::Seconds(30);
  // Between attempts to open a session: the first wait, doubled after each
  // failure up to the max (reset after a session that lasted a while).
  absl::Duration reconnect_backoff = absl::Milliseconds(100);
  absl::Duration reconnect_backoff_max = absl::Seconds(2);
  // Sent in the Session call's metadata; the coordinator may require it.
  std::string cluster_token;
  // The address peers reach this worker at; its interface is the only one
  // the peer (UCX) listeners use. Empty = the address toward the coordinator.
  std::string advertise_address;
  // TLS to the coordinator: tls.ca verifies it; tls.cert/tls.key are this
  // worker's client certificate (the coordinator's --tls-client-ca). Empty: plaintext.
  TlsClientFiles tls;
};

}  // namespace flotilla::worker
