#include "coordinator/response_store.h"

#include "absl/strings/str_cat.h"

namespace flotilla::coordinator {

absl::StatusOr<std::unique_ptr<ResponseStore>> ResponseStore::Create(
    ResponseStoreOptions options, std::function<absl::Time()> now) {
  if (options.max_entries == 0) {
    return absl::InvalidArgumentError("--responses-store-max-entries must be at least 1");
  }
  if (options.max_age <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--responses-store-ttl-s must be positive");
  }
  if (options.max_bytes == 0) {
    return absl::InvalidArgumentError("--responses-store-max-bytes must be at least 1");
  }
  if (!now) now = [] { return absl::Now(); };
  return std::unique_ptr<ResponseStore>(new ResponseStore(options, std::move(now)));
}

ResponseStore::ResponseStore(ResponseStoreOptions options, std::function<absl::Time()> now)
    : options_(options), now_(std::move(now)) {}

void ResponseStore::Put(const std::string& id, nlohmann::ordered_json items) {
  // The serialized size stands for the memory held: close enough to bound it.
  const size_t bytes = items.dump().size() + id.size();
  if (bytes > options_.max_bytes) return;
  const absl::Time now = now_();
  std::lock_guard<std::mutex> l(mu_);
  if (auto old = entries_.find(id); old != entries_.end()) EraseLocked(old);
  by_age_.push_back(id);
  Entry e{std::move(items), bytes, now, std::prev(by_age_.end())};
  entries_.emplace(id, std::move(e));
  bytes_ += bytes;
  EvictLocked(now);
}

absl::StatusOr<nlohmann::ordered_json> ResponseStore::Get(const std::string& id) {
  std::lock_guard<std::mutex> l(mu_);
  EvictLocked(now_());
  auto it = entries_.find(id);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "previous_response_id: no stored response '", id,
        "' (never stored, stored with store: false, or expired from this server's store)"));
  }
  return it->second.items;
}

size_t ResponseStore::size() const {
  std::lock_guard<std::mutex> l(mu_);
  return entries_.size();
}

size_t ResponseStore::bytes() const {
  std::lock_guard<std::mutex> l(mu_);
  return bytes_;
}

void ResponseStore::EvictLocked(absl::Time now) {
  while (!by_age_.empty()) {
    auto oldest = entries_.find(by_age_.front());
    const bool expired = now - oldest->second.stored > options_.max_age;
    if (!expired && entries_.size() <= options_.max_entries && bytes_ <= options_.max_bytes) return;
    EraseLocked(oldest);
  }
}

void ResponseStore::EraseLocked(std::map<std::string, Entry>::iterator it) {
  bytes_ -= it->second.bytes;
  by_age_.erase(it->second.age_position);
  entries_.erase(it);
}

}  // namespace flotilla::coordinator
