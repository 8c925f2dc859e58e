// The responses kept for `previous_response_id` (POST /v1/responses with
// `store`): each entry is the whole conversation a response ended, as
// Responses items (the inputs of its chain, then its own output items), so a
// follow-up request continues it without the client resending anything.
// Memory only, bounded three ways: the number of entries, their age and their
// total size; the oldest entry goes first when a bound is passed, so a store
// under load forgets rather than grows.
#pragma once

#include <cstddef>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace flotilla::coordinator {

struct ResponseStoreOptions {
  size_t max_entries = 1024;                // --responses-store-max-entries
  absl::Duration max_age = absl::Hours(1);  // --responses-store-ttl-s
  size_t max_bytes = 256u << 20;            // --responses-store-max-bytes
};

class ResponseStore {
 public:
  // `now` is the clock (tests inject a fake); null = absl::Now. Refuses
  // bounds of zero (a store that keeps nothing is `store: false`, not a flag).
  static absl::StatusOr<std::unique_ptr<ResponseStore>> Create(
      ResponseStoreOptions options, std::function<absl::Time()> now = nullptr);

  // Keeps `items` (a JSON array of Responses items) under `id`, replacing an
  // entry of that id. An entry larger than max_bytes on its own is not kept.
  void Put(const std::string& id, nlohmann::ordered_json items);
  // The items stored under `id`; NOT_FOUND naming previous_response_id when
  // there is none (never stored, evicted or expired).
  absl::StatusOr<nlohmann::ordered_json> Get(const std::string& id);

  size_t size() const;
  size_t bytes() const;

 private:
  struct Entry {
    nlohmann::ordered_json items;
    size_t bytes = 0;
    absl::Time stored;
    std::list<std::string>::iterator age_position;
  };
  ResponseStore(ResponseStoreOptions options, std::function<absl::Time()> now);
  // Drops expired entries, then the oldest while a bound is passed (under mu_).
  void EvictLocked(absl::Time now);
  void EraseLocked(std::map<std::string, Entry>::iterator it);

  const ResponseStoreOptions options_;
  const std::function<absl::Time()> now_;
  mutable std::mutex mu_;
  std::map<std::string, Entry> entries_;  // under mu_
  std::list<std::string> by_age_;         // ids, oldest first; under mu_
  size_t bytes_ = 0;                      // under mu_
};

}  // namespace flotilla::coordinator
