// Comparing secrets (API keys, the cluster token) with no early exit on the
// first differing byte. Header-only.
#pragma once

#include <cstddef>
#include <string_view>

namespace flotilla {

// Whether `presented` equals `stored`, in time that depends only on the
// lengths: every byte of `stored` is looked at whatever `presented` holds, so
// the time tells at most the stored secret's length.
inline bool ConstantTimeEquals(std::string_view presented, std::string_view stored) {
  unsigned char diff = presented.size() == stored.size() ? 0 : 1;
  for (size_t i = 0; i < stored.size(); ++i) {
    const unsigned char x = i < presented.size() ? static_cast<unsigned char>(presented[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ static_cast<unsigned char>(stored[i]));
  }
  return diff == 0;
}

}  // namespace flotilla
