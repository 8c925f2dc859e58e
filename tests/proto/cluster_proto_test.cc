#include <gtest/gtest.h>

#include "proto/admin.grpc.pb.h"
#include "proto/cluster.grpc.pb.h"

namespace flotilla {
namespace {

TEST(ClusterProto, SessionMessagesRoundTripWithTheirKind) {
  cluster::CoordinatorMessage msg;
  cluster::Assignment* a = msg.mutable_assignment();
  a->set_rank(3);
  a->set_world_size(4);
  a->mutable_comm()->set_backend(cluster::COMM_BACKEND_UCX);
  a->mutable_comm()->add_peer_addresses(std::string("\0\1\2", 3));
  cluster::LayerExpertMap* layer = a->mutable_expert_map()->add_layers();
  cluster::ExpertReplica* rep = layer->add_experts()->add_replicas();
  rep->set_rank(2);
  rep->set_slot(5);

  cluster::CoordinatorMessage back;
  ASSERT_TRUE(back.ParseFromString(msg.SerializeAsString()));
  ASSERT_EQ(back.kind_case(), cluster::CoordinatorMessage::kAssignment);
  EXPECT_EQ(back.assignment().comm().peer_addresses(0), std::string("\0\1\2", 3));
  EXPECT_EQ(back.assignment().expert_map().layers(0).experts(0).replicas(0).slot(), 5u);

  cluster::WorkerMessage w;
  cluster::SequenceUpdate* u = w.mutable_tokens()->add_updates();
  u->add_token_ids(42);
  u->set_finish_reason(common::LENGTH);
  cluster::WorkerMessage wb;
  ASSERT_TRUE(wb.ParseFromString(w.SerializeAsString()));
  EXPECT_EQ(wb.kind_case(), cluster::WorkerMessage::kTokens);
  EXPECT_EQ(wb.tokens().updates(0).finish_reason(), common::LENGTH);
}

TEST(ClusterProto, ServicesExposeTheirMethods) {
  EXPECT_STREQ(cluster::ClusterControl::service_full_name(), "flotilla.cluster.ClusterControl");
  EXPECT_STREQ(admin::Admin::service_full_name(), "flotilla.admin.Admin");
}

}  // namespace
}  // namespace flotilla
