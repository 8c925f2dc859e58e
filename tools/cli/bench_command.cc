#include "tools/cli/bench_command.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <nlohmann/json.hpp>
#include <random>
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
#include "tools/cli/soak_command.h"
#include "tools/cli/tls_flags.h"
#include "tools/sdk/client.h"

namespace flotilla::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct ServeFlags {
  TlsClientFiles tls;
  std::string coordinator = "127.0.0.1:50051";
  int concurrency = 16;
  double rate = 0;  // requests/s; 0 = closed loop at `concurrency`
  double duration_s = 30;
  std::vector<int> prompt_len = {16, 128};
  std::vector<int> output_len = {16, 128};
  uint64_t seed = 1;
  double timeout_s = 120;
  bool ignore_eos = false;  // outputs run to their length (set by --output-tokens)
  std::string engine_compare = "auto";  // on, off, or auto (on when the admin RPC answers)
  int engine_steps = 32;
  int multi_turn = 0;       // turns per conversation; 0 = independent random prompts
  int turn_tokens = 64;     // new tokens each later turn adds
  std::string metrics_url;  // the coordinator's Prometheus /metrics; empty = not read
  std::string api_key;      // sent on every call (the SDK's, the admin's, /metrics)
  bool chat = false;         // requests go through Chat (Harmony rendered and parsed)
  std::string schema_file;   // --response-format-schema: Chat answers in this JSON Schema
  std::string schema_json;   // its text, read once
};

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
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * (v.size() - 1) + 0.5));
  return v[i];
}

// A Chat request of about `words` prompt tokens (random words of one token
// each, mostly) asking for `max_tokens`, in the schema's JSON if one is set.
v1::ChatRequest ChatRequestOf(const ServeFlags& f, std::mt19937_64& rng, int words,
                              int max_tokens) {
  static const char* const kWords[] = {"river", "stone", "cloud", "green", "north",  "table",
                                       "light", "seven", "apple", "quiet", "train",  "paper",
                                       "storm", "house", "music", "field", "glass",  "bread"};
  std::uniform_int_distribution<size_t> pick(0, std::size(kWords) - 1);
  std::string text;
  for (int i = 0; i < words; ++i) absl::StrAppend(&text, i ? " " : "", kWords[pick(rng)]);
  v1::ChatRequest req;
  v1::ChatMessage* m = req.add_messages();
  m->set_role(v1::ChatMessage::USER);
  m->set_content(text);
  req.set_return_token_ids(true);
  req.mutable_sampling()->set_temperature(1.0f);
  req.mutable_sampling()->set_seed(rng());
  req.mutable_sampling()->set_max_tokens(max_tokens);
  if (!f.schema_json.empty()) {
    req.mutable_response_format()->set_type(v1::ResponseFormat::JSON_SCHEMA);
    req.mutable_response_format()->mutable_json_schema()->set_name("bench");
    req.mutable_response_format()->mutable_json_schema()->set_schema_json(f.schema_json);
  }
  return req;
}

// One request: a random prompt, or the next turn of `conversation`.
void OneRequest(client::Client& c, std::mt19937_64& rng, const ServeFlags& f, int vocab,
                Stats& stats, MultiTurnConversation* conversation = nullptr) {
  std::uniform_int_distribution<int> plen(f.prompt_len[0], f.prompt_len[1]);
  std::uniform_int_distribution<int> olen(f.output_len[0], f.output_len[1]);
  std::uniform_int_distribution<int> tok(0, vocab - 1);
  v1::GenerateRequest req;
  if (conversation != nullptr) {
    const std::vector<int32_t>& prompt = conversation->Next(rng);
    req.mutable_prompt_ids()->mutable_ids()->Add(prompt.begin(), prompt.end());
  } else {
    const int n = plen(rng);
    for (int i = 0; i < n; ++i) req.mutable_prompt_ids()->add_ids(tok(rng));
  }
  const int64_t prompt_tokens = req.prompt_ids().ids_size();
  std::vector<int32_t> output;  // kept for the conversation's next turn
  req.mutable_sampling()->set_temperature(1.0f);
  req.mutable_sampling()->set_seed(rng());
  req.mutable_sampling()->set_max_tokens(olen(rng));
  req.mutable_sampling()->set_ignore_eos(f.ignore_eos);
  const auto start = Clock::now();
  auto last = start;
  bool first = true;
  int64_t tokens = 0;
  std::vector<double> itl;
  double ttft = 0;
  auto on_tokens = [&](const google::protobuf::RepeatedField<int32_t>& ids) {
    if (ids.empty()) return;
    const auto now = Clock::now();
    if (first) {
      ttft = std::chrono::duration<double, std::milli>(now - start).count();
      first = false;
    } else {
      const double gap = std::chrono::duration<double, std::milli>(now - last).count();
      for (int i = 0; i < ids.size(); ++i) itl.push_back(gap / ids.size());
    }
    last = now;
    tokens += ids.size();
    if (conversation != nullptr) output.insert(output.end(), ids.begin(), ids.end());
  };
  absl::Status st =
      f.chat ? c.ChatStream(ChatRequestOf(f, rng, static_cast<int>(prompt_tokens),
                                          static_cast<int>(req.sampling().max_tokens())),
                            [&](const v1::ChatResponse& r) { on_tokens(r.token_ids()); })
             : c.GenerateStream(req, [&](const v1::GenerateResponse& r) { on_tokens(r.token_ids()); });
  if (conversation != nullptr) conversation->Done(output, st.ok());
  std::lock_guard<std::mutex> lock(stats.mu);
  stats.tokens += tokens;
  stats.prompts += first ? 0 : 1;
  stats.prompt_tokens += prompt_tokens;
  if (!first) stats.prompt_tokens_prefilled += prompt_tokens;
  if (conversation != nullptr) {
    TurnStats& t = stats.turns[conversation->turn() - 1];
    ++t.requests;
    t.prompt_tokens += prompt_tokens;
    t.shared_tokens += conversation->shared_tokens();
    t.output_tokens += tokens;
    if (st.ok()) {
      ++t.ok;
      if (!first) t.ttft_ms.push_back(ttft);
    }
  }
  stats.busy_s += std::chrono::duration<double>(Clock::now() - start).count();
  if (st.ok()) {
    ++stats.ok;
    if (!first) stats.ttft_ms.push_back(ttft);
    stats.itl_ms.insert(stats.itl_ms.end(), itl.begin(), itl.end());
  } else {
    ++stats.failed;
    ++stats.errors[std::string(absl::StatusCodeToString(st.code()))];
  }
}

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
  load.prompt_tokens = f.multi_turn > 0 && stats.ok + stats.failed > 0
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
};

absl::StatusOr<PrefixCounters> ReadPrefixCounters(const std::string& url,
                                                  const std::string& api_key) {
  absl::StatusOr<std::string> text = HttpGetMetrics(url, api_key);
  if (!text.ok()) return text.status();
  std::optional<double> q = PrometheusValue(*text, "flotilla_prefix_cache_queries_tokens_total");
  std::optional<double> h = PrometheusValue(*text, "flotilla_prefix_cache_hits_tokens_total");
  if (!q || !h) {
    return absl::NotFoundError(absl::StrCat(url, " has no flotilla_prefix_cache_*_tokens_total"));
  }
  return PrefixCounters{*q, *h};
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
  // false: the counters did not catch up with the prompts within 5 s.
  j["complete"] = complete;
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

int RunServe(const ServeFlags& f) {
  client::ClientOptions co;
  co.address = f.coordinator;
  co.api_key = f.api_key;
  co.tls = f.tls;
  co.deadline = absl::Seconds(f.timeout_s);
  auto c = client::Client::Create(co);
  if (!c.ok()) {
    std::cerr << "flotilla bench serve: " << c.status().message() << "\n";
    return 2;
  }
  auto models = (*c)->ListModels();
  if (!models.ok() || models->models().empty()) {
    std::cerr << "flotilla bench serve: cannot list models at " << f.coordinator << ": "
              << models.status().message() << "\n";
    return 1;
  }
  const int vocab = static_cast<int>(models->models(0).vocab_size());
  Stats stats;
  stats.turns.resize(std::max(0, f.multi_turn));
  PrefixCounters prefix_before;
  if (!f.metrics_url.empty()) {
    absl::StatusOr<PrefixCounters> p = ReadPrefixCounters(f.metrics_url, f.api_key);
    if (!p.ok()) {
      std::cerr << "flotilla bench serve: " << p.status().message() << "\n";
      return 1;
    }
    prefix_before = *p;
  }
  const auto start = Clock::now();
  const auto end = start + std::chrono::milliseconds(static_cast<int64_t>(f.duration_s * 1000));
  std::vector<std::thread> threads;
  std::atomic<int64_t> launched{0};
  if (f.rate <= 0) {
    for (int w = 0; w < f.concurrency; ++w) {
      threads.emplace_back([&, w] {
        std::mt19937_64 rng(f.seed * 1000003 + w);
        std::optional<MultiTurnConversation> conversation;
        if (f.multi_turn > 0) {
          conversation.emplace(MultiTurnOptions{f.multi_turn, f.turn_tokens, f.prompt_len[0],
                                                f.prompt_len[1], vocab});
        }
        while (Clock::now() < end) {
          ++launched;
          OneRequest(**c, rng, f, vocab, stats, conversation ? &*conversation : nullptr);
        }
      });
    }
  } else {
    std::mt19937_64 rng(f.seed);
    std::exponential_distribution<double> gap(f.rate);
    auto next = start;
    while (next < end) {
      std::this_thread::sleep_until(next);
      const uint64_t s = rng();
      ++launched;
      threads.emplace_back([&, s] {
        std::mt19937_64 r(s);
        OneRequest(**c, r, f, vocab, stats);
      });
      next += std::chrono::microseconds(static_cast<int64_t>(gap(rng) * 1e6));
    }
  }
  for (auto& t : threads) t.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  nlohmann::json j;
  j["bench"] = "serve";
  j["coordinator"] = f.coordinator;
  j["mode"] = f.rate > 0 ? "rate" : "concurrency";
  j["api"] = f.chat ? "chat" : "generate";
  if (!f.schema_file.empty()) j["response_format_schema"] = f.schema_file;
  if (f.rate > 0) {
    j["rate_rps"] = f.rate;
  } else {
    j["concurrency"] = f.concurrency;
  }
  j["duration_s"] = elapsed;
  j["requests_sent"] = launched.load();
  j["requests_ok"] = stats.ok;
  j["requests_failed"] = stats.failed;
  j["errors"] = stats.errors;
  j["requests_unaccounted"] = launched.load() - stats.ok - stats.failed;
  j["output_tokens"] = stats.tokens;
  j["output_tokens_per_s"] = stats.tokens / elapsed;
  for (auto [name, v] : {std::pair{"ttft_ms", &stats.ttft_ms}, std::pair{"itl_ms", &stats.itl_ms}}) {
    j[name] = {{"p50", Percentile(*v, 50)}, {"p90", Percentile(*v, 90)},
               {"p99", Percentile(*v, 99)}, {"n", v->size()}};
  }
  j["mean_requests_in_flight"] = stats.busy_s / elapsed;
  j["prompt_tokens"] = stats.prompt_tokens;
  if (f.multi_turn > 0) j["multi_turn"] = MultiTurnJson(f, stats);
  if (!f.metrics_url.empty()) j["prefix_cache"] = PrefixCacheDelta(f, prefix_before, stats);
  // After the load, so the engine is idle and the served batch is known.
  const bool compared = AddEngineCompare(f, stats, elapsed, j);
  std::cout << j.dump() << std::endl;
  return compared ? 0 : 1;
}

}  // namespace

void AddBenchCommand(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks against a running cluster");
  bench->require_subcommand(1);
  AddSoakCommand(*bench);
  auto f = std::make_shared<ServeFlags>();
  CLI::App* serve = bench->add_subcommand(
      "serve", "Load generator: concurrent streams or a request rate; prints one JSON line");
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
  serve->add_option("--prompt-len", f->prompt_len, "MIN MAX prompt tokens (uniform)")
      ->expected(2)->check(CLI::Range(1, 1 << 20));
  serve->add_option("--output-len", f->output_len, "MIN MAX output tokens (uniform)")
      ->expected(2)->check(CLI::Range(1, 1 << 20));
  serve->add_option_function<int>(
      "--prompt-tokens", [f](int n) { f->prompt_len = {n, n}; },
      "every prompt exactly N tokens (--prompt-len N N)")
      ->check(CLI::Range(1, 1 << 20));
  serve->add_option_function<int>(
      "--output-tokens", [f](int n) { f->output_len = {n, n}; f->ignore_eos = true; },
      "every output exactly N tokens: --output-len N N with end tokens ignored")
      ->check(CLI::Range(1, 1 << 20));
  serve->add_flag("--ignore-eos", f->ignore_eos, "end tokens do not stop generation");
  serve->add_flag("--chat", f->chat,
                  "send Chat requests (a user message of about the prompt length in words; "
                  "Harmony rendered and parsed) instead of Generate with token ids");
  serve->add_option("--response-format-schema", f->schema_file,
                    "JSON Schema file: Chat requests whose answer must be JSON of it "
                    "(structured outputs; implies --chat)")
      ->check(CLI::ExistingFile);
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
  serve->add_option("--metrics-url", f->metrics_url,
                    "http://HOST:PORT/metrics of the coordinator: report the prefix-cache "
                    "counters' change over the load");
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
    if (f->chat && (f->ignore_eos || f->multi_turn > 0)) {
      std::cerr << "flotilla bench serve: --chat takes neither --ignore-eos (a chat reply "
                   "must end) nor --multi-turn\n";
      throw CLI::RuntimeError(2);
    }
    if (f->multi_turn > 0 && f->rate > 0) {
      std::cerr << "flotilla bench serve: --multi-turn runs closed-loop streams, not --rate\n";
      throw CLI::RuntimeError(2);
    }
    int rc = RunServe(*f);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace flotilla::cli
