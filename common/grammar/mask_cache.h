// Token masks shared by every constraint over one vocabulary. Requests with the same
// schema (an agent's tools, a client's response format) walk the same states:
// the first request computes a state's mask (a walk of the vocabulary's token
// trie, up to tens of milliseconds), every later one copies it. Keys name what
// a mask depends on (see OutputConstraint); the oldest entries go first once
// the cache holds `max_bytes`. Thread-safe: a step computes its rows' masks in
// parallel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <deque>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace flotilla::grammar {

class VocabularyIndex;

class MaskCache {
 public:
  static constexpr size_t kDefaultBytes = size_t{256} << 20;  // ~10,000 masks over o200k

  explicit MaskCache(size_t max_bytes) : max_bytes_(max_bytes) {}

  // The cache every constraint over `index` shares (a fresh one when the
  // index that had this address is gone).
  static std::shared_ptr<MaskCache> For(const std::shared_ptr<const VocabularyIndex>& index) {
    struct Entry {
      std::weak_ptr<const VocabularyIndex> index;
      std::shared_ptr<MaskCache> cache;
    };
    static std::mutex* mu = new std::mutex;
    static auto* caches = new std::unordered_map<const VocabularyIndex*, Entry>;
    std::lock_guard<std::mutex> lock(*mu);
    for (auto it = caches->begin(); it != caches->end();) {
      it = it->second.index.expired() ? caches->erase(it) : std::next(it);
    }
    Entry& e = (*caches)[index.get()];
    if (e.cache == nullptr) e = Entry{index, std::make_shared<MaskCache>(kDefaultBytes)};
    return e.cache;
  }

  // Copies the mask cached under `key` into `bits` (`words` words).
  bool Lookup(const std::string& key, uint32_t* bits, size_t words) {
    std::shared_ptr<const std::vector<uint32_t>> mask;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = masks_.find(key);
      if (it == masks_.end()) {
        ++misses_;
        return false;
      }
      ++hits_;
      mask = it->second;
    }
    if (mask->size() != words) return false;
    std::copy(mask->begin(), mask->end(), bits);
    return true;
  }

  void Insert(const std::string& key, const uint32_t* bits, size_t words) {
    auto mask = std::make_shared<const std::vector<uint32_t>>(bits, bits + words);
    const size_t size = Size(key, words);
    std::lock_guard<std::mutex> lock(mu_);
    if (size > max_bytes_ || !masks_.emplace(key, std::move(mask)).second) return;
    order_.push_back(key);
    bytes_ += size;
    while (bytes_ > max_bytes_ && !order_.empty()) {
      auto old = masks_.find(order_.front());
      bytes_ -= Size(order_.front(), old->second->size());
      masks_.erase(old);
      order_.pop_front();
    }
  }

  struct Counts {
    uint64_t hits = 0, misses = 0;
    size_t bytes = 0, entries = 0;
  };
  Counts counts() {
    std::lock_guard<std::mutex> lock(mu_);
    return Counts{hits_, misses_, bytes_, masks_.size()};
  }

 private:
  // What an entry holds: its mask, and its key twice (the map and the order).
  static size_t Size(const std::string& key, size_t words) {
    return words * sizeof(uint32_t) + 2 * key.size() + 64;
  }

  const size_t max_bytes_;
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const std::vector<uint32_t>>> masks_;
  std::deque<std::string> order_;  // insertion order: the front is evicted first
  size_t bytes_ = 0;
  uint64_t hits_ = 0, misses_ = 0;
};

}  // namespace flotilla::grammar
