#include "tools/cli/serve_load.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tools/cli/multi_turn_workload.h"

namespace flotilla::cli {
namespace {

using Clock = std::chrono::steady_clock;

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
  req.mutable_sampling()->set_temperature(f.temperature);
  req.mutable_sampling()->set_seed(rng());
  req.mutable_sampling()->set_max_tokens(max_tokens);
  SetSpeculative(f, req.mutable_sampling());
  for (const v1::Tool& t : f.tools) *req.add_tools() = t;
  if (f.tool_choice == "required") req.mutable_tool_choice()->set_mode(v1::ToolChoice::REQUIRED);
  if (f.tool_choice == "none") req.mutable_tool_choice()->set_mode(v1::ToolChoice::NONE);
  if (!f.schema_json.empty()) {
    req.mutable_response_format()->set_type(v1::ResponseFormat::JSON_SCHEMA);
    req.mutable_response_format()->mutable_json_schema()->set_name("bench");
    req.mutable_response_format()->mutable_json_schema()->set_schema_json(f.schema_json);
  }
  return req;
}

// One request: a random prompt, or the next one of `conversation`.
void OneRequest(client::Client& c, std::mt19937_64& rng, const ServeFlags& f, int vocab,
                Stats& stats, PromptStream* conversation = nullptr) {
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
  req.mutable_sampling()->set_temperature(f.temperature);
  req.mutable_sampling()->set_seed(rng());
  req.mutable_sampling()->set_max_tokens(olen(rng));
  req.mutable_sampling()->set_ignore_eos(f.ignore_eos);
  SetSpeculative(f, req.mutable_sampling());
  const auto start = Clock::now();
  auto last = start;
  bool first = true;
  int64_t tokens = 0, tokens_before_end = 0;
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
    if (now < stats.load_end) tokens_before_end += ids.size();
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
  stats.tokens_before_end += tokens_before_end;
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

}  // namespace

void SetSpeculative(const ServeFlags& f, common::SamplingParams* sampling) {
  if (!f.speculative_method.empty()) {
    sampling->mutable_speculative()->set_method(f.speculative_method);
  }
  if (f.replay_error_rate >= 0) {
    sampling->mutable_speculative()->set_replay_error_rate(f.replay_error_rate);
  }
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * (v.size() - 1) + 0.5));
  return v[i];
}


absl::StatusOr<std::pair<int, int>> ParseTokenRange(const std::string& text) {
  const std::vector<std::string> parts = absl::StrSplit(text, '-');
  int low = 0, high = 0;
  const bool parsed = (parts.size() == 1 && absl::SimpleAtoi(parts[0], &low) &&
                       absl::SimpleAtoi(parts[0], &high)) ||
                      (parts.size() == 2 && absl::SimpleAtoi(parts[0], &low) &&
                       absl::SimpleAtoi(parts[1], &high));
  if (!parsed || low < 1 || high > (1 << 20) || low > high) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", text,
                     "\" is not N or MIN-MAX tokens with 1 <= MIN <= MAX <= 1048576"));
  }
  return std::pair<int, int>{low, high};
}

LoadRun RunLoad(client::Client& client, const ServeFlags& f, int vocab, Stats& stats) {
  const auto start = Clock::now();
  const auto end = start + std::chrono::milliseconds(static_cast<int64_t>(f.duration_s * 1000));
  stats.load_end = end;
  std::vector<std::thread> threads;
  std::atomic<int64_t> launched{0};
  std::optional<PrefixTenants> tenants;  // read by the streams until they are joined
  if (f.prefix_tenants) {
    PrefixTenantsOptions o = f.tenants;
    o.vocab = vocab;
    o.seed = f.seed;
    tenants.emplace(o);
  }
  if (f.rate <= 0) {
    for (int w = 0; w < f.concurrency; ++w) {
      threads.emplace_back([&, w] {
        std::mt19937_64 rng(f.seed * 1000003 + w);
        std::unique_ptr<PromptStream> conversation;
        if (tenants) {
          conversation = std::make_unique<TenantConversation>(*tenants);
        } else if (f.multi_turn > 0) {
          conversation = std::make_unique<MultiTurnConversation>(MultiTurnOptions{
              f.multi_turn, f.turn_tokens, f.prompt_len[0], f.prompt_len[1], vocab});
        }
        while (Clock::now() < end) {
          ++launched;
          OneRequest(client, rng, f, vocab, stats, conversation.get());
        }
      });
    }
  } else {
    // Arrival gaps and each request's own seed come from one generator
    // seeded with --seed: the same flags send the same requests at the same
    // offsets.
    std::mt19937_64 rng(f.seed);
    std::exponential_distribution<double> gap(f.rate);
    auto next = start;
    while (next < end) {
      std::this_thread::sleep_until(next);
      const uint64_t s = rng();
      ++launched;
      threads.emplace_back([&, s] {
        std::mt19937_64 r(s);
        OneRequest(client, r, f, vocab, stats);
      });
      next += std::chrono::microseconds(static_cast<int64_t>(gap(rng) * 1e6));
    }
  }
  for (auto& t : threads) t.join();
  return LoadRun{std::chrono::duration<double>(Clock::now() - start).count(), launched.load()};
}

nlohmann::json LoadJson(const ServeFlags& f, const Stats& stats, const LoadRun& run) {
  nlohmann::json j;
  j["bench"] = "serve";
  j["coordinator"] = f.coordinator;
  j["mode"] = f.rate > 0 ? "rate" : "concurrency";
  j["api"] = f.chat ? "chat" : "generate";
  if (!f.schema_file.empty()) j["response_format_schema"] = f.schema_file;
  if (!f.tools_file.empty()) {
    j["tools"] = f.tools_file;
    j["tool_choice"] = f.tool_choice;
  }
  if (f.rate > 0) {
    j["rate_rps"] = f.rate;
  } else {
    j["concurrency"] = f.concurrency;
  }
  j["prompt_len"] = f.prompt_len;
  j["output_len"] = f.output_len;
  j["seed"] = f.seed;
  j["duration_s"] = run.elapsed_s;
  j["requests_sent"] = run.launched;
  j["requests_ok"] = stats.ok;
  j["requests_failed"] = stats.failed;
  j["errors"] = stats.errors;
  j["requests_unaccounted"] = run.launched - stats.ok - stats.failed;
  j["output_tokens"] = stats.tokens;
  j["output_tokens_per_s"] = stats.tokens / run.elapsed_s;
  for (auto [name, v] : {std::pair{"ttft_ms", &stats.ttft_ms}, std::pair{"itl_ms", &stats.itl_ms}}) {
    j[name] = {{"p50", Percentile(*v, 50)}, {"p90", Percentile(*v, 90)},
               {"p99", Percentile(*v, 99)}, {"n", v->size()}};
  }
  j["mean_requests_in_flight"] = stats.busy_s / run.elapsed_s;
  j["prompt_tokens"] = stats.prompt_tokens;
  return j;
}

absl::StatusOr<std::vector<v1::Tool>> ReadBenchTools(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_array() || j.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a non-empty JSON array of tools"));
  }
  std::vector<v1::Tool> tools;
  for (const nlohmann::json& t : j) {
    const bool function =
        t.is_object() && t.contains("function") && t.contains("type") && t["type"] == "function";
    const nlohmann::json* fn = function ? &t["function"] : nullptr;
    if (fn == nullptr || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": each tool must be {\"type\": \"function\", \"function\": {\"name\": ...}}"));
    }
    v1::Tool tool;
    tool.set_name((*fn)["name"].get<std::string>());
    if (fn->contains("description") && (*fn)["description"].is_string()) {
      tool.set_description((*fn)["description"].get<std::string>());
    }
    if (fn->contains("parameters")) tool.set_parameters_json((*fn)["parameters"].dump());
    tool.set_strict(fn->contains("strict") && (*fn)["strict"] == true);
    tools.push_back(std::move(tool));
  }
  return tools;
}

}  // namespace flotilla::cli
