#include "coordinator/grpc_auth.h"

namespace flotilla::coordinator {

absl::StatusOr<Caller> AuthenticateCall(const Authenticator* auth,
                                        const grpc::CallbackServerContext* context) {
  if (auth == nullptr || auth->open()) return Caller{};
  const auto& metadata = context->client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return auth->Authenticate("");
  return auth->Authenticate(absl::string_view(it->second.data(), it->second.size()));
}

absl::StatusOr<Caller> AuthenticateAdminCall(const Authenticator* auth,
                                             const grpc::CallbackServerContext* context) {
  absl::StatusOr<Caller> caller = AuthenticateCall(auth, context);
  if (!caller.ok()) return caller;
  if (auth != nullptr) {
    absl::Status allowed = auth->AuthorizeAdmin(*caller);
    if (!allowed.ok()) return allowed;
  }
  return caller;
}

}  // namespace flotilla::coordinator
