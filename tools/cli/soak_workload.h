// The soak program's requests and how each ended. Every request is one of:
// a stream run to its end, a stream cancelled (through the Cancel call) after
// its first token, or a malformed request the server must refuse. An outcome
// that breaks the service's promises is counted apart:
//   lost: a stream that ended OK without a finish reason;
//   hung: a request with no end within the hang bound (its deadline);
//   wrong: a malformed request that was not refused with INVALID_ARGUMENT.
// Errors the service may give while a worker restarts (UNAVAILABLE, ...) are
// `failed`, by status code.
#pragma once

#include <map>
#include <mutex>
#include <random>
#include <string>

#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "tools/sdk/client.h"

namespace flotilla::cli {

enum class SoakKind { kStream, kCancel, kMalformed };

struct SoakTally {
  int64_t requests = 0, ok = 0, cancelled = 0, refused = 0;
  int64_t lost = 0, hung = 0, wrong = 0;
  std::map<std::string, int64_t> failed;  // by status code name

  void Add(const SoakTally& other);
  int64_t failed_total() const;
  nlohmann::json ToJson() const;
};

struct SoakRequestOptions {
  int vocab = 1024;  // prompt ids are drawn below this
  int max_tokens = 64;
};

// Runs one request of `kind` through `client` (whose deadline is the hang
// bound) and counts how it ended in `tally`.
void RunSoakRequest(client::Client& client, SoakKind kind, const SoakRequestOptions& options,
                    std::mt19937_64& rng, SoakTally* tally);

// A kind drawn with the soak's mix: 70% streams, 15% cancels, 15% malformed.
SoakKind DrawSoakKind(std::mt19937_64& rng);

}  // namespace flotilla::cli
