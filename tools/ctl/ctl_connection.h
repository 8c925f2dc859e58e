// flotillactl's connection to the coordinator's admin API: the channel
// (plaintext, or TLS with --tls-ca and an optional client certificate) and
// each call's metadata (the admin key as `authorization: Bearer KEY`).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/tls_credentials.h"
#include "grpcpp/grpcpp.h"
#include "proto/admin.grpc.pb.h"

namespace flotilla::ctl {

struct ConnectionOptions {
  std::string coordinator = "127.0.0.1:50051";
  std::string api_key;
  TlsClientFiles tls;
  double timeout_s = 300;  // a rebalance waits for the ranks to load experts
};

class Connection {
 public:
  static absl::StatusOr<std::unique_ptr<Connection>> Create(const ConnectionOptions& options);
  admin::Admin::Stub& admin() { return *admin_; }
  // A context with the key and the deadline set, for one call.
  std::unique_ptr<grpc::ClientContext> Context() const;

 private:
  Connection(ConnectionOptions options, std::shared_ptr<grpc::Channel> channel);
  ConnectionOptions options_;
  std::unique_ptr<admin::Admin::Stub> admin_;
};

}  // namespace flotilla::ctl
