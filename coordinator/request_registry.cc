#include "coordinator/request_registry.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdlib>

#include "absl/strings/escaping.h"

namespace flotilla::coordinator {

std::string RandomId() {
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    // getrandom fails only on kernels older than 3.17 or with bad arguments:
    // guessable ids are not an acceptable fallback.
    if (n < 0) std::abort();
    got += static_cast<size_t>(n);
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
}

std::string RequestRegistry::Reserve(const Caller& owner) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string id = RandomId();
  while (entries_.count(id) != 0) id = RandomId();
  entries_[id] = Entry{owner.key_id, 0};
  return id;
}

void RequestRegistry::Bind(const std::string& public_id, uint64_t internal_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(public_id);
  if (it != entries_.end()) it->second.internal = internal_id;
}

void RequestRegistry::Remove(const std::string& public_id) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.erase(public_id);
}

std::optional<uint64_t> RequestRegistry::Find(const std::string& public_id,
                                              const Caller& caller) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(public_id);
  if (it == entries_.end() || it->second.internal == 0) return std::nullopt;
  const bool allowed = caller.role != Caller::Role::kClient || caller.key_id == it->second.owner;
  if (!allowed) return std::nullopt;
  return it->second.internal;
}

size_t RequestRegistry::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

}  // namespace flotilla::coordinator
