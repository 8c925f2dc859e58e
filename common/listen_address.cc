#include "common/listen_address.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace flotilla {
namespace {

absl::Status Malformed(absl::string_view text, absl::string_view flag, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat(flag, " '", text, "' is not HOST:PORT (", why, ")"));
}

}  // namespace

std::string ListenAddress::ToString() const {
  return ipv6 ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);
}

absl::StatusOr<ListenAddress> ParseListenAddress(absl::string_view text, absl::string_view flag) {
  const size_t colon = text.rfind(':');
  if (colon == absl::string_view::npos) return Malformed(text, flag, "no port");
  ListenAddress out;
  absl::string_view host = text.substr(0, colon);
  const absl::string_view port = text.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
    out.ipv6 = true;
  } else if (host.find(':') != absl::string_view::npos) {
    return Malformed(text, flag, "write an IPv6 host in brackets: [::1]:PORT");
  }
  if (host.empty()) return Malformed(text, flag, "no host; use 0.0.0.0 for every interface");
  if (port.empty() || port.size() > 5) {
    return Malformed(text, flag, "the port must be a number in 0-65535");
  }
  int value = 0;
  for (char c : port) {
    if (c < '0' || c > '9') return Malformed(text, flag, "the port must be a number in 0-65535");
    value = value * 10 + (c - '0');
  }
  if (value > 65535) return Malformed(text, flag, "the port must be a number in 0-65535");
  out.host = std::string(host);
  out.port = value;
  return out;
}

void SetListenSocketOptions(int fd) {
  int yes = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
}

absl::Status CheckPortFree(const ListenAddress& address, absl::string_view flag) {
  if (address.port == 0) return absl::OkStatus();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(address.port);
  if (int rc = getaddrinfo(address.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", address.ToString(), ": host '",
                                                   address.host, "': ", gai_strerror(rc)));
  }
  absl::Status status = absl::OkStatus();
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    SetListenSocketOptions(fd);
    // listen() too: with SO_REUSEADDR a bind alone can succeed beside a
    // socket that is not listening yet.
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 1) != 0) {
      const int err = errno;
      status = absl::UnavailableError(absl::StrCat(
          flag, " ", address.ToString(), ": cannot listen on port ", address.port, ": ",
          err == EADDRINUSE ? "address already in use (another process listens there)"
                            : std::strerror(err)));
    }
    close(fd);
    if (!status.ok()) break;
  }
  freeaddrinfo(found);
  return status;
}

}  // namespace flotilla
