// TLS for the coordinator's listeners and for its clients (CLI, SDK, workers),
// from PEM files. Empty paths mean plaintext. Files are read and checked here,
// so a wrong path or a key that does not match its certificate is a clear
// error at start, not a failed handshake later.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace grpc {
class ServerCredentials;
class ChannelCredentials;
}  // namespace grpc

namespace flotilla {

// A server's certificate chain and key; with `client_ca`, clients must present
// a certificate signed by it (mTLS).
struct TlsServerFiles {
  std::string cert;
  std::string key;
  std::string client_ca;
  bool enabled() const { return !cert.empty() || !key.empty(); }
};

// A client's trust anchor (`ca`, which turns TLS on) and, for mTLS, its own
// certificate and key.
struct TlsClientFiles {
  std::string ca;
  std::string cert;
  std::string key;
  bool enabled() const { return !ca.empty(); }
};

// The whole of a PEM file; errors name `flag` and the path.
absl::StatusOr<std::string> ReadPemFile(const std::string& path, const std::string& flag);

// Checks that cert and key come together, that both load and match, and that
// client_ca (if any) loads; INVALID_ARGUMENT naming the flag otherwise.
absl::Status CheckServerFiles(const TlsServerFiles& files);
// Checks that cert and key come together and need `ca`, and that they load.
absl::Status CheckClientFiles(const TlsClientFiles& files);

// Insecure credentials when `files` is not enabled.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsServerFiles& files);
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsClientFiles& files);

}  // namespace flotilla
