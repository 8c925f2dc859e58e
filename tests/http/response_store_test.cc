// The store behind previous_response_id and GET/DELETE /v1/responses/{id}:
// entries belong to their key; bounded in entries, age and the memory the
// entries hold (the oldest goes first), on a fake clock.
#include "coordinator/http/response_store.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "coordinator/http/openai_pipeline.h"

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

ResponseStore::Stored Entry(const std::string& text) {
  return ResponseStore::Stored{Json{{"id", "resp"}}, Items(text)};
}

TEST(ResponseStoreTest, KeepsAndReturnsItems) {
  FakeClock clock;
  auto store = ResponseStore::Create({}, clock.Fn());
  ASSERT_TRUE(store.ok());
  (*store)->Put("resp_a", "", Entry("a"));
  absl::StatusOr<ResponseStore::Stored> got = (*store)->Get("resp_a", "");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->items, Items("a"));
  EXPECT_EQ(got->response, (Json{{"id", "resp"}}));
  (*store)->Put("resp_a", "", Entry("b"));  // replaced, not doubled
  EXPECT_EQ((*store)->Get("resp_a", "")->items, Items("b"));
  EXPECT_EQ((*store)->size(), 1u);

  absl::StatusOr<ResponseStore::Stored> missing = (*store)->Get("resp_none", "");
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
  (*store)->Put("old", "", Entry("a"));
  clock.now += absl::Minutes(6);
  (*store)->Put("new", "", Entry("b"));
  clock.now += absl::Minutes(5);
  EXPECT_EQ((*store)->Get("old", "").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE((*store)->Get("new", "").ok());
  clock.now += absl::Minutes(6);
  EXPECT_FALSE((*store)->Get("new", "").ok());
  EXPECT_EQ((*store)->size(), 0u);
  EXPECT_EQ((*store)->bytes(), 0u);
}

TEST(ResponseStoreTest, OldestGoFirstPastTheEntryAndByteBounds) {
  FakeClock clock;
  ResponseStoreOptions options;
  options.max_entries = 2;
  auto store = ResponseStore::Create(options, clock.Fn());
  ASSERT_TRUE(store.ok());
  for (const char* id : {"r1", "r2", "r3"}) (*store)->Put(id, "", Entry(id));
  EXPECT_FALSE((*store)->Get("r1", "").ok());
  EXPECT_TRUE((*store)->Get("r2", "").ok());
  EXPECT_TRUE((*store)->Get("r3", "").ok());

  options.max_entries = 100;
  options.max_bytes = 3000;
  store = ResponseStore::Create(options, clock.Fn());
  ASSERT_TRUE(store.ok());
  (*store)->Put("big", "", Entry(std::string(4000, 'x')));  // larger than the whole store: not kept
  EXPECT_FALSE((*store)->Get("big", "").ok());
  for (int i = 0; i < 10; ++i) (*store)->Put(absl::StrCat("r", i), "", Entry(std::string(500, 'y')));
  EXPECT_LE((*store)->bytes(), 3000u);
  EXPECT_TRUE((*store)->Get("r9", "").ok());
  EXPECT_FALSE((*store)->Get("r0", "").ok());
}

TEST(ResponseStoreTest, AnEntryIsItsOwnersOnly) {
  auto store = ResponseStore::Create({});
  ASSERT_TRUE(store.ok());
  (*store)->Put("resp_a", "client:0", Entry("a"));
  EXPECT_TRUE((*store)->Get("resp_a", "client:0").ok());
  for (const std::string other : {"client:1", "admin:0", ""}) {
    absl::StatusOr<ResponseStore::Stored> got = (*store)->Get("resp_a", other);
    ASSERT_FALSE(got.ok()) << other;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
    // The answer for an id that exists under another key is the one for an id
    // that was never stored.
    (*store)->Put("resp_b", "client:9", Entry("b"));
    std::string never = std::string((*store)->Get("resp_x", other).status().message());
    never.replace(never.find("resp_x"), 6, "resp_a");
    EXPECT_EQ(got.status().message(), never);
    EXPECT_EQ((*store)->Delete("resp_a", other).code(), absl::StatusCode::kNotFound);
  }
  EXPECT_TRUE((*store)->Delete("resp_a", "client:0").ok());
  EXPECT_FALSE((*store)->Get("resp_a", "client:0").ok());
  EXPECT_EQ((*store)->size(), 1u);  // resp_b
}

// A background response is stored running, with how to cancel it; its end
// replaces the entry, and with it the way to cancel.
TEST(ResponseStoreTest, ARunningEntryKeepsItsCancelUntilReplaced) {
  auto store = ResponseStore::Create({});
  ASSERT_TRUE(store.ok());
  int cancels = 0;
  ResponseStore::Stored running = Entry("a");
  running.cancel = [&cancels] {
    ++cancels;
    return Json{{"status", "cancelled"}};
  };
  (*store)->Put("resp_a", "client:0", running);
  absl::StatusOr<ResponseStore::Stored> got = (*store)->Get("resp_a", "client:0");
  ASSERT_TRUE(got.ok());
  ASSERT_TRUE(got->cancel);
  EXPECT_EQ(got->cancel()["status"], "cancelled");
  EXPECT_EQ(cancels, 1);
  EXPECT_FALSE((*store)->Get("resp_a", "client:1").ok());
  (*store)->Put("resp_a", "client:0", Entry("a"));
  got = (*store)->Get("resp_a", "client:0");
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->cancel);
}

// The bound counts what the parsed entries hold, not their text: many short
// strings cost far more than their bytes.
TEST(ResponseStoreTest, TheByteBoundCountsTheMemoryHeld) {
  Json many = Json::array();
  for (int i = 0; i < 1000; ++i) many.push_back(Json{{"k", "v"}});
  const size_t text = many.dump().size();
  EXPECT_GT(JsonMemoryBytes(many), 4 * text);
  const std::string long_text(100000, 'z');
  EXPECT_GE(JsonMemoryBytes(Json(long_text)), long_text.size());
  EXPECT_LT(JsonMemoryBytes(Json(long_text)), long_text.size() + 200);

  ResponseStoreOptions options;
  options.max_bytes = 2 * text;  // would hold the entry by its text; not by its memory
  auto store = ResponseStore::Create(options);
  ASSERT_TRUE(store.ok());
  (*store)->Put("r", "", ResponseStore::Stored{Json::object(), many});
  EXPECT_EQ((*store)->size(), 0u);
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
