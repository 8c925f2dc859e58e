#include "tools/cli/bench_command.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "proto/admin.grpc.pb.h"
#include "tools/cli/engine_compare.h"
#include "tools/cli/multi_turn_workload.h"
#include "tools/cli/serve_load.h"
#include "tools/cli/soak_command.h"
#include "tools/cli/tls_flags.h"
#include "tools/sdk/client.h"

namespace flotilla::cli {
namespace {

using Clock = std::chrono::steady_clock;

// The instance's DP groups, which share the served batch (1 when the
// placement cannot be read).
int DpGroups(admin::Admin::Stub& admin, const std::string& api_key) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  if (!api_key.empty()) ctx.AddMetadata("authorization", "Bearer " + api_key);
  admin::PlacementInfo placement;
  if (!admin.GetPlacement(&ctx, admin::GetPlacementRequest(), &placement).ok()) return 1;
  return std::max(1, static_cast<int>(placement.dp_size()));
}

// Asks the coordinator's admin API to time the engine for this load, at the
// batch of one DP group (setting load.dp_groups).
absl::StatusOr<cluster::EngineMeasurement> MeasureEngine(const ServeFlags& f, ServedLoad& load) {
  FLOTILLA_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                            MakeChannelCredentials(f.tls));
  auto admin = admin::Admin::NewStub(grpc::CreateChannel(f.coordinator, credentials));
  load.dp_groups = DpGroups(*admin, f.api_key);
  // Decode is timed at the mean context a served decode step sees.
  const int context = load.prompt_tokens + (f.output_len[0] + f.output_len[1]) / 4;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(600));
  if (!f.api_key.empty()) ctx.AddMetadata("authorization", "Bearer " + f.api_key);
  cluster::EngineMeasurement m;
  grpc::Status st = admin->MeasureEngine(&ctx, CompareRequest(load, context, f.engine_steps), &m);
  if (!st.ok()) return FromGrpcStatus(st);
  return m;
}

// Adds the engine's figures and the comparison to `j`; false when they were
// asked for (--engine-compare on) and could not be had.
bool AddEngineCompare(const ServeFlags& f, const Stats& stats, double elapsed, nlohmann::json& j) {
  if (f.engine_compare == "off") return true;
  ServedLoad load;
  load.batch = f.rate > 0 ? std::max(1, static_cast<int>(stats.busy_s / elapsed + 0.5))
                          : f.concurrency;
  // Multi-turn prompts grow turn by turn: the mean of those sent.
  load.prompt_tokens = (f.multi_turn > 0 || f.prefix_tenants) && stats.ok + stats.failed > 0
                           ? static_cast<int>(stats.prompt_tokens / (stats.ok + stats.failed))
                           : (f.prompt_len[0] + f.prompt_len[1]) / 2;
  load.output_tokens = stats.tokens;
  load.prompts = stats.prompts;
  load.elapsed_s = elapsed;
  load.itl_p50_ms = Percentile(stats.itl_ms, 50);
  load.ttft_p50_ms = Percentile(stats.ttft_ms, 50);
  absl::StatusOr<cluster::EngineMeasurement> m = MeasureEngine(f, load);
  if (!m.ok()) {
    j["engine_error"] = std::string(m.status().ToString());
    return f.engine_compare != "on";
  }
  j.update(EngineComparison(load, *m));
  return true;
}

struct PrefixCounters {
  double queried = 0, hits = 0;
  // The host-memory KV tier's (0 where the coordinator reports none).
  double host_hit_blocks = 0, host_bytes_to_host = 0, host_bytes_to_device = 0;
};

absl::StatusOr<PrefixCounters> ReadPrefixCounters(const std::string& url,
                                                  const std::string& api_key) {
  absl::StatusOr<std::vector<double>> v = ReadPrometheusValues(
      url, api_key,
      {"flotilla_prefix_cache_queries_tokens_total", "flotilla_prefix_cache_hits_tokens_total"},
      {"flotilla_kv_host_tier_hit_blocks_total", "flotilla_kv_host_tier_bytes_to_host_total",
       "flotilla_kv_host_tier_bytes_to_device_total"});
  if (!v.ok()) return v.status();
  return PrefixCounters{(*v)[0], (*v)[1], (*v)[2], (*v)[3], (*v)[4]};
}

// The prefix-cache counters' change over the load. Workers report them in
// heartbeats, so this waits (a few seconds at most) until the queried tokens
// cover every prompt that got a first token.
nlohmann::json PrefixCacheDelta(const ServeFlags& f, const PrefixCounters& before,
                                const Stats& stats) {
  nlohmann::json j;
  j["metrics_url"] = f.metrics_url;
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  absl::StatusOr<PrefixCounters> after;
  bool complete = false;
  while (true) {
    after = ReadPrefixCounters(f.metrics_url, f.api_key);
    complete = after.ok() &&
               after->queried - before.queried >= static_cast<double>(stats.prompt_tokens_prefilled);
    if (complete || !after.ok() || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!after.ok()) {
    j["error"] = std::string(after.status().ToString());
    return j;
  }
  const double queried = after->queried - before.queried;
  const double hits = after->hits - before.hits;
  j["queried_tokens"] = static_cast<int64_t>(queried);
  j["hit_tokens"] = static_cast<int64_t>(hits);
  j["prefill_tokens_computed"] = static_cast<int64_t>(queried - hits);
  j["hit_ratio"] = queried > 0 ? hits / queried : 0.0;
  j["prompt_tokens_sent"] = stats.prompt_tokens;
  // The host-memory KV tier (--kv-host-cache-gb): blocks copied back for
  // hits, bytes moved each way.
  j["host_tier_hit_blocks"] = static_cast<int64_t>(after->host_hit_blocks - before.host_hit_blocks);
  j["host_tier_bytes_to_host"] =
      static_cast<int64_t>(after->host_bytes_to_host - before.host_bytes_to_host);
  j["host_tier_bytes_to_device"] =
      static_cast<int64_t>(after->host_bytes_to_device - before.host_bytes_to_device);
  // false: the counters did not catch up with the prompts within 5 s.
  j["complete"] = complete;
  return j;
}

struct SpeculativeCounters {
  double drafted = 0, accepted = 0, steps = 0;
};

absl::StatusOr<SpeculativeCounters> ReadSpeculativeCounters(const std::string& url,
                                                            const std::string& api_key) {
  absl::StatusOr<std::vector<double>> v =
      ReadPrometheusValues(url, api_key,
                           {"flotilla_spec_decode_num_draft_tokens_total",
                            "flotilla_spec_decode_num_accepted_tokens_total",
                            "flotilla_spec_decode_num_verify_steps_total"});
  if (!v.ok()) return v.status();
  return SpeculativeCounters{(*v)[0], (*v)[1], (*v)[2]};
}

// Speculative decoding over the load, from the counters' change: drafted and
// accepted tokens, verification steps and the acceptance length (tokens a
// verification step gives: 1 + accepted / steps). Workers report in
// heartbeats, so this reads until the counters stop moving (5 s at most).
nlohmann::json SpeculativeDelta(const ServeFlags& f, const SpeculativeCounters& before) {
  nlohmann::json j;
  absl::StatusOr<SpeculativeCounters> after = ReadSpeculativeCounters(f.metrics_url, f.api_key);
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  int unchanged = 0;
  while (after.ok() && unchanged < 5 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    absl::StatusOr<SpeculativeCounters> next = ReadSpeculativeCounters(f.metrics_url, f.api_key);
    if (!next.ok()) break;
    unchanged = next->steps == after->steps ? unchanged + 1 : 0;
    after = next;
  }
  if (!after.ok()) {
    j["error"] = std::string(after.status().ToString());
    return j;
  }
  const double steps = after->steps - before.steps, accepted = after->accepted - before.accepted;
  j["drafted_tokens"] = static_cast<int64_t>(after->drafted - before.drafted);
  j["accepted_tokens"] = static_cast<int64_t>(accepted);
  j["verify_steps"] = static_cast<int64_t>(steps);
  j["acceptance_length"] = steps > 0 ? 1.0 + accepted / steps : 1.0;
  return j;
}

nlohmann::json MultiTurnJson(const ServeFlags& f, const Stats& stats) {
  nlohmann::json j;
  j["turns"] = f.multi_turn;
  j["turn_tokens"] = f.turn_tokens;
  int64_t shared = 0;
  nlohmann::json per_turn = nlohmann::json::array();
  for (size_t i = 0; i < stats.turns.size(); ++i) {
    const TurnStats& t = stats.turns[i];
    shared += t.shared_tokens;
    const double n = static_cast<double>(std::max<int64_t>(1, t.requests));
    per_turn.push_back({{"turn", i + 1},
                        {"requests", t.requests},
                        {"requests_ok", t.ok},
                        {"mean_prompt_tokens", t.prompt_tokens / n},
                        {"mean_shared_tokens", t.shared_tokens / n},
                        {"mean_output_tokens", t.output_tokens / n},
                        {"ttft_ms_p50", Percentile(t.ttft_ms, 50)},
                        {"ttft_ms_p90", Percentile(t.ttft_ms, 90)},
                        {"ttft_n", t.ttft_ms.size()}});
  }
  j["per_turn"] = per_turn;
  j["shared_prompt_tokens"] = shared;
  return j;
}

// --workload prefix-tenants: its shape, the figures per turn, and the share
// of prompt tokens earlier requests had sent (what a perfect cache would not
// compute, the bound of the measured hit ratio).
nlohmann::json PrefixTenantsJson(const ServeFlags& f, const Stats& stats) {
  const PrefixTenantsOptions& o = f.tenants;
  nlohmann::json j = MultiTurnJson(f, stats);
  j["turns"] = o.max_turns;
  j.erase("turn_tokens");
  j["tenants"] = o.tenants;
  j["system_tokens"] = o.system_tokens;
  j["user_tokens"] = {o.user_min, o.user_max};
  j["follow_up"] = o.follow_up;
  const int64_t shared = j["shared_prompt_tokens"].get<int64_t>();
  j["shared_ratio"] = stats.prompt_tokens > 0 ? static_cast<double>(shared) / stats.prompt_tokens
                                              : 0.0;
  return j;
}

// The client of --coordinator and the model's vocabulary size.
struct Target {
  std::unique_ptr<client::Client> client;
  int vocab = 0;
};

absl::StatusOr<Target> Connect(const ServeFlags& f) {
  client::ClientOptions co;
  co.address = f.coordinator;
  co.api_key = f.api_key;
  co.tls = f.tls;
  co.deadline = absl::Seconds(f.timeout_s);
  Target t;
  FLOTILLA_ASSIGN_OR_RETURN(t.client, client::Client::Create(co));
  auto models = t.client->ListModels();
  if (!models.ok() || models->models().empty()) {
    return absl::UnavailableError(absl::StrCat("cannot list models at ", f.coordinator, ": ",
                                               models.status().message()));
  }
  t.vocab = static_cast<int>(models->models(0).vocab_size());
  return t;
}

int RunServe(const ServeFlags& f) {
  absl::StatusOr<Target> target = Connect(f);
  if (!target.ok()) {
    std::cerr << "flotilla bench serve: " << target.status().message() << "\n";
    return 1;
  }
  Stats stats;
  stats.turns.resize(f.prefix_tenants ? f.tenants.max_turns : std::max(0, f.multi_turn));
  if (f.warmup_s > 0) {
    // The same requests first (the closed loop's streams and the arrivals
    // repeat with the seed): a replay drafter records their outputs.
    ServeFlags warm = f;
    warm.duration_s = f.warmup_s;
    Stats warm_stats;
    warm_stats.turns.resize(stats.turns.size());
    nlohmann::json w =
        LoadJson(warm, warm_stats, RunLoad(*target->client, warm, target->vocab, warm_stats));
    w["mode"] = "warmup";
    std::cout << w.dump() << std::endl;
  }
  PrefixCounters prefix_before;
  SpeculativeCounters spec_before;
  if (!f.metrics_url.empty()) {
    absl::StatusOr<PrefixCounters> p = ReadPrefixCounters(f.metrics_url, f.api_key);
    absl::StatusOr<SpeculativeCounters> sp = ReadSpeculativeCounters(f.metrics_url, f.api_key);
    if (!p.ok() || !sp.ok()) {
      std::cerr << "flotilla bench serve: " << (p.ok() ? sp.status() : p.status()).message()
                << "\n";
      return 1;
    }
    prefix_before = *p;
    spec_before = *sp;
  }
  const LoadRun run = RunLoad(*target->client, f, target->vocab, stats);
  nlohmann::json j = LoadJson(f, stats, run);
  if (!f.speculative_method.empty()) j["speculative_method"] = f.speculative_method;
  if (f.replay_error_rate >= 0) j["replay_error_rate"] = f.replay_error_rate;
  if (!f.metrics_url.empty()) j["speculative"] = SpeculativeDelta(f, spec_before);
  if (f.multi_turn > 0) j["multi_turn"] = MultiTurnJson(f, stats);
  if (f.prefix_tenants) j["prefix_tenants"] = PrefixTenantsJson(f, stats);
  if (!f.metrics_url.empty()) j["prefix_cache"] = PrefixCacheDelta(f, prefix_before, stats);
  // After the load, so the engine is idle and the served batch is known.
  const bool compared = AddEngineCompare(f, stats, run.elapsed_s, j);
  std::cout << j.dump() << std::endl;
  return compared ? 0 : 1;
}

// --rate-fraction: the capacity first, closed loop at --concurrency (which
// must saturate the server): output tokens per second while the load ran
// (not the tail of requests it then waits for), and requests per second =
// that over the mean output tokens of an answered request; then open-loop
// Poisson arrivals at each fraction of those requests per second, with the
// same length mix and seed. One JSON line per run; the engine is timed
// once, after the last.
int RunRateSweep(const ServeFlags& flags) {
  absl::StatusOr<Target> target = Connect(flags);
  if (!target.ok()) {
    std::cerr << "flotilla bench serve: " << target.status().message() << "\n";
    return 1;
  }
  ServeFlags f = flags;
  f.rate = 0;
  Stats saturated;
  const LoadRun capacity_run = RunLoad(*target->client, f, target->vocab, saturated);
  const double capacity_tps = saturated.tokens_before_end / f.duration_s;
  const double mean_output =
      saturated.ok > 0 ? static_cast<double>(saturated.tokens) / saturated.ok : 0;
  const double capacity_rps = mean_output > 0 ? capacity_tps / mean_output : 0;
  nlohmann::json capacity = LoadJson(f, saturated, capacity_run);
  capacity["mode"] = "capacity";
  capacity["capacity_rps"] = capacity_rps;
  capacity["capacity_output_tokens_per_s"] = capacity_tps;
  std::cout << capacity.dump() << std::endl;
  if (capacity_rps <= 0 || saturated.failed > 0) {
    std::cerr << "flotilla bench serve: the capacity run had " << saturated.ok << " answers and "
              << saturated.failed << " failures; no rate to run at\n";
    return 1;
  }
  bool ok = true;
  for (size_t i = 0; i < flags.rate_fractions.size(); ++i) {
    f.rate = flags.rate_fractions[i] * capacity_rps;
    Stats stats;
    const LoadRun run = RunLoad(*target->client, f, target->vocab, stats);
    nlohmann::json j = LoadJson(f, stats, run);
    j["rate_fraction"] = flags.rate_fractions[i];
    j["capacity_rps"] = capacity_rps;
    j["capacity_output_tokens_per_s"] = capacity_tps;
    // The load actually carried: output tokens/s while arrivals ran over the capacity's.
    j["carried_fraction"] = stats.tokens_before_end / f.duration_s / capacity_tps;
    if (i + 1 == flags.rate_fractions.size()) ok = AddEngineCompare(f, stats, run.elapsed_s, j);
    std::cout << j.dump() << std::endl;
    ok = ok && stats.failed == 0;
  }
  return ok ? 0 : 1;
}

// --prompt-tokens / --output-tokens: a bad value stops the command naming it.
std::vector<int> TokenRangeOrExit(const std::string& text) {
  absl::StatusOr<std::pair<int, int>> range = ParseTokenRange(text);
  if (!range.ok()) throw CLI::ValidationError("token count", std::string(range.status().message()));
  return {range->first, range->second};
}

}  // namespace

void AddBenchCommand(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks against a running cluster");
  bench->require_subcommand(1);
  AddSoakCommand(*bench);
  auto f = std::make_shared<ServeFlags>();
  CLI::App* serve = bench->add_subcommand(
      "serve",
      "Load generator: concurrent streams, a request rate, or rates as fractions of the "
      "measured capacity; prints JSON lines");
  serve->add_option("--coordinator", f->coordinator, "HOST:PORT")->capture_default_str();
  serve
      ->add_option("--api-key", f->api_key,
                   "API key sent as \"Authorization: Bearer KEY\"; --engine-compare needs an "
                   "admin key")
      ->envname("FLOTILLA_API_KEY");
  AddClientTlsFlags(serve, &f->tls);
  serve->add_option("--concurrency", f->concurrency, "closed-loop streams")
      ->check(CLI::Range(1, 4096))->capture_default_str();
  serve->add_option("--rate", f->rate, "open-loop Poisson arrivals per second (overrides concurrency)")
      ->check(CLI::NonNegativeNumber);
  serve->add_option("--duration", f->duration_s, "seconds of load")
      ->check(CLI::PositiveNumber)->capture_default_str();
  serve->add_option("--rate-fraction", f->rate_fractions,
                    "F1,F2,...: measure the capacity (closed loop at --concurrency, which must "
                    "saturate the server), then run Poisson arrivals at each fraction of it; a "
                    "JSON line per run")
      ->delimiter(',')->check(CLI::Range(0.001, 10.0));
  serve->add_option("--prompt-len", f->prompt_len, "MIN MAX prompt tokens (uniform)")
      ->expected(2)->check(CLI::Range(1, 1 << 20));
  serve->add_option("--output-len", f->output_len, "MIN MAX output tokens (uniform)")
      ->expected(2)->check(CLI::Range(1, 1 << 20));
  serve->add_option_function<std::string>(
      "--prompt-tokens", [f](const std::string& v) { f->prompt_len = TokenRangeOrExit(v); },
      "N: every prompt N tokens; MIN-MAX: uniform in [MIN, MAX] (--prompt-len MIN MAX)");
  serve->add_option_function<std::string>(
      "--output-tokens",
      [f](const std::string& v) {
        f->output_len = TokenRangeOrExit(v);
        f->ignore_eos = true;
        f->output_tokens = true;
      },
      "N or MIN-MAX output tokens, each request running to its drawn length (end tokens "
      "ignored)");
  serve->add_flag("--ignore-eos", f->ignore_eos, "end tokens do not stop generation");
  serve->add_flag("--chat", f->chat,
                  "send Chat requests (a user message of about the prompt length in words; "
                  "Harmony rendered and parsed) instead of Generate with token ids");
  serve->add_option("--response-format-schema", f->schema_file,
                    "JSON Schema file: Chat requests whose answer must be JSON of it "
                    "(structured outputs; implies --chat)")
      ->check(CLI::ExistingFile);
  serve
      ->add_option("--tools", f->tools_file,
                   "JSON file of an OpenAI \"tools\" array: functions every Chat request "
                   "offers (implies --chat)")
      ->check(CLI::ExistingFile);
  serve
      ->add_option("--tool-choice", f->tool_choice,
                   "with --tools: auto (the model decides), required (every answer is a call, "
                   "its arguments constrained to the schema) or none")
      ->check(CLI::IsMember({"auto", "required", "none"}))
      ->capture_default_str();
  serve->add_option("--engine-compare", f->engine_compare,
                    "after the load, time the engine on the serving worker (admin MeasureEngine) "
                    "and print served/engine ratios: on, off, or auto (on when it answers)")
      ->check(CLI::IsMember({"on", "off", "auto"}))->capture_default_str();
  serve->add_option("--engine-steps", f->engine_steps, "timed engine decode steps per batch size")
      ->check(CLI::Range(1, 4096))->capture_default_str();
  serve->add_option("--multi-turn", f->multi_turn,
                    "N turns per conversation: each stream's turn k+1 sends turn k's prompt and "
                    "output plus --turn-tokens new ids; prints per-turn figures (closed loop only)")
      ->check(CLI::Range(1, 1 << 16));
  serve->add_option("--turn-tokens", f->turn_tokens, "new token ids each later turn adds")
      ->check(CLI::Range(0, 1 << 20))->capture_default_str();
  serve
      ->add_option_function<std::string>(
          "--workload", [f](const std::string& w) { f->prefix_tenants = w == "prefix-tenants"; },
          "random: independent prompts (or --multi-turn); prefix-tenants: --tenants system "
          "prompts of --system-tokens each, shared by short user turns and by conversations "
          "that resend their whole history (closed loop only; use --metrics-url for the hit "
          "ratio)")
      ->check(CLI::IsMember({"random", "prefix-tenants"}));
  serve->add_option("--tenants", f->tenants.tenants, "prefix-tenants: distinct system prompts")
      ->check(CLI::Range(1, 1 << 16))->capture_default_str();
  serve->add_option("--system-tokens", f->tenants.system_tokens,
                    "prefix-tenants: tokens of each system prompt")
      ->check(CLI::Range(1, 1 << 20))->capture_default_str();
  serve->add_option_function<std::string>(
      "--user-tokens",
      [f](const std::string& text) {
        absl::StatusOr<std::pair<int, int>> range = ParseTokenRange(text);
        if (!range.ok()) throw CLI::ValidationError("--user-tokens", std::string(range.status().message()));
        f->tenants.user_min = range->first;
        f->tenants.user_max = range->second;
      },
      "prefix-tenants: tokens of each user turn, N or MIN-MAX (default 16-64)");
  serve->add_option("--tenant-turns", f->tenants.max_turns,
                    "prefix-tenants: turns of one conversation at most")
      ->check(CLI::Range(1, 1 << 16))->capture_default_str();
  serve->add_option("--follow-up", f->tenants.follow_up,
                    "prefix-tenants: chance that a stream's next request continues its "
                    "conversation (else a new one of a random tenant)")
      ->check(CLI::Range(0.0, 1.0))->capture_default_str();
  serve->add_option("--metrics-url", f->metrics_url,
                    "http://HOST:PORT/metrics of the coordinator: report the prefix-cache "
                    "counters' change over the load");
  serve
      ->add_option("--speculative-method", f->speculative_method,
                   "speculative decoding every request asks for (ngram, suffix, replay, off; "
                   "default: the server's); with --metrics-url the acceptance length is "
                   "printed beside tokens/s")
      ->check(CLI::IsMember({"ngram", "suffix", "replay", "off"}));
  serve
      ->add_option("--replay-error-rate", f->replay_error_rate,
                   "replay drafter: probability that each drafted token is wrong, asked in "
                   "every request (with 3 drafted tokens 0.19, 0.31, 0.46, 0.66 give "
                   "acceptance lengths of about 3, 2.5, 2, 1.5; with 2: 0, 0.18, 0.38, 0.63)")
      ->check(CLI::Range(0.0, 1.0));
  serve
      ->add_option("--temperature", f->temperature,
                   "every request's sampling temperature (0: greedy; replay wants outputs that "
                   "repeat from one run to the next, which a server of synthetic:PRESET-chain "
                   "gives at any temperature)")
      ->check(CLI::Range(0.0, 2.0))
      ->capture_default_str();
  serve
      ->add_option("--warmup", f->warmup_s,
                   "seconds of the same load before the measured one (its own JSON line, mode "
                   "warmup): the replay drafter's recordings; make it long enough to send "
                   "every request the measured run will (its duration times the speedup)")
      ->check(CLI::NonNegativeNumber);
  serve->add_option("--seed", f->seed, "random seed")->capture_default_str();
  serve->add_option("--timeout", f->timeout_s, "per-request deadline, seconds")
      ->check(CLI::PositiveNumber)->capture_default_str();
  serve->callback([f] {
    if (f->prompt_len[0] > f->prompt_len[1] || f->output_len[0] > f->output_len[1]) {
      std::cerr << "flotilla bench serve: --prompt-len/--output-len take MIN MAX with MIN <= MAX\n";
      throw CLI::RuntimeError(2);
    }
    if (!f->schema_file.empty()) {
      std::ifstream in(f->schema_file);
      f->schema_json.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      f->chat = true;
    }
    if (!f->tools_file.empty()) {
      absl::StatusOr<std::vector<v1::Tool>> tools = ReadBenchTools(f->tools_file);
      if (!tools.ok()) {
        std::cerr << "flotilla bench serve: --tools: " << tools.status().message() << "\n";
        throw CLI::RuntimeError(2);
      }
      f->tools = *std::move(tools);
      f->chat = true;
    }
    if (f->chat && (f->ignore_eos || f->multi_turn > 0)) {
      // --response-format-schema and --tools imply --chat; --output-tokens
      // implies --ignore-eos: name what the user typed.
      std::cerr << "flotilla bench serve: chat requests (--chat, --response-format-schema, "
                   "--tools) take neither "
                << (f->output_tokens ? "--output-tokens (it runs every answer to its drawn "
                                       "length, ignoring end tokens; bound chat answers with "
                                       "--output-len MIN MAX)"
                                     : "--ignore-eos (a chat reply must end)")
                << " nor --multi-turn\n";
      throw CLI::RuntimeError(2);
    }
    if (f->prefix_tenants && (f->chat || f->multi_turn > 0 || f->rate > 0 ||
                              !f->rate_fractions.empty())) {
      std::cerr << "flotilla bench serve: --workload prefix-tenants runs closed-loop streams of "
                   "token ids; it takes none of --chat, --multi-turn, --rate, --rate-fraction\n";
      throw CLI::RuntimeError(2);
    }
    if (f->multi_turn > 0 && f->rate > 0) {
      std::cerr << "flotilla bench serve: --multi-turn runs closed-loop streams, not --rate\n";
      throw CLI::RuntimeError(2);
    }
    if (!f->rate_fractions.empty() && (f->rate > 0 || f->multi_turn > 0)) {
      std::cerr << "flotilla bench serve: --rate-fraction sets the rates itself; it takes "
                   "neither --rate nor --multi-turn\n";
      throw CLI::RuntimeError(2);
    }
    int rc = f->rate_fractions.empty() ? RunServe(*f) : RunRateSweep(*f);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace flotilla::cli
