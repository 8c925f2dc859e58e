// The store behind previous_response_id: bounded in entries, age and bytes
// (the oldest goes first), on a fake clock.
#include "coordinator/response_store.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "coordinator/openai_pipeline.h"

namespace flotilla::coordinator {
namespace {

struct FakeClock {
  absl::Time now = absl::FromUnixSeconds(1000);
  std::function<absl::Time()> Fn() {
    return [this] { return now; };
  }
};

Json Items(const std::string& text) {
  return Json::array({Json{{"type", "message"}, {"content", text}}});
}

TEST(ResponseStoreTest, KeepsAndReturnsItems) {
  FakeClock clock;
  auto store = ResponseStore::Create({}, clock.Fn());
  ASSERT_TRUE(store.ok());
  (*store)->Put("resp_a", Items("a"));
  absl::StatusOr<Json> got = (*store)->Get("resp_a");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, Items("a"));
  (*store)->Put("resp_a", Items("b"));  // replaced, not doubled
  EXPECT_EQ(*(*store)->Get("resp_a"), Items("b"));
  EXPECT_EQ((*store)->size(), 1u);

  absl::StatusOr<Json> missing = (*store)->Get("resp_none");
  ASSERT_FALSE(missing.ok());
  const ApiError e = ErrorFromStatus(missing.status());
  EXPECT_EQ(e.http_status, 404);
  EXPECT_EQ(e.param, "previous_response_id");
  EXPECT_NE(e.message.find("resp_none"), std::string::npos);
}

TEST(ResponseStoreTest, EntriesExpire) {
  FakeClock clock;
  ResponseStoreOptions options;
  options.max_age = absl::Minutes(10);
  auto store = ResponseStore::Create(options, clock.Fn());
  ASSERT_TRUE(store.ok());
  (*store)->Put("old", Items("a"));
  clock.now += absl::Minutes(6);
  (*store)->Put("new", Items("b"));
  clock.now += absl::Minutes(5);
  EXPECT_EQ((*store)->Get("old").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE((*store)->Get("new").ok());
  clock.now += absl::Minutes(6);
  EXPECT_FALSE((*store)->Get("new").ok());
  EXPECT_EQ((*store)->size(), 0u);
  EXPECT_EQ((*store)->bytes(), 0u);
}

TEST(ResponseStoreTest, OldestGoFirstPastTheEntryAndByteBounds) {
  FakeClock clock;
  ResponseStoreOptions options;
  options.max_entries = 2;
  auto store = ResponseStore::Create(options, clock.Fn());
  ASSERT_TRUE(store.ok());
  for (const char* id : {"r1", "r2", "r3"}) (*store)->Put(id, Items(id));
  EXPECT_FALSE((*store)->Get("r1").ok());
  EXPECT_TRUE((*store)->Get("r2").ok());
  EXPECT_TRUE((*store)->Get("r3").ok());

  options.max_entries = 100;
  options.max_bytes = 300;
  store = ResponseStore::Create(options, clock.Fn());
  ASSERT_TRUE(store.ok());
  (*store)->Put("big", Items(std::string(400, 'x')));  // larger than the whole store: not kept
  EXPECT_FALSE((*store)->Get("big").ok());
  for (int i = 0; i < 10; ++i) (*store)->Put(absl::StrCat("r", i), Items(std::string(50, 'y')));
  EXPECT_LE((*store)->bytes(), 300u);
  EXPECT_TRUE((*store)->Get("r9").ok());
  EXPECT_FALSE((*store)->Get("r0").ok());
}

TEST(ResponseStoreTest, RefusesBoundsOfZero) {
  ResponseStoreOptions options;
  options.max_entries = 0;
  EXPECT_FALSE(ResponseStore::Create(options).ok());
  options = {};
  options.max_age = absl::ZeroDuration();
  EXPECT_FALSE(ResponseStore::Create(options).ok());
  options = {};
  options.max_bytes = 0;
  EXPECT_FALSE(ResponseStore::Create(options).ok());
}

}  // namespace
}  // namespace flotilla::coordinator
