// Listening addresses ("HOST:PORT", "[V6]:PORT") checked before any server
// binds: gRPC would take port 99999 modulo 65536 and cpp-httplib would share a
// taken port through SO_REUSEPORT, so both get an address that is already
// known to be well formed and free.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace flotilla {

struct ListenAddress {
  std::string host;   // without brackets ("::1", "127.0.0.1", "localhost")
  int port = 0;       // 0-65535; 0 = any free port
  bool ipv6 = false;  // written "[host]:port"
  // "host:port", brackets around an IPv6 host.
  std::string ToString() const;
};

// Parses "HOST:PORT" or "[V6]:PORT". INVALID_ARGUMENT naming `flag` and the
// text for a missing host or port, a port that is not a decimal number in
// 0-65535, or an IPv6 host without brackets.
absl::StatusOr<ListenAddress> ParseListenAddress(absl::string_view text, absl::string_view flag);

// Binds a throw-away socket to `address` the way the servers do (SO_REUSEADDR,
// never SO_REUSEPORT) and closes it: UNAVAILABLE naming the address when the
// port is taken ("address already in use") or cannot be bound, INVALID_ARGUMENT
// when the host does not resolve. Port 0 is always free. Servers still check
// their own bind (another process may take the port in between); this only
// gives the clear, early message.
absl::Status CheckPortFree(const ListenAddress& address, absl::string_view flag);

// The SO_REUSEADDR-only socket options every listener uses (cpp-httplib sets
// SO_REUSEPORT by default, which lets a second server share a taken port).
void SetListenSocketOptions(int fd);

}  // namespace flotilla
