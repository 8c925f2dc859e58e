// A minimal program on libflotilla_client: streams one generation and prints
// each chunk as it arrives.
//   flotilla_client_example HOST:PORT "text prompt"
#include <iostream>

#include "tools/sdk/client.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: " << argv[0] << " HOST:PORT \"prompt text\"\n";
    return 2;
  }
  flotilla::client::ClientOptions options;
  options.address = argv[1];
  auto client = flotilla::client::Client::Create(options);
  if (!client.ok()) {
    std::cerr << client.status().message() << "\n";
    return 2;
  }
  flotilla::v1::GenerateRequest request;
  request.set_text(argv[2]);
  request.mutable_sampling()->set_max_tokens(32);
  request.mutable_sampling()->set_temperature(0.7f);
  absl::Status st = (*client)->GenerateStream(request, [](const flotilla::v1::GenerateResponse& r) {
    std::cout << r.text() << std::flush;
    if (r.has_usage()) {
      std::cout << "\n[" << r.usage().prompt_tokens() << " prompt + "
                << r.usage().completion_tokens() << " generated tokens]\n";
    }
  });
  if (!st.ok()) {
    std::cerr << "\nerror: " << st.ToString() << "\n";
    return 1;
  }
  return 0;
}
