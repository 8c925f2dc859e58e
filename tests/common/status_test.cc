#include <gtest/gtest.h>

#include "common/grpc_status.h"
#include "common/status.h"

namespace flotilla {
namespace {

absl::StatusOr<int> ParsePositive(int v) {
  if (v <= 0) return absl::InvalidArgumentError("not positive: " + std::to_string(v));
  return v;
}

absl::StatusOr<int> Doubled(int v) {
  FLOTILLA_ASSIGN_OR_RETURN(int x, ParsePositive(v));
  return 2 * x;
}

absl::Status Check(int v) {
  FLOTILLA_RETURN_IF_ERROR(ParsePositive(v).status());
  return absl::OkStatus();
}

TEST(StatusMacros, AssignOrReturnPassesValueAndError) {
  EXPECT_EQ(*Doubled(4), 8);
  absl::StatusOr<int> bad = Doubled(-1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "not positive: -1");
}

TEST(StatusMacros, ReturnIfError) {
  EXPECT_TRUE(Check(1).ok());
  EXPECT_EQ(Check(0).code(), absl::StatusCode::kInvalidArgument);
}

TEST(GrpcStatus, RoundTripKeepsCodeAndMessage) {
  for (auto code : {absl::StatusCode::kUnavailable, absl::StatusCode::kResourceExhausted,
                    absl::StatusCode::kInvalidArgument, absl::StatusCode::kDeadlineExceeded}) {
    absl::Status s(code, "worker 3 is gone");
    grpc::Status g = ToGrpcStatus(s);
    EXPECT_EQ(static_cast<int>(g.error_code()), static_cast<int>(code));
    EXPECT_EQ(g.error_message(), "worker 3 is gone");
    EXPECT_EQ(FromGrpcStatus(g), s);
  }
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
}

}  // namespace
}  // namespace flotilla
