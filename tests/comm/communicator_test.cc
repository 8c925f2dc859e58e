#include "comm/communicator.h"

#include <gtest/gtest.h>

namespace flotilla::comm {
namespace {

TEST(CommunicatorTest, DataTypes) {
  EXPECT_EQ(DataTypeSize(DataType::kF32), 4u);
  EXPECT_EQ(DataTypeSize(DataType::kBf16), 2u);
  EXPECT_EQ(DataTypeName(DataType::kBf16), "bf16");
}

TEST(CommunicatorTest, PackedOffsets) {
  EXPECT_EQ(PackedOffsets(std::vector<size_t>{3, 0, 5, 1}), (std::vector<size_t>{0, 3, 3, 8}));
  EXPECT_TRUE(PackedOffsets(std::vector<size_t>{}).empty());
}

TEST(CommunicatorTest, ValidateAllToAllVNamesTheWrongList) {
  std::vector<size_t> two = {0, 0}, three = {0, 0, 0};
  EXPECT_TRUE(ValidateAllToAllV(2, two, two, two, two).ok());
  absl::Status st = ValidateAllToAllV(2, two, two, three, two);
  EXPECT_TRUE(absl::IsInvalidArgument(st));
  EXPECT_NE(std::string(st.message()).find("recv_counts=3"), std::string::npos) << st;
}

}  // namespace
}  // namespace flotilla::comm
