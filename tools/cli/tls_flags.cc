#include "tools/cli/tls_flags.h"

namespace flotilla::cli {

void AddClientTlsFlags(CLI::App* cmd, TlsClientFiles* tls) {
  cmd->add_option("--tls-ca", tls->ca, "PEM CA that signed the coordinator's certificate: use TLS")
      ->envname("FLOTILLA_TLS_CA");
  cmd->add_option("--tls-cert", tls->cert,
                  "PEM client certificate, where the coordinator requires one (with --tls-key)")
      ->envname("FLOTILLA_TLS_CERT");
  cmd->add_option("--tls-key", tls->key, "PEM private key of --tls-cert")
      ->envname("FLOTILLA_TLS_KEY");
}

}  // namespace flotilla::cli
