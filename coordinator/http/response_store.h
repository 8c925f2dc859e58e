// The responses kept for `previous_response_id` and GET/DELETE
// /v1/responses/{id} (POST /v1/responses with `store`): each entry is the
// response object and the whole conversation it ended, as Responses items
// (the inputs of its chain, then its own output items), so a follow-up
// request continues it without the client resending anything. A background
// response is here from its start, with how to cancel it
// (POST /v1/responses/{id}/cancel), and is replaced by its end.
//
// Every entry belongs to the key that created it (its owner, the caller's key
// id; empty when the server has no keys): another key gets the same NOT_FOUND
// as for an id that never existed, so ids leak nothing across tenants.
//
// Memory only, bounded three ways: the number of entries, their age and the
// memory they hold (JsonMemoryBytes: the parsed trees, not their text); the
// oldest entry goes first when a bound is passed, so a store under load
// forgets rather than grows.
#pragma once

#include <cstddef>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
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

// The heap memory a parsed JSON value holds (nodes, strings, containers'
// capacity, and the allocator's per-block overhead), which for short strings
// and small objects is several times its serialized size.
size_t JsonMemoryBytes(const nlohmann::ordered_json& value);

class ResponseStore {
 public:
  // `now` is the clock (tests inject a fake); null = absl::Now. Refuses
  // bounds of zero (a store that keeps nothing is `store: false`, not a flag).
  static absl::StatusOr<std::unique_ptr<ResponseStore>> Create(
      ResponseStoreOptions options, std::function<absl::Time()> now = nullptr);

  // One stored response: the object the API answered (in progress while a
  // background response is generated), and the conversation it ended (a
  // JSON array of Responses items).
  struct Stored {
    nlohmann::ordered_json response;
    nlohmann::ordered_json items;
    // Set while the response is generated in the background: stops the
    // generation and returns the response as it then is (cancelled, or
    // however it ended if it ended first). Null once it ended.
    std::function<nlohmann::ordered_json()> cancel = nullptr;
  };

  // Keeps `stored` under `id` for `owner`, replacing an entry of that id. An
  // entry larger than max_bytes on its own is not kept.
  void Put(const std::string& id, const std::string& owner, Stored stored);
  // The entry under `id` if `owner` created it; NOT_FOUND naming `param` when
  // there is none for this owner (never stored, another key's, deleted,
  // evicted or expired: the message does not say which).
  absl::StatusOr<Stored> Get(const std::string& id, const std::string& owner,
                             const std::string& param = "previous_response_id");
  // Forgets `id`; NOT_FOUND as Get's.
  absl::Status Delete(const std::string& id, const std::string& owner);

  size_t size() const;
  size_t bytes() const;

 private:
  struct Entry {
    std::string owner;
    Stored stored;
    size_t bytes = 0;
    absl::Time stored_at;
    std::list<std::string>::iterator age_position;
  };
  ResponseStore(ResponseStoreOptions options, std::function<absl::Time()> now);
  // The live entry of `id` owned by `owner`, or entries_.end() (under mu_).
  std::map<std::string, Entry>::iterator FindLocked(const std::string& id, const std::string& owner);
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
