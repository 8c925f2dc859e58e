#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include "proto/common.pb.h"

namespace flotilla {
namespace {

TEST(CommonProto, DeviceInfoBinaryAndJsonRoundTrip) {
  common::DeviceInfo d;
  d.set_kind(common::DeviceInfo::CUDA);
  d.set_index(1);
  d.set_name("NVIDIA H200");
  d.set_memory_bytes(150754820096ull);
  d.set_compute_capability(90);

  common::DeviceInfo back;
  ASSERT_TRUE(back.ParseFromString(d.SerializeAsString()));
  EXPECT_EQ(back.name(), "NVIDIA H200");
  EXPECT_EQ(back.memory_bytes(), 150754820096ull);

  std::string json;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(d, &json).ok());
  EXPECT_NE(json.find("\"kind\":\"CUDA\""), std::string::npos) << json;
  common::DeviceInfo parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &parsed).ok());
  EXPECT_EQ(parsed.compute_capability(), 90);
}

TEST(CommonProto, RejectsMalformedJson) {
  common::BuildInfo b;
  EXPECT_FALSE(google::protobuf::util::JsonStringToMessage("{\"cuda\": \"maybe\"}", &b).ok());
}

}  // namespace
}  // namespace flotilla
