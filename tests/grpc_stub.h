// A client stub over a plaintext channel, as the end-to-end tests make them
// to reach a local cluster's gRPC services.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>

namespace flotilla::testing_util {

// A stub of gRPC service `Service` (v1::Flotilla, admin::Admin, ...) on an
// insecure channel to `address`.
template <typename Service>
auto PlainStub(const std::string& address) {
  return Service::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

}  // namespace flotilla::testing_util
