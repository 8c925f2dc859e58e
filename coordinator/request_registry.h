// The ids clients see: 128 random bits each, mapped to the manager's
// sequential internal ids, with the key that created each request so that
// only its owner (or an admin) may cancel it.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "coordinator/auth.h"

namespace flotilla::coordinator {

// 128 bits from the operating system's random source, as 32 lowercase hex
// digits.
std::string RandomId();

class RequestRegistry {
 public:
  // A new public id owned by `owner`, not yet bound to a request (Find does
  // not return it until Bind).
  std::string Reserve(const Caller& owner);
  // Binds `public_id` to the manager's `internal_id`; does nothing when the
  // id was already removed (the request ended while it was being submitted).
  void Bind(const std::string& public_id, uint64_t internal_id);
  // Forgets `public_id` (its request ended).
  void Remove(const std::string& public_id);
  // The internal id of `public_id` when `caller` created it, is an admin, or
  // the server is open; nothing otherwise (whether it exists is not told).
  std::optional<uint64_t> Find(const std::string& public_id, const Caller& caller) const;
  size_t size() const;

 private:
  struct Entry {
    std::string owner;      // Caller::key_id
    uint64_t internal = 0;  // 0 = not bound yet
  };
  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> entries_;  // under mu_
};

}  // namespace flotilla::coordinator
