#include "tools/cli/chat_command.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/proto_enum_name.h"
#include "common/tokenizer/streaming_detokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "tools/cli/tls_flags.h"
#include "tools/sdk/client.h"

namespace flotilla::cli {
namespace {

struct ChatFlags {
  TlsClientFiles tls;
  std::string coordinator;
  std::string api_key;
  std::string model;
  std::optional<std::string> prompt;
  std::string system;
  std::string reasoning_effort;
  uint32_t max_tokens = 1024;
  std::optional<float> temperature;
  std::optional<uint64_t> seed;
  double timeout_s = 600;
  bool hide_reasoning = false;
  bool show_harmony = false;
};

volatile std::sig_atomic_t g_interrupted = 0;
void OnInterrupt(int) { g_interrupted = 1; }

// Prints the deltas of one reply as they arrive. On a terminal: reasoning
// dimmed, the answer plain. Otherwise each block starts on its own line with
// a label, so a pipe or a log still tells them apart.
//
// With `harmony` (a tokenizer): the raw completion streams instead, as the
// model writes it (Harmony headers and special tokens included), and the
// parsed reply follows once it is complete.
class ReplyPrinter {
 public:
  ReplyPrinter(bool tty, bool hide_reasoning, const tokenizer::Tokenizer* harmony)
      : tty_(tty), hide_reasoning_(hide_reasoning), harmony_(harmony) {
    if (harmony_) detok_.emplace(harmony_, tokenizer::StreamingDetokenizer::InvalidBytes::kReplace);
  }

  void Add(const v1::ChatResponse& r) {
    if (harmony_) {
      for (int32_t id : r.token_ids()) {
        absl::StatusOr<std::string> piece = detok_->Append(static_cast<tokenizer::TokenId>(id));
        if (piece.ok()) Text(Block::kHarmony, *piece);
      }
      std::cout << std::flush;
      return;
    }
    AddDeltas(r);
    std::cout << std::flush;
  }

  // The parsed reply, after a raw (Harmony) stream.
  void Parsed(const client::ChatResult& result) {
    if (!harmony_) return;
    if (absl::StatusOr<std::string> rest = detok_->Finish(); rest.ok())
      Text(Block::kHarmony, *rest);
    v1::ChatResponse whole;
    if (!result.reasoning.empty() && !hide_reasoning_)
      whole.add_deltas()->set_reasoning(result.reasoning);
    whole.add_deltas()->set_content(result.content.empty() ? "(empty)" : result.content);
    for (size_t i = 0; i < result.tool_calls.size(); ++i) {
      v1::ToolCallDelta* t = whole.add_deltas()->mutable_tool_call();
      t->set_index(static_cast<uint32_t>(i));
      t->set_name(result.tool_calls[i].name);
      t->set_arguments(result.tool_calls[i].arguments);
    }
    AddDeltas(whole);
  }

 private:
  void AddDeltas(const v1::ChatResponse& r) {
    for (const v1::ChatDelta& d : r.deltas()) {
      switch (d.delta_case()) {
        case v1::ChatDelta::kReasoning:
          if (!hide_reasoning_) Text(Block::kReasoning, d.reasoning());
          break;
        case v1::ChatDelta::kContent:
          Text(Block::kAnswer, d.content());
          break;
        case v1::ChatDelta::kToolCall: {
          const v1::ToolCallDelta& t = d.tool_call();
          if (!t.name().empty()) {
            Switch(Block::kToolCall);
            std::cout << t.name() << " ";
          }
          std::cout << t.arguments();
          break;
        }
        default:
          break;
      }
    }
  }

 public:
  // Ends the reply's output (newline, colours reset).
  void End() {
    if (tty_ && (block_ == Block::kReasoning || block_ == Block::kHarmony)) std::cout << "\x1b[0m";
    if (block_ != Block::kNone) std::cout << "\n";
    block_ = Block::kNone;
    std::cout << std::flush;
  }

 private:
  enum class Block { kNone, kReasoning, kAnswer, kToolCall, kHarmony };

  void Text(Block b, const std::string& text) {
    if (text.empty()) return;
    Switch(b);
    std::cout << text;
  }

  void Switch(Block b) {
    if (b == block_ && b != Block::kToolCall) return;
    if (tty_ && (block_ == Block::kReasoning || block_ == Block::kHarmony)) std::cout << "\x1b[0m";
    if (block_ != Block::kNone) std::cout << "\n";
    block_ = b;
    if (tty_) {
      if (b == Block::kReasoning) std::cout << "\x1b[2m";
      if (b == Block::kToolCall) std::cout << "\x1b[36mtool call:\x1b[0m ";
      if (b == Block::kHarmony) std::cout << "\x1b[2;3m";
    } else {
      std::cout << (b == Block::kReasoning ? "reasoning: "
                    : b == Block::kAnswer  ? "answer: "
                    : b == Block::kHarmony ? "harmony: "
                                           : "tool_call: ");
    }
  }

  bool tty_;
  bool hide_reasoning_;
  const tokenizer::Tokenizer* harmony_;
  std::optional<tokenizer::StreamingDetokenizer> detok_;
  Block block_ = Block::kNone;
};

// Sends the conversation, streams the reply; Ctrl-C cancels the stream.
absl::StatusOr<client::ChatResult> Turn(client::Client& c, const v1::ChatRequest& req, bool tty,
                                        bool hide_reasoning, const tokenizer::Tokenizer* harmony) {
  ReplyPrinter printer(tty, hide_reasoning, harmony);
  client::ChatResult result;
  client::CancelHandle cancel;
  g_interrupted = 0;
  auto previous = std::signal(SIGINT, OnInterrupt);
  std::atomic<bool> streaming{true};
  std::thread watcher([&] {
    while (streaming) {
      if (g_interrupted) {
        cancel.Cancel();
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  absl::Status st = c.ChatStream(
      req,
      [&](const v1::ChatResponse& r) {
        result.Add(r);
        printer.Add(r);
      },
      &cancel);
  streaming = false;
  watcher.join();
  std::signal(SIGINT, previous);
  if (st.ok()) printer.Parsed(result);
  printer.End();
  if (!st.ok()) {
    if (cancel.cancelled()) {
      result.finish_reason = v1::ChatResponse::CANCELLED;
      std::cerr << "[cancelled]\n";
      return result;
    }
    return st;
  }
  std::cerr << (tty ? "\x1b[2m" : "") << "["
            << LowerCaseEnumName(result.finish_reason).value_or("none") << "; "
            << result.prompt_tokens << " prompt + " << result.completion_tokens
            << " completion tokens]" << (tty ? "\x1b[0m" : "") << "\n";
  return result;
}

int ExitCode(const absl::Status& st) {
  return st.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

int RunChat(const ChatFlags& f) {
  client::ClientOptions co;
  co.address = f.coordinator;
  co.api_key = f.api_key;
  co.tls = f.tls;
  co.deadline = absl::Milliseconds(static_cast<int64_t>(f.timeout_s * 1000));
  absl::StatusOr<std::unique_ptr<client::Client>> c = client::Client::Create(co);
  if (!c.ok()) {
    std::cerr << "flotilla chat: " << c.status().message() << "\n";
    return 2;
  }
  v1::ChatRequest req;
  req.set_model(f.model);
  if (!f.system.empty())
    *req.add_messages() = client::MakeChatMessage(v1::ChatMessage::SYSTEM, f.system);
  if (f.reasoning_effort == "low") req.set_reasoning_effort(v1::LOW);
  if (f.reasoning_effort == "medium") req.set_reasoning_effort(v1::MEDIUM);
  if (f.reasoning_effort == "high") req.set_reasoning_effort(v1::HIGH);
  req.mutable_sampling()->set_max_tokens(f.max_tokens);
  if (f.temperature) req.mutable_sampling()->set_temperature(*f.temperature);
  if (f.seed) req.mutable_sampling()->set_seed(*f.seed);
  const bool tty = isatty(STDOUT_FILENO) != 0;
  std::unique_ptr<tokenizer::Tokenizer> harmony;
  if (f.show_harmony) {
    absl::StatusOr<std::unique_ptr<tokenizer::Tokenizer>> t =
        tokenizer::Tokenizer::Create(tokenizer::Tokenizer::DefaultRanksPath());
    if (!t.ok()) {
      std::cerr << "flotilla chat: --show-harmony needs the tokenizer: " << t.status().message()
                << "\n";
      return 2;
    }
    harmony = *std::move(t);
    req.set_return_token_ids(true);
  }

  if (f.prompt) {
    *req.add_messages() = client::MakeChatMessage(v1::ChatMessage::USER, *f.prompt);
    absl::StatusOr<client::ChatResult> r = Turn(**c, req, tty, f.hide_reasoning, harmony.get());
    if (!r.ok()) {
      std::cerr << "flotilla chat: " << f.coordinator << ": " << r.status().message() << "\n";
      return ExitCode(r.status());
    }
    return r->finish_reason == v1::ChatResponse::CANCELLED ? 130 : 0;
  }

  const bool interactive = isatty(STDIN_FILENO) != 0;
  if (interactive) {
    std::cerr << "flotilla chat with " << f.coordinator
              << ": type a message and Enter; /reset starts over, /exit (or Ctrl-D) quits, "
                 "Ctrl-C stops a reply.\n";
  }
  const int base = req.messages_size();  // the system message, if any
  std::string line;
  while (true) {
    if (interactive) std::cerr << (tty ? "\x1b[1m> \x1b[0m" : "> ") << std::flush;
    if (!std::getline(std::cin, line)) break;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      req.mutable_messages()->DeleteSubrange(base, req.messages_size() - base);
      continue;
    }
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (!interactive && !tty) std::cout << "user: " << line << "\n";
    *req.add_messages() = client::MakeChatMessage(v1::ChatMessage::USER, line);
    absl::StatusOr<client::ChatResult> r = Turn(**c, req, tty, f.hide_reasoning, harmony.get());
    if (!r.ok()) {
      std::cerr << "flotilla chat: " << r.status().message() << "\n";
      req.mutable_messages()->RemoveLast();  // the turn did not happen
      if (r.status().code() == absl::StatusCode::kUnavailable && !interactive) return 1;
      continue;
    }
    if (r->finish_reason == v1::ChatResponse::CANCELLED) {
      req.mutable_messages()->RemoveLast();
      continue;
    }
    *req.add_messages() = r->AsMessage();
  }
  return 0;
}

}  // namespace

void AddChatCommand(CLI::App& app) {
  auto f = std::make_shared<ChatFlags>();
  CLI::App* cmd = app.add_subcommand(
      "chat", "Chat with a running cluster: interactive (stdin) or --prompt for one shot");
  cmd->add_option("--coordinator", f->coordinator, "HOST:PORT of the cluster")->required();
  cmd->add_option("--api-key", f->api_key, "API key sent as \"Authorization: Bearer KEY\"")
      ->envname("FLOTILLA_API_KEY");
  AddClientTlsFlags(cmd, &f->tls);
  cmd->add_option("--prompt", f->prompt, "one user message: print the reply and exit");
  cmd->add_option("--system", f->system, "instructions (a system message)");
  cmd->add_option("--reasoning-effort", f->reasoning_effort,
                  "low, medium or high (default: the server's)")
      ->check(CLI::IsMember({"low", "medium", "high"}));
  cmd->add_option("--max-tokens", f->max_tokens, "most tokens per reply")
      ->check(CLI::Range(1u, 1u << 30))
      ->capture_default_str();
  cmd->add_option("--temperature", f->temperature, "0 = greedy, up to 2 (default 1)")
      ->check(CLI::Range(0.0, 2.0));
  cmd->add_option("--seed", f->seed, "sampling seed");
  cmd->add_option("--model", f->model, "model id (default: the served one)");
  cmd->add_option("--timeout", f->timeout_s, "seconds before a reply gives up")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_flag("--hide-reasoning", f->hide_reasoning, "print only the answer (and tool calls)");
  cmd->add_flag("--show-harmony", f->show_harmony,
                "stream the raw completion (Harmony tokens as generated), then the parsed reply");
  cmd->callback([f] {
    const int rc = RunChat(*f);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace flotilla::cli
