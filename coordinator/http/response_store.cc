#include "coordinator/http/response_store.h"

#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace flotilla::coordinator {
namespace {

using Json = nlohmann::ordered_json;

// What glibc's malloc adds to every block (header and rounding), near enough.
constexpr size_t kAllocationOverhead = 16;

// A std::string's heap block beyond the object, none within the small-string buffer.
size_t StringHeapBytes(const std::string& s) {
  return s.capacity() > 15 ? s.capacity() + 1 + kAllocationOverhead : 0;
}

}  // namespace

size_t JsonMemoryBytes(const Json& value) {
  size_t bytes = sizeof(Json);
  // Depth-first over the tree without recursion: values are bounded in depth
  // by ParseJson, but the store must not depend on that.
  std::vector<const Json*> pending = {&value};
  while (!pending.empty()) {
    const Json& v = *pending.back();
    pending.pop_back();
    switch (v.type()) {
      case Json::value_t::string:
        bytes += sizeof(std::string) + kAllocationOverhead + StringHeapBytes(v.get_ref<const std::string&>());
        break;
      case Json::value_t::array: {
        const auto& a = v.get_ref<const Json::array_t&>();
        bytes += sizeof(Json::array_t) + kAllocationOverhead * 2 + a.capacity() * sizeof(Json);
        for (const Json& e : a) pending.push_back(&e);
        break;
      }
      case Json::value_t::object: {
        const auto& o = v.get_ref<const Json::object_t&>();
        bytes += sizeof(Json::object_t) + kAllocationOverhead * 2 +
                 o.capacity() * sizeof(Json::object_t::value_type);
        for (const auto& [key, e] : o) {
          bytes += StringHeapBytes(key);
          pending.push_back(&e);
        }
        break;
      }
      case Json::value_t::binary:
        bytes += sizeof(Json::binary_t) + kAllocationOverhead * 2 + v.get_binary().capacity();
        break;
      default:
        break;  // numbers, booleans and null live in the node itself
    }
  }
  return bytes;
}

namespace {

absl::Status NotFound(const std::string& id, const std::string& param) {
  return absl::NotFoundError(absl::StrCat(
      param, ": no stored response '", id,
      "' (never stored, stored with store: false, deleted, or expired from this server's store)"));
}

}  // namespace

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

void ResponseStore::Put(const std::string& id, const std::string& owner, Stored stored) {
  const size_t bytes = JsonMemoryBytes(stored.response) + JsonMemoryBytes(stored.items) +
                       sizeof(Entry) + 2 * id.size() + owner.size() + 4 * kAllocationOverhead;
  if (bytes > options_.max_bytes) return;
  const absl::Time now = now_();
  std::lock_guard<std::mutex> l(mu_);
  if (auto old = entries_.find(id); old != entries_.end()) EraseLocked(old);
  by_age_.push_back(id);
  Entry e{owner, std::move(stored), bytes, now, std::prev(by_age_.end())};
  entries_.emplace(id, std::move(e));
  bytes_ += bytes;
  EvictLocked(now);
}

std::map<std::string, ResponseStore::Entry>::iterator ResponseStore::FindLocked(
    const std::string& id, const std::string& owner) {
  EvictLocked(now_());
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.owner != owner) return entries_.end();
  return it;
}

absl::StatusOr<ResponseStore::Stored> ResponseStore::Get(const std::string& id,
                                                          const std::string& owner,
                                                          const std::string& param) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = FindLocked(id, owner);
  if (it == entries_.end()) return NotFound(id, param);
  return it->second.stored;
}

absl::Status ResponseStore::Delete(const std::string& id, const std::string& owner) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = FindLocked(id, owner);
  if (it == entries_.end()) return NotFound(id, "response_id");
  EraseLocked(it);
  return absl::OkStatus();
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
    const bool expired = now - oldest->second.stored_at > options_.max_age;
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
