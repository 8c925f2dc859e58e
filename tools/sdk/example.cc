// A minimal program on libflotilla_client: streams one generation (or, with
// --chat, one chat reply) and prints each piece as it arrives.
//   flotilla_client_example HOST:PORT "text prompt" [--chat]
#include <iostream>
#include <string>

#include "tools/sdk/client.h"

int main(int argc, char** argv) {
  const bool chat = argc == 4 && std::string(argv[3]) == "--chat";
  if (argc != 3 && !chat) {
    std::cerr << "usage: " << argv[0] << " HOST:PORT \"prompt text\" [--chat]\n";
    return 2;
  }
  flotilla::client::ClientOptions options;
  options.address = argv[1];
  auto client = flotilla::client::Client::Create(options);
  if (!client.ok()) {
    std::cerr << client.status().message() << "\n";
    return 2;
  }
  absl::Status st;
  if (chat) {
    // The server renders the conversation with Harmony and parses the reply:
    // reasoning and answer arrive as separate deltas.
    flotilla::v1::ChatRequest request;
    *request.add_messages() =
        flotilla::client::MakeChatMessage(flotilla::v1::ChatMessage::USER, argv[2]);
    request.set_reasoning_effort(flotilla::v1::LOW);
    request.mutable_sampling()->set_max_tokens(64);
    bool reasoning = false;
    st = (*client)->ChatStream(request, [&reasoning](const flotilla::v1::ChatResponse& r) {
      for (const flotilla::v1::ChatDelta& d : r.deltas()) {
        if (d.has_reasoning()) {
          std::cout << (reasoning ? "" : "[reasoning] ") << d.reasoning();
          reasoning = true;
        }
        if (d.has_content()) {
          std::cout << (reasoning ? "\n[answer] " : "") << d.content();
          reasoning = false;
        }
        if (d.has_tool_call() && !d.tool_call().name().empty()) {
          std::cout << "\n[tool call] " << d.tool_call().name() << "\n";
        }
      }
      std::cout << std::flush;
      if (r.has_usage()) {
        std::cout << "\n[" << r.usage().prompt_tokens() << " prompt + "
                  << r.usage().completion_tokens() << " generated tokens]\n";
      }
    });
  } else {
    flotilla::v1::GenerateRequest request;
    request.set_text(argv[2]);
    request.mutable_sampling()->set_max_tokens(32);
    request.mutable_sampling()->set_temperature(0.7f);
    st = (*client)->GenerateStream(request, [](const flotilla::v1::GenerateResponse& r) {
      std::cout << r.text() << std::flush;
      if (r.has_usage()) {
        std::cout << "\n[" << r.usage().prompt_tokens() << " prompt + "
                  << r.usage().completion_tokens() << " generated tokens]\n";
      }
    });
  }
  if (!st.ok()) {
    std::cerr << "\nerror: " << st.ToString() << "\n";
    return 1;
  }
  return 0;
}
