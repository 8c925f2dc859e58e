#include "coordinator/cache_domain.h"

#include <openssl/evp.h>

#include "absl/strings/str_cat.h"
#include "coordinator/prepared_request.h"

namespace flotilla::coordinator {
namespace {

uint64_t Digest(const std::string& name) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (EVP_Digest(name.data(), name.size(), md, &size, EVP_sha256(), nullptr) != 1 || size < 8) {
    return 1;  // unreachable with a working libcrypto; still not the shared domain
  }
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = v << 8 | md[i];
  return v == 0 ? 1 : v;
}

}  // namespace

absl::Status CheckCacheSalt(const std::string& cache_salt) {
  if (cache_salt.size() <= kMaxCacheSaltBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("cache_salt: must be at most ", kMaxCacheSaltBytes,
                                                 " bytes, not ", cache_salt.size()));
}

uint64_t CacheDomain(const std::string& cache_salt, const std::string& key_id,
                     const CacheDomainPolicy& policy) {
  // The prefixes keep a salt from ever naming a key's domain.
  if (!cache_salt.empty()) return Digest(absl::StrCat("salt:", cache_salt));
  if (policy.shared || key_id.empty()) return 0;
  return Digest(absl::StrCat("key:", key_id));
}

}  // namespace flotilla::coordinator
