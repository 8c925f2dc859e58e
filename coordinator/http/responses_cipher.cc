#include "coordinator/http/responses_cipher.h"

#include <openssl/evp.h>
#include <openssl/rand.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace flotilla::coordinator {
namespace {

constexpr unsigned char kVersion = 1;
constexpr size_t kIdBytes = 8;
constexpr size_t kNonceBytes = 12;
constexpr size_t kTagBytes = 16;
constexpr size_t kHeaderBytes = 1 + kIdBytes;  // version and key id: authenticated, not secret
// Binds blobs to their purpose: a blob sealed for anything else with the same
// key does not open here.
constexpr absl::string_view kPurpose = "flotilla reasoning.encrypted_content";

using CipherContext = std::unique_ptr<EVP_CIPHER_CTX, decltype(&EVP_CIPHER_CTX_free)>;

CipherContext NewContext() { return CipherContext(EVP_CIPHER_CTX_new(), EVP_CIPHER_CTX_free); }

const unsigned char* Bytes(absl::string_view s) {
  return reinterpret_cast<const unsigned char*>(s.data());
}
unsigned char* Bytes(std::string& s) { return reinterpret_cast<unsigned char*>(s.data()); }

// The additional authenticated data of a blob: its header and the purpose.
std::string Aad(absl::string_view header) { return absl::StrCat(header, kPurpose); }

absl::Status Internal(const char* step) {
  return absl::InternalError(absl::StrCat("reasoning encryption: OpenSSL failed in ", step));
}

absl::StatusOr<std::string> HexKey(absl::string_view hex) {
  if (hex.size() != 2 * ReasoningCipher::kKeyBytes ||
      !std::all_of(hex.begin(), hex.end(), [](char c) { return absl::ascii_isxdigit(c); })) {
    return absl::InvalidArgumentError(
        absl::StrCat("a key must be ", 2 * ReasoningCipher::kKeyBytes,
                     " hex digits (32 random bytes, e.g. from `openssl rand -hex 32`)"));
  }
  return absl::HexStringToBytes(hex);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ReasoningCipher>> ReasoningCipher::Create(
    std::vector<std::string> keys) {
  if (keys.empty()) return absl::InvalidArgumentError("reasoning keys: none given");
  std::vector<Key> out;
  for (std::string& bytes : keys) {
    if (bytes.size() != kKeyBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("reasoning keys: a key has ", bytes.size(), " bytes, not ", kKeyBytes));
    }
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int size = 0;
    if (EVP_Digest(bytes.data(), bytes.size(), digest, &size, EVP_sha256(), nullptr) != 1) {
      return Internal("SHA-256");
    }
    Key key{std::move(bytes), {}};
    std::copy_n(digest, kIdBytes, key.id.begin());
    out.push_back(std::move(key));
  }
  return std::unique_ptr<ReasoningCipher>(new ReasoningCipher(std::move(out)));
}

absl::StatusOr<std::unique_ptr<ReasoningCipher>> ReasoningCipher::Random() {
  std::string key(kKeyBytes, '\0');
  if (RAND_bytes(Bytes(key), static_cast<int>(key.size())) != 1) return Internal("RAND_bytes");
  return Create({std::move(key)});
}

absl::StatusOr<std::unique_ptr<ReasoningCipher>> ReasoningCipher::Parse(absl::string_view text,
                                                                        const std::string& origin) {
  std::vector<std::string> keys;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    absl::StatusOr<std::string> key = HexKey(line);
    if (!key.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(origin, " line ", line_number, ": ", key.status().message()));
    }
    keys.push_back(*std::move(key));
  }
  if (keys.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": no key (one key a line as 64 hex digits, the current one first)"));
  }
  return Create(std::move(keys));
}

absl::StatusOr<std::unique_ptr<ReasoningCipher>> ReasoningCipher::FromFile(
    const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return absl::InvalidArgumentError(
        absl::StrCat("--reasoning-key-file: cannot read '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  return Parse(text.str(), absl::StrCat("--reasoning-key-file '", path, "'"));
}

absl::StatusOr<std::string> ReasoningCipher::Seal(absl::string_view plaintext) const {
  const Key& key = keys_.front();
  std::string blob(kHeaderBytes + kNonceBytes + plaintext.size() + kTagBytes, '\0');
  blob[0] = static_cast<char>(kVersion);
  std::copy(key.id.begin(), key.id.end(), blob.begin() + 1);
  unsigned char* nonce = Bytes(blob) + kHeaderBytes;
  if (RAND_bytes(nonce, kNonceBytes) != 1) return Internal("RAND_bytes");
  const std::string aad = Aad(absl::string_view(blob).substr(0, kHeaderBytes));
  unsigned char* out = nonce + kNonceBytes;
  CipherContext ctx = NewContext();
  int len = 0;
  if (!ctx || EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, nullptr, nullptr) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_IVLEN, kNonceBytes, nullptr) != 1 ||
      EVP_EncryptInit_ex(ctx.get(), nullptr, nullptr, Bytes(key.bytes), nonce) != 1 ||
      EVP_EncryptUpdate(ctx.get(), nullptr, &len, Bytes(aad), static_cast<int>(aad.size())) != 1 ||
      EVP_EncryptUpdate(ctx.get(), out, &len, Bytes(plaintext),
                        static_cast<int>(plaintext.size())) != 1 ||
      EVP_EncryptFinal_ex(ctx.get(), out + len, &len) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, kTagBytes, out + plaintext.size()) !=
          1) {
    return Internal("AES-256-GCM encryption");
  }
  return absl::Base64Escape(blob);
}

absl::StatusOr<std::string> ReasoningCipher::Open(absl::string_view text) const {
  std::string blob;
  if (!absl::Base64Unescape(text, &blob)) {
    return absl::InvalidArgumentError("is not base64 (pass back the value this server returned)");
  }
  if (blob.size() < kHeaderBytes + kNonceBytes + kTagBytes) {
    return absl::InvalidArgumentError("is too short to be this server's encrypted content");
  }
  if (static_cast<unsigned char>(blob[0]) != kVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("has an unknown format version ", static_cast<unsigned char>(blob[0])));
  }
  auto key = std::find_if(keys_.begin(), keys_.end(), [&](const Key& k) {
    return std::equal(k.id.begin(), k.id.end(), Bytes(blob) + 1);
  });
  if (key == keys_.end()) {
    return absl::InvalidArgumentError(
        "was encrypted with a key this server does not hold (another server's, a restarted "
        "server's without --reasoning-key-file, or a key rotated out of it)");
  }
  const std::string aad = Aad(absl::string_view(blob).substr(0, kHeaderBytes));
  const unsigned char* nonce = Bytes(blob) + kHeaderBytes;
  const unsigned char* in = nonce + kNonceBytes;
  const size_t size = blob.size() - kHeaderBytes - kNonceBytes - kTagBytes;
  std::string plaintext(size, '\0');
  std::string tag = blob.substr(blob.size() - kTagBytes);
  CipherContext ctx = NewContext();
  int len = 0;
  if (!ctx || EVP_DecryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, nullptr, nullptr) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_IVLEN, kNonceBytes, nullptr) != 1 ||
      EVP_DecryptInit_ex(ctx.get(), nullptr, nullptr, Bytes(key->bytes), nonce) != 1 ||
      EVP_DecryptUpdate(ctx.get(), nullptr, &len, Bytes(aad), static_cast<int>(aad.size())) != 1 ||
      EVP_DecryptUpdate(ctx.get(), Bytes(plaintext), &len, in, static_cast<int>(size)) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, kTagBytes, tag.data()) != 1 ||
      EVP_DecryptFinal_ex(ctx.get(), Bytes(plaintext) + len, &len) != 1) {
    return absl::InvalidArgumentError(
        "was altered: it does not authenticate under this server's key");
  }
  return plaintext;
}

}  // namespace flotilla::coordinator
