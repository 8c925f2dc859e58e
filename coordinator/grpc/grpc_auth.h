// The gRPC edge of Authenticator: the key from a call's `authorization`
// metadata, and a stream that only reports a refusal.
#pragma once

#include <google/protobuf/message.h>
#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "coordinator/auth.h"

namespace flotilla::coordinator {

// The caller of `context` ("authorization: Bearer KEY" metadata). A null
// `auth` lets everyone in. Then `request` itself: INVALID_ARGUMENT when its
// bytes did not parse (proto/request_decoding.h).
absl::StatusOr<Caller> AuthenticateCall(const Authenticator* auth,
                                        const grpc::CallbackServerContext* context,
                                        const google::protobuf::Message& request);

// Mutating admin calls: the caller must hold an admin key.
absl::StatusOr<Caller> AuthenticateAdminCall(const Authenticator* auth,
                                             const grpc::CallbackServerContext* context,
                                             const google::protobuf::Message& request);

// A server-streaming call refused before it began: finishes with `status`.
template <typename Response>
class RefusedStream final : public grpc::ServerWriteReactor<Response> {
 public:
  explicit RefusedStream(grpc::Status status) { this->Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

}  // namespace flotilla::coordinator
