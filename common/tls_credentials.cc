#include "common/tls_credentials.h"

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status.h"

namespace flotilla {
namespace {

std::string OpenSslError() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "unknown OpenSSL error";
  char buf[256];
  ERR_error_string_n(code, buf, sizeof(buf));
  return buf;
}

absl::Status Invalid(const std::string& flag, const std::string& path, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": ", why));
}

// Loads `cert` (a chain) and `key` into a throw-away context and checks that
// they belong together.
absl::Status CheckKeyPair(const std::string& cert, const std::string& key,
                          const std::string& cert_flag, const std::string& key_flag) {
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(SSL_CTX_new(TLS_method()), SSL_CTX_free);
  if (!ctx) return absl::InternalError(absl::StrCat("TLS: ", OpenSslError()));
  if (SSL_CTX_use_certificate_chain_file(ctx.get(), cert.c_str()) != 1) {
    return Invalid(cert_flag, cert, absl::StrCat("not a PEM certificate: ", OpenSslError()));
  }
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_file(key.c_str(), "r"), BIO_free);
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> pkey(
      bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr) : nullptr, EVP_PKEY_free);
  if (!pkey) return Invalid(key_flag, key, absl::StrCat("not a PEM private key: ", OpenSslError()));
  if (SSL_CTX_use_PrivateKey(ctx.get(), pkey.get()) != 1 ||
      SSL_CTX_check_private_key(ctx.get()) != 1) {
    ERR_clear_error();
    return Invalid(key_flag, key, absl::StrCat("does not match the certificate ", cert));
  }
  return absl::OkStatus();
}

// At least one PEM certificate in `path`.
absl::Status CheckCaFile(const std::string& path, const std::string& flag) {
  FLOTILLA_ASSIGN_OR_RETURN(std::string pem, ReadPemFile(path, flag));
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), BIO_free);
  X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr);
  if (x == nullptr)
    return Invalid(flag, path, absl::StrCat("no PEM certificate: ", OpenSslError()));
  X509_free(x);
  return absl::OkStatus();
}

absl::Status CheckPair(const std::string& cert, const std::string& key,
                       const std::string& cert_flag, const std::string& key_flag) {
  if (cert.empty() != key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(cert_flag, " and ", key_flag, " go together: give both or neither"));
  }
  if (cert.empty()) return absl::OkStatus();
  FLOTILLA_RETURN_IF_ERROR(ReadPemFile(cert, cert_flag).status());
  FLOTILLA_RETURN_IF_ERROR(ReadPemFile(key, key_flag).status());
  return CheckKeyPair(cert, key, cert_flag, key_flag);
}

// The suites and versions of kTls12CipherList / kTls13CipherSuites, and the
// certificate chain and key.
absl::Status SetOwnCertificate(const TlsServerFiles& files, SSL_CTX* ctx) {
  if (SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) != 1 ||
      SSL_CTX_set_cipher_list(ctx, kTls12CipherList) != 1 ||
      SSL_CTX_set_ciphersuites(ctx, kTls13CipherSuites) != 1) {
    return absl::InternalError(absl::StrCat("TLS: cannot restrict the suites: ", OpenSslError()));
  }
  // The server picks among what the client offers (ours are all strong; the
  // order prefers AES-GCM, which has hardware support), never renegotiates.
  SSL_CTX_set_options(
      ctx, SSL_OP_CIPHER_SERVER_PREFERENCE | SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
  if (SSL_CTX_use_certificate_chain_file(ctx, files.cert.c_str()) != 1) {
    return Invalid("--tls-cert", files.cert,
                   absl::StrCat("not a PEM certificate: ", OpenSslError()));
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, files.key.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx) != 1) {
    ERR_clear_error();
    return Invalid("--tls-key", files.key,
                   absl::StrCat("not a PEM private key of the certificate ", files.cert));
  }
  return absl::OkStatus();
}

// Clients must present a certificate that `ca` signed; the handshake fails
// without one.
absl::Status RequireClientCertificate(const std::string& ca, SSL_CTX* ctx) {
  if (SSL_CTX_load_verify_locations(ctx, ca.c_str(), nullptr) != 1) {
    return Invalid("--tls-client-ca", ca, absl::StrCat("not a PEM CA: ", OpenSslError()));
  }
  // Named in the certificate request, so a client holding several picks the
  // right one.
  STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(ca.c_str());
  if (names == nullptr) {
    return Invalid("--tls-client-ca", ca, absl::StrCat("no CA name: ", OpenSslError()));
  }
  SSL_CTX_set_client_CA_list(ctx, names);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  // A verifying server must name its sessions, or resuming one fails the
  // handshake.
  static constexpr unsigned char kSessionContext[] = "flotilla-https";
  SSL_CTX_set_session_id_context(ctx, kSessionContext, sizeof(kSessionContext) - 1);
  return absl::OkStatus();
}

}  // namespace

absl::Status ConfigureServerContext(const TlsServerFiles& files, SSL_CTX* ctx) {
  FLOTILLA_RETURN_IF_ERROR(CheckServerFiles(files));
  if (!files.enabled()) {
    return absl::InvalidArgumentError("TLS needs --tls-cert and --tls-key");
  }
  FLOTILLA_RETURN_IF_ERROR(SetOwnCertificate(files, ctx));
  if (!files.client_ca.empty())
    FLOTILLA_RETURN_IF_ERROR(RequireClientCertificate(files.client_ca, ctx));
  return absl::OkStatus();
}

absl::Status CheckGrpcCipherSuites(const char* grpc_ssl_cipher_suites) {
  if (grpc_ssl_cipher_suites == nullptr || *grpc_ssl_cipher_suites == '\0') {
    return absl::OkStatus();
  }
  const std::string ours = absl::StrCat(kTls12CipherList, ":", kTls13CipherSuites);
  const std::vector<absl::string_view> allowed = absl::StrSplit(ours, ':');
  for (absl::string_view suite : absl::StrSplit(grpc_ssl_cipher_suites, ':', absl::SkipEmpty())) {
    if (std::find(allowed.begin(), allowed.end(), suite) == allowed.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("GRPC_SSL_CIPHER_SUITES names ", suite,
                       ": the coordinator serves TLS 1.3 and TLS 1.2 ECDHE with AES-GCM or "
                       "ChaCha20-Poly1305 only (unset it, or name some of ",
                       kTls12CipherList, ":", kTls13CipherSuites, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadPemFile(const std::string& path, const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Invalid(flag, path, "cannot read the file");
  std::ostringstream text;
  text << in.rdbuf();
  std::string pem = text.str();
  if (pem.find("-----BEGIN ") == std::string::npos) return Invalid(flag, path, "not a PEM file");
  return pem;
}

absl::Status CheckServerFiles(const TlsServerFiles& files) {
  if (!files.enabled()) {
    if (!files.client_ca.empty()) {
      return absl::InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key");
    }
    return absl::OkStatus();
  }
  FLOTILLA_RETURN_IF_ERROR(CheckPair(files.cert, files.key, "--tls-cert", "--tls-key"));
  if (!files.client_ca.empty())
    FLOTILLA_RETURN_IF_ERROR(CheckCaFile(files.client_ca, "--tls-client-ca"));
  return absl::OkStatus();
}

absl::Status CheckClientFiles(const TlsClientFiles& files) {
  if (!files.enabled()) {
    if (!files.cert.empty() || !files.key.empty()) {
      return absl::InvalidArgumentError(
          "--tls-cert and --tls-key (a client certificate) need --tls-ca");
    }
    return absl::OkStatus();
  }
  FLOTILLA_RETURN_IF_ERROR(CheckCaFile(files.ca, "--tls-ca"));
  return CheckPair(files.cert, files.key, "--tls-cert", "--tls-key");
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsServerFiles& files) {
  FLOTILLA_RETURN_IF_ERROR(CheckServerFiles(files));
  if (!files.enabled()) return grpc::InsecureServerCredentials();
  // gRPC's own knob, not ours: read where gRPC reads it.
  FLOTILLA_RETURN_IF_ERROR(CheckGrpcCipherSuites(std::getenv("GRPC_SSL_CIPHER_SUITES")));
  grpc::SslServerCredentialsOptions options;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  FLOTILLA_ASSIGN_OR_RETURN(pair.cert_chain, ReadPemFile(files.cert, "--tls-cert"));
  FLOTILLA_ASSIGN_OR_RETURN(pair.private_key, ReadPemFile(files.key, "--tls-key"));
  options.pem_key_cert_pairs.push_back(std::move(pair));
  if (!files.client_ca.empty()) {
    FLOTILLA_ASSIGN_OR_RETURN(options.pem_root_certs,
                              ReadPemFile(files.client_ca, "--tls-client-ca"));
    options.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsClientFiles& files) {
  FLOTILLA_RETURN_IF_ERROR(CheckClientFiles(files));
  if (!files.enabled()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  FLOTILLA_ASSIGN_OR_RETURN(options.pem_root_certs, ReadPemFile(files.ca, "--tls-ca"));
  if (!files.cert.empty()) {
    FLOTILLA_ASSIGN_OR_RETURN(options.pem_cert_chain, ReadPemFile(files.cert, "--tls-cert"));
    FLOTILLA_ASSIGN_OR_RETURN(options.pem_private_key, ReadPemFile(files.key, "--tls-key"));
  }
  return grpc::SslCredentials(options);
}

}  // namespace flotilla
