// Which of this host's network interfaces the worker's peer listeners may
// use: the one holding its advertised address. By default that is the
// address the host routes to the coordinator from (loopback when the
// coordinator is on loopback), so a worker never listens on interfaces its
// peers do not use.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace flotilla::worker {

struct AdvertisedInterface {
  std::string address;    // numeric, e.g. "127.0.0.1"
  std::string interface;  // e.g. "lo"
};

// The local address this host would send from to reach `target` (a gRPC
// target: host:port, [v6]:port, dns:///host:port or unix:PATH). Routing a
// UDP socket finds it; no packet is sent.
absl::StatusOr<std::string> LocalAddressToward(const std::string& target);

// The interface holding `address` (a numeric address or a name resolving to
// one of this host's addresses). NOT_FOUND names the host's addresses.
absl::StatusOr<AdvertisedInterface> InterfaceOf(const std::string& address);

// `advertise_address` when set, else the address toward `coordinator`,
// with its interface.
absl::StatusOr<AdvertisedInterface> ResolveAdvertisedInterface(const std::string& advertise_address,
                                                               const std::string& coordinator);

}  // namespace flotilla::worker
