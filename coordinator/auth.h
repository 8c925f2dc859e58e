// Who may call the coordinator: client API keys, admin keys, or (with no key
// file at all) anyone. The HTTP server and the gRPC services ask it about the
// bearer token each call carries; it knows nothing of either transport.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace flotilla::coordinator {

// The authenticated caller of one call.
struct Caller {
  enum class Role {
    kOpen,    // no key files: anyone may do anything (the behaviour without keys)
    kClient,  // a key of --api-key-file
    kAdmin,   // a key of --admin-key-file
  };
  Role role = Role::kOpen;
  // Names the key (not the key itself) for request ownership: "client:3",
  // "admin:0"; empty when open.
  std::string key_id;
};

class Authenticator {
 public:
  // Keys from the two files (ReadKeyFile's format); either path may be empty.
  // Both empty: an open authenticator. A key in both files is an admin key.
  static absl::StatusOr<std::unique_ptr<Authenticator>> Create(const std::string& api_key_file,
                                                               const std::string& admin_key_file);
  // Anyone is let in (no key file was given).
  static std::unique_ptr<Authenticator> Open();

  // Whether calls go without a key.
  bool open() const { return client_keys_.empty() && admin_keys_.empty(); }
  // Whether any admin key exists (else mutating admin calls are refused).
  bool has_admin_keys() const { return !admin_keys_.empty(); }

  // `authorization` is the Authorization header / metadata value,
  // "Bearer KEY" (scheme case-insensitive). UNAUTHENTICATED when it is
  // missing, malformed or names no known key; every known key is compared, in
  // time independent of where the keys differ.
  absl::StatusOr<Caller> Authenticate(absl::string_view authorization) const;
  // Mutating admin calls: OK for an admin key (or open); PERMISSION_DENIED
  // otherwise.
  absl::Status AuthorizeAdmin(const Caller& caller) const;

 private:
  Authenticator(std::vector<std::string> client_keys, std::vector<std::string> admin_keys)
      : client_keys_(std::move(client_keys)), admin_keys_(std::move(admin_keys)) {}
  std::vector<std::string> client_keys_;
  std::vector<std::string> admin_keys_;
};

}  // namespace flotilla::coordinator
