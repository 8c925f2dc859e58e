// The server key behind the Responses API's `encrypted_content` (include:
// ["reasoning.encrypted_content"]): a reasoning item's text is sealed with
// AES-256-GCM so a client that keeps nothing on the server (store: false)
// can hand it back in a later request's `input`, and the server can trust it
// was its own reasoning, unaltered.
//
// A blob is base64 of: version (1 byte, 1) | key id (8 bytes: the start of
// SHA-256 of the key) | nonce (12 random bytes) | ciphertext | tag (16
// bytes); the version and key id are authenticated with it. The key id picks
// the key that opens it, so keys rotate: the first key seals, every key
// opens. Nothing here knows HTTP or JSON.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace flotilla::coordinator {

class ReasoningCipher {
 public:
  static constexpr size_t kKeyBytes = 32;

  // `keys[0]` seals, each of `keys` opens; every key is kKeyBytes raw bytes.
  static absl::StatusOr<std::unique_ptr<ReasoningCipher>> Create(std::vector<std::string> keys);
  // One random key (what a coordinator without --reasoning-key-file uses:
  // its blobs open only in that process).
  static absl::StatusOr<std::unique_ptr<ReasoningCipher>> Random();
  // The keys of `text` (a key file): one key a line as 64 hex digits, the
  // current key first, then the older ones still accepted; blank lines and
  // lines starting with '#' are skipped. Errors name `origin` and the line.
  static absl::StatusOr<std::unique_ptr<ReasoningCipher>> Parse(absl::string_view text,
                                                                const std::string& origin);
  // Parse of the file at `path`.
  static absl::StatusOr<std::unique_ptr<ReasoningCipher>> FromFile(const std::string& path);

  // `plaintext` sealed with the current key, as base64 (INTERNAL only if
  // OpenSSL fails, e.g. out of memory).
  absl::StatusOr<std::string> Seal(absl::string_view plaintext) const;
  // The plaintext of a Seal'ed blob; INVALID_ARGUMENT saying why not (not
  // base64, too short, an unknown version, a key this server does not hold,
  // or altered), without a field name: the caller names the field.
  absl::StatusOr<std::string> Open(absl::string_view blob) const;

 private:
  struct Key {
    std::string bytes;
    std::array<unsigned char, 8> id;
  };
  explicit ReasoningCipher(std::vector<Key> keys) : keys_(std::move(keys)) {}

  std::vector<Key> keys_;  // [0] seals
};

}  // namespace flotilla::coordinator
