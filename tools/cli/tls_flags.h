// The TLS flags every client command takes (chat, generate, bench serve).
#pragma once

#include <CLI/CLI.hpp>

#include "common/tls_credentials.h"

namespace flotilla::cli {

// --tls-ca (FLOTILLA_TLS_CA) turns TLS on and verifies the coordinator with
// that CA; --tls-cert/--tls-key (FLOTILLA_TLS_CERT/KEY) are the client
// certificate where the coordinator requires one (--tls-client-ca).
void AddClientTlsFlags(CLI::App* cmd, TlsClientFiles* tls);

}  // namespace flotilla::cli
