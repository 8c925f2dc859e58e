// The cluster's state as an operator reads it: admin GetStatus on the
// coordinator, over a plaintext channel, for tests that poll a local cluster.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>

#include "proto/admin.grpc.pb.h"
#include "tests/grpc_stub.h"

namespace flotilla::testing_util {

// The status of the coordinator at `address`; an empty status (no state, no
// instances) when the call fails, so a poll simply tries again.
inline admin::ClusterStatus ClusterStatusAt(const std::string& address) {
  auto stub = PlainStub<admin::Admin>(address);
  grpc::ClientContext ctx;
  admin::ClusterStatus status;
  (void)stub->GetStatus(&ctx, admin::GetStatusRequest(), &status);
  return status;
}

}  // namespace flotilla::testing_util
