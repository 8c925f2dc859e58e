#include "worker/advertise_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <optional>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"

namespace flotilla::worker {
namespace {

std::string Numeric(const sockaddr* sa) {
  char host[NI_MAXHOST] = {};
  const socklen_t len = sa->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  if (getnameinfo(sa, len, host, sizeof(host), nullptr, 0, NI_NUMERICHOST) != 0) return "";
  return host;
}

bool SameAddress(const sockaddr* a, const sockaddr* b) {
  if (a->sa_family != b->sa_family) return false;
  if (a->sa_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in*>(b)->sin_addr.s_addr;
  }
  if (a->sa_family == AF_INET6) {
    return std::memcmp(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr,
                       &reinterpret_cast<const sockaddr_in6*>(b)->sin6_addr, sizeof(in6_addr)) == 0;
  }
  return false;
}

// Splits a gRPC target into host and port; a unix socket has no host.
absl::StatusOr<std::pair<std::string, std::string>> SplitTarget(std::string target) {
  if (absl::StartsWith(target, "dns:///")) target = target.substr(7);
  if (absl::StartsWith(target, "ipv4:") || absl::StartsWith(target, "ipv6:")) {
    target = target.substr(5);
  }
  const size_t colon = target.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == target.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("coordinator address '", target, "' is not host:port"));
  }
  std::string host = target.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return std::make_pair(host, target.substr(colon + 1));
}

}  // namespace

absl::StatusOr<std::string> LocalAddressToward(const std::string& target) {
  if (absl::StartsWith(target, "unix:")) return std::string("127.0.0.1");
  FLOTILLA_ASSIGN_OR_RETURN(auto host_port, SplitTarget(target));
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host_port.first.c_str(), host_port.second.c_str(), &hints, &found) != 0 ||
      found == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve the coordinator host '", host_port.first, "'"));
  }
  std::string local;
  for (addrinfo* a = found; a != nullptr && local.empty(); a = a->ai_next) {
    const int fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage mine{};
    socklen_t len = sizeof(mine);
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &len) == 0) {
      local = Numeric(reinterpret_cast<sockaddr*>(&mine));
    }
    close(fd);
  }
  freeaddrinfo(found);
  if (local.empty()) {
    return absl::UnavailableError(
        absl::StrCat("no local address routes to the coordinator at ", target));
  }
  return local;
}

absl::StatusOr<AdvertisedInterface> InterfaceOf(const std::string& address) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* wanted = nullptr;
  if (getaddrinfo(address.c_str(), nullptr, &hints, &wanted) != 0 || wanted == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve the address '", address, "'"));
  }
  ifaddrs* interfaces = nullptr;
  if (getifaddrs(&interfaces) != 0) {
    freeaddrinfo(wanted);
    return absl::InternalError("cannot list the network interfaces");
  }
  std::optional<AdvertisedInterface> match;
  std::vector<std::string> have;
  for (ifaddrs* i = interfaces; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr ||
        (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6)) {
      continue;
    }
    have.push_back(absl::StrCat(i->ifa_name, " ", Numeric(i->ifa_addr)));
    for (addrinfo* w = wanted; w != nullptr && !match; w = w->ai_next) {
      if (SameAddress(w->ai_addr, i->ifa_addr)) {
        match = AdvertisedInterface{Numeric(i->ifa_addr), i->ifa_name};
      }
    }
  }
  freeifaddrs(interfaces);
  freeaddrinfo(wanted);
  if (!match) {
    return absl::NotFoundError(absl::StrCat("no interface of this host has the address '", address,
                                            "' (it has: ", absl::StrJoin(have, ", "), ")"));
  }
  return *match;
}

absl::StatusOr<AdvertisedInterface> ResolveAdvertisedInterface(const std::string& advertise_address,
                                                               const std::string& coordinator) {
  if (!advertise_address.empty()) return InterfaceOf(advertise_address);
  FLOTILLA_ASSIGN_OR_RETURN(std::string local, LocalAddressToward(coordinator));
  return InterfaceOf(local);
}

}  // namespace flotilla::worker
