#include "tools/cli/parse_command.h"

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/harmony/openai.h"
#include "common/harmony/parser.h"
#include "tools/cli/harmony_cli_util.h"

namespace flotilla::cli {
namespace {

struct ParseOptions {
  std::string tokens;
  std::string text;
  std::string start_role;
  std::string tokenizer;
  bool non_strict = false;
  bool openai = false;
};

absl::StatusOr<std::vector<tokenizer::TokenId>> ParseTokenList(const std::string& list) {
  std::vector<tokenizer::TokenId> out;
  for (absl::string_view part : absl::StrSplit(absl::string_view(list.data(), list.size()), ',')) {
    absl::string_view p = absl::StripAsciiWhitespace(part);
    if (p.empty()) continue;
    uint32_t id;
    if (!absl::SimpleAtoi(p, &id)) {
      return absl::InvalidArgumentError(absl::StrCat("--tokens: '", p, "' is not a token id"));
    }
    out.push_back(id);
  }
  return out;
}

void RunParse(const ParseOptions& o) {
  if (o.tokens.empty() == o.text.empty()) {
    FailCommand("parse", absl::InvalidArgumentError("give exactly one of --tokens 1,2,3 or --text TEXT"));
  }
  auto tok = LoadTokenizer(o.tokenizer);
  if (!tok.ok()) FailCommand("parse", tok.status());
  std::vector<tokenizer::TokenId> ids;
  if (!o.tokens.empty()) {
    auto parsed = ParseTokenList(o.tokens);
    if (!parsed.ok()) FailCommand("parse", parsed.status());
    ids = std::move(*parsed);
  } else {
    auto enc = (*tok)->Encode(o.text, tokenizer::SpecialTokenPolicy::All());
    if (!enc.ok()) FailCommand("parse", enc.status());
    ids = std::move(*enc);
  }
  harmony::ParserOptions po;
  po.strict = !o.non_strict;
  if (!o.start_role.empty()) {
    auto role = harmony::ParseRole(o.start_role);
    if (!role.ok()) FailCommand("parse", role.status());
    po.start_role = *role;
  }
  harmony::StreamParser parser(tok->get(), po);
  for (tokenizer::TokenId id : ids) {
    auto ev = parser.Process(id);
    if (!ev.ok()) FailCommand("parse", ev.status());
  }
  if (auto st = parser.Finish(); !st.ok()) FailCommand("parse", st);
  for (const auto& w : parser.warnings()) std::cerr << "flotilla parse: warning: " << w << "\n";
  if (o.openai) {
    std::optional<tokenizer::TokenId> ended_by;
    if (!parser.end_tokens().empty()) ended_by = parser.end_tokens().back();
    harmony::ChatReply reply = harmony::MapReply(parser.messages(), ended_by, "cli");
    nlohmann::ordered_json out;
    out["message"] = reply.message;
    out["finish_reason"] = reply.finish_reason;
    std::cout << out.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
    return;
  }
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& m : parser.messages()) out.push_back(harmony::MessageToJson(m));
  std::cout << out.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
}

}  // namespace

void AddParseCommand(CLI::App& app) {
  auto opts = std::make_shared<ParseOptions>();
  CLI::App* cmd = app.add_subcommand("parse", "Parse a Harmony completion into messages (JSON)");
  cmd->add_option("--tokens", opts->tokens, "Comma-separated token ids, e.g. 200006,173781,...");
  cmd->add_option("--text", opts->text, "Completion text, encoded with special tokens allowed");
  cmd->add_option("--start-role", opts->start_role,
                  "Role of the first message when the prompt ended with <|start|>ROLE (e.g. assistant)");
  cmd->add_flag("--non-strict", opts->non_strict, "Recover from malformed headers instead of failing");
  cmd->add_flag("--openai", opts->openai, "Print the OpenAI chat-completions message instead");
  AddTokenizerOption(cmd, &opts->tokenizer);
  cmd->callback([opts] { RunParse(*opts); });
}

}  // namespace flotilla::cli
