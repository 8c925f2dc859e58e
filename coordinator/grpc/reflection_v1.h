// gRPC server reflection v1 (grpc.reflection.v1.ServerReflection), next to
// Debian's v1alpha plugin: tools that ask for v1 first (grpcurl, grpcui,
// Postman) get the same answers. Descriptors come from the process's
// generated pool, as v1alpha's do; the service list is the one the
// coordinator registered (given at construction).
#pragma once

#include <set>
#include <string>
#include <vector>

#include "proto/grpc_reflection_v1.grpc.pb.h"

namespace flotilla::coordinator {

class ReflectionV1Service final
    : public grpc::reflection::v1::ServerReflection::CallbackService {
 public:
  // `services`: the full names of the services the server registered.
  explicit ReflectionV1Service(std::vector<std::string> services);

  grpc::ServerBidiReactor<grpc::reflection::v1::ServerReflectionRequest,
                          grpc::reflection::v1::ServerReflectionResponse>*
  ServerReflectionInfo(grpc::CallbackServerContext* context) override;

  // The answer to one request. `sent`: the files this stream already sent
  // (a file's imports are sent once per stream, as v1alpha does).
  grpc::reflection::v1::ServerReflectionResponse Answer(
      const grpc::reflection::v1::ServerReflectionRequest& request,
      std::set<std::string>* sent) const;

 private:
  const std::vector<std::string> services_;
};

}  // namespace flotilla::coordinator
