// The load `flotilla bench serve` puts on a coordinator: closed-loop streams
// or open-loop Poisson arrivals of random prompts (or multi-turn
// conversations, the prefix-tenants workload, or Chat requests), and what each request saw (TTFT, the
// gaps between tokens, errors). bench_command.cc turns it into JSON lines.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/common.pb.h"
#include "tools/cli/prefix_tenants_workload.h"
#include "tools/cli/tls_flags.h"
#include "tools/sdk/client.h"

namespace flotilla::cli {

struct ServeFlags {
  TlsClientFiles tls;
  std::string coordinator = "127.0.0.1:50051";
  int concurrency = 16;
  double rate = 0;  // requests/s; 0 = closed loop at `concurrency`
  // --rate-fraction: measure the capacity closed loop at `concurrency`, then
  // run open loop at each fraction of it (one JSON line each).
  std::vector<double> rate_fractions;
  double duration_s = 30;
  std::vector<int> prompt_len = {16, 128};  // MIN MAX tokens (uniform)
  std::vector<int> output_len = {16, 128};
  uint64_t seed = 1;
  double timeout_s = 120;
  bool ignore_eos = false;  // outputs run to their length (set by --output-tokens)
  bool output_tokens = false;           // --output-tokens was given (it sets ignore_eos)
  std::string engine_compare = "auto";  // on, off, or auto (on when the admin RPC answers)
  int engine_steps = 32;
  int multi_turn = 0;       // turns per conversation; 0 = independent random prompts
  int turn_tokens = 64;     // new tokens each later turn adds
  // --workload prefix-tenants: tenants' long system prompts and conversations
  // on them (prefix_tenants_workload.h); false = the prompts above.
  bool prefix_tenants = false;
  PrefixTenantsOptions tenants;
  std::string metrics_url;  // the coordinator's Prometheus /metrics; empty = not read
  std::string api_key;      // sent on every call (the SDK's, the admin's, /metrics)
  bool chat = false;         // requests go through Chat (Harmony rendered and parsed)
  std::string schema_file;   // --response-format-schema: Chat answers in this JSON Schema
  std::string schema_json;   // its text, read once
  // --tools: functions every Chat request offers (an OpenAI "tools" array
  // of {"type": "function", "function": {name, description, parameters}}),
  // read once into `tools`; --tool-choice: auto, required or none.
  std::string tools_file;
  std::vector<v1::Tool> tools;
  std::string tool_choice = "auto";
  // Speculative decoding asked for in every request (SamplingParams.
  // speculative): a method ("" = the server's default) and, for the replay
  // drafter, its error rate (negative = the server's).
  float temperature = 1.0f;  // every request's (0: greedy); each gets a seed of its own
  std::string speculative_method;
  double replay_error_rate = -1;
  // Seconds of the same load run first, unreported but for one line (mode
  // "warmup"): a replay drafter's recordings. 0 = none.
  double warmup_s = 0;
};

// Sets `f`'s speculative-decoding choice on a request's sampling.
void SetSpeculative(const ServeFlags& f, common::SamplingParams* sampling);

// One turn index of the multi-turn workload.
struct TurnStats {
  int64_t requests = 0, ok = 0;
  int64_t prompt_tokens = 0, shared_tokens = 0, output_tokens = 0;
  std::vector<double> ttft_ms;
};

struct Stats {
  std::mutex mu;
  int64_t ok = 0, failed = 0, tokens = 0;
  int64_t prompts = 0;   // requests that got a first token
  double busy_s = 0;     // request durations summed: / elapsed = mean requests in flight
  std::map<std::string, int64_t> errors;
  std::vector<double> ttft_ms, itl_ms;
  int64_t prompt_tokens = 0;            // every prompt sent
  int64_t prompt_tokens_prefilled = 0;  // of the requests that got a first token
  std::vector<TurnStats> turns;         // --multi-turn: index turn - 1
  // Output tokens that arrived before the load's end (RunLoad sets it),
  // not those of the requests it waits for after: the steady rate.
  std::chrono::steady_clock::time_point load_end = std::chrono::steady_clock::time_point::max();
  int64_t tokens_before_end = 0;
};

// The p-th percentile (nearest rank) of `v`; 0 when empty.
double Percentile(std::vector<double> v, double p);

// "N" (every request N tokens) or "MIN-MAX" (uniform), as --prompt-tokens and
// --output-tokens take them; INVALID_ARGUMENT naming the text otherwise.
absl::StatusOr<std::pair<int, int>> ParseTokenRange(const std::string& text);

// The functions of an OpenAI "tools" JSON array in `path` ({"type":
// "function", "function": {"name", "description", "parameters"}} each);
// INVALID_ARGUMENT naming what is wrong.
absl::StatusOr<std::vector<v1::Tool>> ReadBenchTools(const std::string& path);

// What one run of the load did.
struct LoadRun {
  double elapsed_s = 0;      // from the first request to the last answer
  int64_t launched = 0;      // requests sent
};

// Runs the load of `f` (closed loop at f.concurrency when f.rate is 0, else
// Poisson arrivals at f.rate for f.duration_s; requests in flight at the end
// are waited for) into `stats`.
LoadRun RunLoad(client::Client& client, const ServeFlags& f, int vocab, Stats& stats);

// The figures of a run every bench serve line has: mode, requests, output
// tokens/s, TTFT and ITL percentiles, requests in flight.
nlohmann::json LoadJson(const ServeFlags& f, const Stats& stats, const LoadRun& run);

}  // namespace flotilla::cli
