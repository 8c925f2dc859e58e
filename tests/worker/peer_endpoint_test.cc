// A worker joins its peers over the host communicator the Assignment names;
// any other (or a value this build does not know) is refused by name, and so
// is a group without its generation's peer secret.
#include "worker/peer_endpoint.h"

#include <gtest/gtest.h>

namespace flotilla::worker {
namespace {

TEST(PeerEndpoint, OnlyUcxIsJoinedAndOtherBackendsAreNamed) {
  const auto none = OpenPeerEndpoint(cluster::COMM_BACKEND_NONE, PeerOptions());
  ASSERT_FALSE(none.ok());
  const auto unknown = OpenPeerEndpoint(static_cast<cluster::CommBackend>(9), PeerOptions());
  ASSERT_FALSE(unknown.ok());
#if FLOTILLA_WITH_UCX
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(
      none.status().message().find("host communicator none; this worker joins peers over ucx"),
      std::string::npos)
      << none.status();
  EXPECT_NE(unknown.status().message().find("unknown (9)"), std::string::npos) << unknown.status();
#endif
}

#if FLOTILLA_WITH_UCX
TEST(PeerEndpoint, AGroupWithoutAPeerSecretIsNotJoined) {
  auto endpoint = OpenPeerEndpoint(cluster::COMM_BACKEND_UCX, PeerOptions());
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  cluster::StartComm start;
  start.mutable_comm()->set_backend(cluster::COMM_BACKEND_UCX);
  start.mutable_comm()->add_peer_addresses((*endpoint)->Address());
  const auto joined = (*endpoint)->Join(0, start);
  ASSERT_FALSE(joined.ok());
  EXPECT_EQ(joined.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(joined.status().message().find("without a peer_secret"), std::string::npos)
      << joined.status();
}
#endif

}  // namespace
}  // namespace flotilla::worker
