#include "tools/cli/render_command.h"

#include <ctime>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/harmony/openai.h"
#include "common/harmony/renderer.h"
#include "common/json_parse.h"
#include "tools/cli/harmony_cli_util.h"

namespace flotilla::cli {
namespace {

struct RenderOptions {
  std::string conversation;
  std::string request;
  std::string jsonl;
  std::string date;
  std::string tokenizer;
  bool auto_drop_analysis = false;
  bool tokens = false;
};

std::string TodayUtc() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[16];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d", &tm);
  return buf;
}

absl::StatusOr<harmony::RenderedPrompt> Render(const RenderOptions& o) {
  if (!o.conversation.empty()) {
    auto body = ReadFile(o.conversation);
    if (!body.ok()) return body.status();
    if (auto st = tokenizer::CheckUtf8(*body, o.conversation); !st.ok()) return st;
    auto j = ParseJson<nlohmann::ordered_json>(*body, absl::StrCat("'", o.conversation, "'"));
    if (!j.ok()) return j.status();
    auto conv = harmony::ConversationFromJson(*j);
    if (!conv.ok()) return conv.status();
    harmony::RenderOptions ro;
    ro.auto_drop_analysis = o.auto_drop_analysis;
    return harmony::RenderForCompletion(*conv, ro);
  }
  auto body = ReadFile(o.request);
  if (!body.ok()) return body.status();
  harmony::OpenAiRequestOptions ro;
  ro.date = o.date.empty() ? TodayUtc() : o.date;
  auto mapped = harmony::MapChatRequestBody(*body, ro);
  if (!mapped.ok()) return mapped.status();
  return harmony::RenderForCompletion(mapped->conversation, harmony::RenderOptions{});
}

// One line of a --jsonl file: {"request": CHAT REQUEST, "date": "YYYY-MM-DD" or
// absent, "completion": Harmony text of the assistant's turn after the prompt}
// becomes {"prompt": [ids], "completion": [ids]} (the completion's special
// tokens, such as <|channel|> and <|return|>, as their ids).
absl::StatusOr<nlohmann::json> RenderCorpusLine(const std::string& line,
                                                const tokenizer::Tokenizer& tok) {
  auto j = ParseJson<nlohmann::ordered_json>(line, "the line");
  if (!j.ok()) return j.status();
  if (!j->is_object() || !j->contains("request") || !(*j)["request"].is_object() ||
      !j->contains("completion") || !(*j)["completion"].is_string()) {
    return absl::InvalidArgumentError("expected {\"request\": {...}, \"completion\": \"...\"}");
  }
  harmony::OpenAiRequestOptions ro;
  if (j->contains("date") && !(*j)["date"].is_null()) {
    if (!(*j)["date"].is_string()) return absl::InvalidArgumentError("'date' must be a string");
    ro.date = (*j)["date"].get<std::string>();
  }
  auto mapped = harmony::MapChatRequest((*j)["request"], ro);
  if (!mapped.ok()) return mapped.status();
  auto completion =
      tok.Encode((*j)["completion"].get<std::string>(), tokenizer::SpecialTokenPolicy::All());
  if (!completion.ok()) return completion.status();
  auto prompt = harmony::RenderForCompletion(mapped->conversation, harmony::RenderOptions{});
  if (!prompt.ok()) return prompt.status();
  return nlohmann::json{{"prompt", prompt->Tokens(tok)}, {"completion", *completion}};
}

// --jsonl: renders a corpus of chat requests with their completions, one line
// each, for the demo model's trainer (tools/demo_model/).
void RunRenderCorpus(const RenderOptions& o) {
  std::ifstream in(o.jsonl);
  if (!in) FailCommand("render", absl::NotFoundError(absl::StrCat("cannot read '", o.jsonl, "'")));
  auto tok = LoadTokenizer(o.tokenizer);
  if (!tok.ok()) FailCommand("render", tok.status());
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    auto rendered = RenderCorpusLine(line, **tok);
    if (!rendered.ok()) {
      FailCommand("render", absl::Status(rendered.status().code(),
                                         absl::StrCat(o.jsonl, " line ", n, ": ",
                                                      rendered.status().message())));
    }
    std::cout << rendered->dump() << "\n";
  }
}

void RunRender(const RenderOptions& o) {
  if (!o.jsonl.empty()) {
    if (!o.conversation.empty() || !o.request.empty()) {
      FailCommand("render",
                  absl::InvalidArgumentError("--jsonl takes neither --conversation nor --request"));
    }
    return RunRenderCorpus(o);
  }
  if (o.conversation.empty() == o.request.empty()) {
    FailCommand("render", absl::InvalidArgumentError("give exactly one of --conversation FILE or --request FILE"));
  }
  if (!o.date.empty() && o.request.empty()) {
    FailCommand("render", absl::InvalidArgumentError("--date applies to --request only (a conversation's system message carries its date)"));
  }
  auto rendered = Render(o);
  if (!rendered.ok()) FailCommand("render", rendered.status());
  if (!o.tokens) {
    std::cout << rendered->Text();  // exactly the prompt: no trailing newline
    return;
  }
  auto tok = LoadTokenizer(o.tokenizer);
  if (!tok.ok()) FailCommand("render", tok.status());
  std::cout << nlohmann::json(rendered->Tokens(**tok)).dump() << "\n";
}

}  // namespace

void AddRenderCommand(CLI::App& app) {
  auto opts = std::make_shared<RenderOptions>();
  CLI::App* cmd = app.add_subcommand(
      "render", "Print the Harmony prompt for a conversation or an OpenAI chat request, ending with <|start|>assistant");
  cmd->add_option("--conversation", opts->conversation,
                  "JSON file {\"conversation\": [...]} of Harmony messages (the reference cases' schema)");
  cmd->add_option("--request", opts->request, "JSON file holding an OpenAI chat-completions request");
  cmd->add_option("--jsonl", opts->jsonl,
                  "JSON lines {\"request\", \"date\", \"completion\"}: print each as "
                  "{\"prompt\": [ids], \"completion\": [ids]} (a training corpus)");
  cmd->add_flag("--auto-drop-analysis", opts->auto_drop_analysis,
                "With --conversation: leave out analysis messages before the last final answer "
                "(requests always do)");
  cmd->add_option("--date", opts->date, "With --request: the system message's current date, YYYY-MM-DD (default: today, UTC)");
  cmd->add_flag("--tokens", opts->tokens, "Print the prompt's token ids (JSON array) instead of its text");
  AddTokenizerOption(cmd, &opts->tokenizer);
  cmd->callback([opts] { RunRender(*opts); });
}

}  // namespace flotilla::cli
