#include "coordinator/auth.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/constant_time.h"
#include "common/key_file.h"
#include "common/status.h"

namespace flotilla::coordinator {
namespace {

// The index of `key` in `keys`, or -1. Every key is compared to the end.
int FindKey(const std::vector<std::string>& keys, absl::string_view key) {
  int found = -1;
  for (size_t i = 0; i < keys.size(); ++i) {
    const bool equal = ConstantTimeEquals(std::string_view(key.data(), key.size()), keys[i]);
    found = equal && found < 0 ? static_cast<int>(i) : found;
  }
  return found;
}

// The keys of `file` (none when it is empty); an error names `flag`.
absl::StatusOr<std::vector<std::string>> KeysOf(const std::string& file, const char* flag) {
  if (file.empty()) return std::vector<std::string>();
  absl::StatusOr<std::vector<std::string>> keys = ReadKeyFile(file);
  if (!keys.ok()) {
    return absl::Status(keys.status().code(), absl::StrCat(flag, ": ", keys.status().message()));
  }
  return keys;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Create(
    const std::string& api_key_file, const std::string& admin_key_file) {
  FLOTILLA_ASSIGN_OR_RETURN(std::vector<std::string> client,
                            KeysOf(api_key_file, "--api-key-file"));
  FLOTILLA_ASSIGN_OR_RETURN(std::vector<std::string> admin,
                            KeysOf(admin_key_file, "--admin-key-file"));
  return std::unique_ptr<Authenticator>(new Authenticator(std::move(client), std::move(admin)));
}

std::unique_ptr<Authenticator> Authenticator::Open() {
  return std::unique_ptr<Authenticator>(new Authenticator({}, {}));
}

absl::StatusOr<Caller> Authenticator::Authenticate(absl::string_view authorization) const {
  if (open()) return Caller{};
  constexpr absl::string_view kScheme = "bearer ";
  if (authorization.empty()) {
    return absl::UnauthenticatedError(
        "an API key is required: send it as 'Authorization: Bearer KEY'");
  }
  if (authorization.size() <= kScheme.size() ||
      !absl::StartsWithIgnoreCase(authorization, kScheme)) {
    return absl::UnauthenticatedError("the Authorization value is not 'Bearer KEY'");
  }
  const absl::string_view key = absl::StripAsciiWhitespace(authorization.substr(kScheme.size()));
  const int admin = FindKey(admin_keys_, key);
  const int client = FindKey(client_keys_, key);
  if (admin >= 0) return Caller{Caller::Role::kAdmin, absl::StrCat("admin:", admin)};
  if (client >= 0) return Caller{Caller::Role::kClient, absl::StrCat("client:", client)};
  return absl::UnauthenticatedError("the API key is not valid");
}

absl::Status Authenticator::AuthorizeAdmin(const Caller& caller) const {
  if (caller.role == Caller::Role::kOpen || caller.role == Caller::Role::kAdmin) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(
      has_admin_keys() ? "this call changes the cluster: it needs an admin key"
                       : "this call changes the cluster: it needs an admin key, and this "
                         "coordinator has none (--admin-key-file)");
}

}  // namespace flotilla::coordinator
