#include "common/tls_credentials.h"

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
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

}  // namespace

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
