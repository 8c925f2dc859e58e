// Key files, the Authenticator's decisions and the request registry's ids
// and ownership (no processes).
#include "coordinator/auth.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <bitset>
#include <fstream>

#include "common/key_file.h"
#include "coordinator/request_registry.h"

namespace flotilla::coordinator {
namespace {

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name + "-" + std::to_string(getpid());
  std::ofstream(path) << text;
  return path;
}

TEST(KeyFile, SkipsCommentsAndBlankLinesAndTrims) {
  auto keys = ReadKeyFile(WriteFile("keys", "# clients\n\n  alpha \r\nbeta\n# gamma\n"));
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_EQ(*keys, (std::vector<std::string>{"alpha", "beta"}));
}

TEST(KeyFile, RefusesMissingEmptyAndSpacedKeys) {
  EXPECT_EQ(ReadKeyFile("/nonexistent/keys").status().code(), absl::StatusCode::kNotFound);
  auto empty = ReadKeyFile(WriteFile("empty", "# nothing\n\n"));
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(empty.status().message().find("holds no key"), std::string::npos);
  auto spaced = ReadKeyFile(WriteFile("spaced", "ok\ntwo words\n"));
  EXPECT_EQ(spaced.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(spaced.status().message().find(":2:"), std::string::npos) << spaced.status();
}

TEST(Authenticator, OpenWithoutKeyFiles) {
  auto auth = Authenticator::Create("", "");
  ASSERT_TRUE(auth.ok());
  EXPECT_TRUE((*auth)->open());
  auto caller = (*auth)->Authenticate("");
  ASSERT_TRUE(caller.ok());
  EXPECT_TRUE((*auth)->AuthorizeAdmin(*caller).ok());
}

TEST(Authenticator, ClientAndAdminKeys) {
  auto auth = Authenticator::Create(WriteFile("client", "c1\nc2\n"), WriteFile("admin", "a1\n"));
  ASSERT_TRUE(auth.ok()) << auth.status();
  const Authenticator& a = **auth;
  EXPECT_EQ(a.Authenticate("").status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(a.Authenticate("Bearer").status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(a.Authenticate("Basic c1").status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(a.Authenticate("Bearer c3").status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(a.Authenticate("Bearer c").status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(a.Authenticate("Bearer c11").status().code(), absl::StatusCode::kUnauthenticated);
  auto c2 = a.Authenticate("bearer c2");
  ASSERT_TRUE(c2.ok());
  EXPECT_EQ(c2->role, Caller::Role::kClient);
  EXPECT_EQ(c2->key_id, "client:1");
  EXPECT_EQ(a.AuthorizeAdmin(*c2).code(), absl::StatusCode::kPermissionDenied);
  auto admin = a.Authenticate("Bearer a1");
  ASSERT_TRUE(admin.ok());
  EXPECT_EQ(admin->role, Caller::Role::kAdmin);
  EXPECT_TRUE(a.AuthorizeAdmin(*admin).ok());
}

TEST(Authenticator, NoAdminKeysRefusesMutations) {
  auto auth = Authenticator::Create(WriteFile("only-client", "c1\n"), "");
  ASSERT_TRUE(auth.ok());
  EXPECT_FALSE((*auth)->open());
  auto c1 = (*auth)->Authenticate("Bearer c1");
  ASSERT_TRUE(c1.ok());
  absl::Status st = (*auth)->AuthorizeAdmin(*c1);
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(st.message().find("--admin-key-file"), std::string::npos) << st;
}

TEST(Authenticator, BadKeyFileNamesTheFlag) {
  auto auth = Authenticator::Create("/nonexistent/keys", "");
  ASSERT_FALSE(auth.ok());
  EXPECT_NE(auth.status().message().find("--api-key-file"), std::string::npos);
}

TEST(RequestRegistry, IdsAreRandom128Bit) {
  const std::string a = RandomId(), b = RandomId();
  ASSERT_EQ(a.size(), 32u);
  ASSERT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos) << a;
  int differing = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    differing += std::bitset<4>(std::stoi(a.substr(i, 1), nullptr, 16) ^
                                std::stoi(b.substr(i, 1), nullptr, 16))
                     .count();
  }
  // 64 expected; fewer than 20 of 128 bits happens with probability < 1e-15.
  EXPECT_GE(differing, 20) << a << " " << b;
}

TEST(RequestRegistry, OnlyTheOwnerOrAnAdminFindsARequest) {
  RequestRegistry registry;
  const Caller alice{Caller::Role::kClient, "client:0"};
  const Caller bob{Caller::Role::kClient, "client:1"};
  const Caller admin{Caller::Role::kAdmin, "admin:0"};
  const std::string id = registry.Reserve(alice);
  EXPECT_FALSE(registry.Find(id, alice)) << "not bound yet";
  registry.Bind(id, 7);
  EXPECT_EQ(registry.Find(id, alice), std::optional<uint64_t>(7));
  EXPECT_FALSE(registry.Find(id, bob));
  EXPECT_EQ(registry.Find(id, admin), std::optional<uint64_t>(7));
  EXPECT_EQ(registry.Find(id, Caller{}), std::optional<uint64_t>(7)) << "an open server";
  registry.Remove(id);
  EXPECT_FALSE(registry.Find(id, alice));
  registry.Bind(id, 8);  // ended while being submitted: stays gone
  EXPECT_FALSE(registry.Find(id, alice));
  EXPECT_EQ(registry.size(), 0u);
}

}  // namespace
}  // namespace flotilla::coordinator
