#include "coordinator/grpc/grpc_auth.h"

#include "proto/request_decoding.h"

namespace flotilla::coordinator {
namespace {

absl::StatusOr<Caller> CallerOf(const Authenticator* auth,
                                const grpc::CallbackServerContext* context) {
  if (auth == nullptr || auth->open()) return Caller{};
  const auto& metadata = context->client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return auth->Authenticate("");
  return auth->Authenticate(absl::string_view(it->second.data(), it->second.size()));
}

}  // namespace

absl::StatusOr<Caller> AuthenticateCall(const Authenticator* auth,
                                        const grpc::CallbackServerContext* context,
                                        const google::protobuf::Message& request) {
  absl::StatusOr<Caller> caller = CallerOf(auth, context);
  if (!caller.ok()) return caller;
  if (absl::Status decoded = RequestDecodeStatus(request); !decoded.ok()) return decoded;
  return caller;
}

absl::StatusOr<Caller> AuthenticateAdminCall(const Authenticator* auth,
                                             const grpc::CallbackServerContext* context,
                                             const google::protobuf::Message& request) {
  absl::StatusOr<Caller> caller = CallerOf(auth, context);
  if (!caller.ok()) return caller;
  if (auth != nullptr) {
    absl::Status allowed = auth->AuthorizeAdmin(*caller);
    if (!allowed.ok()) return allowed;
  }
  if (absl::Status decoded = RequestDecodeStatus(request); !decoded.ok()) return decoded;
  return caller;
}

}  // namespace flotilla::coordinator
