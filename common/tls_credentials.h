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

typedef struct ssl_ctx_st SSL_CTX;  // OpenSSL's, as <openssl/types.h> declares it

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

// What every TLS listener offers: TLS 1.3 with its AEAD suites, and TLS 1.2
// with ECDHE key exchange and an AEAD cipher only (AES-GCM, ChaCha20-Poly1305).
// No CBC suite (LUCKY13 and kin), no static-RSA key exchange (no forward
// secrecy, ROBOT), nothing older than TLS 1.2.
inline constexpr char kTls12CipherList[] =
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
    "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"
    "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305";
inline constexpr char kTls13CipherSuites[] =
    "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256";

// Sets up `ctx`, a server context, from `files` (enabled): the certificate
// chain and key, the versions and suites above, and with client_ca a client
// certificate signed by that CA, required at the handshake. On error
// (INVALID_ARGUMENT naming the flag) `ctx` is half set up: drop it.
absl::Status ConfigureServerContext(const TlsServerFiles& files, SSL_CTX* ctx);

// gRPC takes its suites from the GRPC_SSL_CIPHER_SUITES environment variable
// (its default is AEAD only); INVALID_ARGUMENT when that names a suite outside
// kTls12CipherList and kTls13CipherSuites, so the gRPC port cannot be
// weakened by accident.
absl::Status CheckGrpcCipherSuites(const char* grpc_ssl_cipher_suites);

// Insecure credentials when `files` is not enabled; otherwise checks the
// environment's GRPC_SSL_CIPHER_SUITES (CheckGrpcCipherSuites) too.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsServerFiles& files);
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsClientFiles& files);

}  // namespace flotilla
