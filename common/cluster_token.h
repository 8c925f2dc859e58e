// The cluster token: a shared secret by which a worker proves that it belongs
// to a coordinator's cluster. Workers send it in the metadata of their
// Session call (not in a message, so it stays out of message logs); the
// coordinator refuses a Session without it before any Hello is read.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace flotilla {

// gRPC metadata key of the token on ClusterControl.Session.
inline constexpr char kClusterTokenMetadataKey[] = "x-flotilla-cluster-token";

// Reads a token file: its first line without surrounding whitespace.
// INVALID_ARGUMENT for an empty token or one over 4 KiB; NOT_FOUND when the
// file cannot be read.
absl::StatusOr<std::string> ReadClusterTokenFile(const std::string& path);

// A fresh token: 32 bytes from /dev/urandom, as 64 hex digits.
absl::StatusOr<std::string> NewClusterToken();

// Creates `path` (which must not exist) readable and writable only by its
// owner (0600) and writes `token` to it.
absl::Status WriteClusterTokenFile(const std::string& path, const std::string& token);

// Whether `presented` equals `expected` (ConstantTimeEquals); an empty
// `expected` token equals nothing.
bool TokensEqual(std::string_view presented, std::string_view expected);

}  // namespace flotilla
