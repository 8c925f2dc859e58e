// include: ["reasoning.encrypted_content"]: the server key that seals
// reasoning items (AES-256-GCM, key rotation by key id), the items that carry
// it, and the same sealed items accepted back in `input`; a tampered or
// foreign blob is refused naming the item's field. Background responses that
// end without a finish (cancelled, failed) keep the output so far.
#include "coordinator/http/responses_cipher.h"

#include <gtest/gtest.h>

#include "absl/strings/escaping.h"
#include "common/harmony/openai.h"
#include "coordinator/choice_decoder.h"
#include "coordinator/http/responses_request.h"
#include "coordinator/http/responses_stream.h"
#include "tests/harmony_completion.h"

namespace flotilla::coordinator {
namespace {

namespace tk = tokenizer;
using test_support::Assistant, test_support::Completion, test_support::Tok;

constexpr char kKeyA[] = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
constexpr char kKeyB[] = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

std::unique_ptr<ReasoningCipher> Keys(const std::string& text) {
  absl::StatusOr<std::unique_ptr<ReasoningCipher>> c = ReasoningCipher::Parse(text, "keys");
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

std::string Seal(const ReasoningCipher& cipher, const std::string& text) {
  absl::StatusOr<std::string> sealed = cipher.Seal(text);
  EXPECT_TRUE(sealed.ok()) << sealed.status();
  return sealed.ok() ? *sealed : "";
}

TEST(ReasoningCipherTest, OpensWhatItSealedEachTimeDifferently) {
  std::unique_ptr<ReasoningCipher> c = Keys(kKeyA);
  ASSERT_NE(c, nullptr);
  const std::string text = "The user wants the weather; call get_weather.";
  const std::string one = Seal(*c, text), two = Seal(*c, text);
  EXPECT_NE(one, two);  // a fresh nonce per blob
  EXPECT_EQ(c->Open(one).value_or("?"), text);
  EXPECT_EQ(c->Open(two).value_or("?"), text);
  EXPECT_EQ(c->Open(Seal(*c, "")).value_or("?"), "");
  // A random key opens its own blobs and no other key's.
  absl::StatusOr<std::unique_ptr<ReasoningCipher>> random = ReasoningCipher::Random();
  ASSERT_TRUE(random.ok());
  EXPECT_EQ((*random)->Open(Seal(**random, text)).value_or("?"), text);
  EXPECT_FALSE((*random)->Open(one).ok());
}

TEST(ReasoningCipherTest, TamperedTruncatedAndForeignBlobsAreRefused) {
  std::unique_ptr<ReasoningCipher> a = Keys(kKeyA), b = Keys(kKeyB);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const std::string sealed = Seal(*a, "secret reasoning");
  std::string raw;
  ASSERT_TRUE(absl::Base64Unescape(sealed, &raw));
  for (size_t at : {size_t{0}, size_t{3}, size_t{15}, raw.size() / 2, raw.size() - 1}) {
    std::string altered = raw;
    altered[at] ^= 0x20;
    absl::StatusOr<std::string> opened = a->Open(absl::Base64Escape(altered));
    EXPECT_FALSE(opened.ok()) << "byte " << at;
    EXPECT_EQ(opened.status().code(), absl::StatusCode::kInvalidArgument);
  }
  std::string altered = raw;
  altered[raw.size() / 2] ^= 1;
  EXPECT_NE(a->Open(absl::Base64Escape(altered)).status().message().find("altered"),
            std::string::npos);
  EXPECT_NE(a->Open(absl::Base64Escape(raw.substr(0, 20))).status().message().find("too short"),
            std::string::npos);
  EXPECT_NE(a->Open("not base64 !").status().message().find("base64"), std::string::npos);
  EXPECT_NE(b->Open(sealed).status().message().find("does not hold"), std::string::npos);
}

TEST(ReasoningCipherTest, RotatedKeysStillOpenAndTheFirstSeals) {
  std::unique_ptr<ReasoningCipher> before = Keys(kKeyA);
  std::unique_ptr<ReasoningCipher> after =
      Keys(std::string("# rotated\n") + kKeyB + "\n\n" + kKeyA + "\n");
  ASSERT_NE(before, nullptr);
  ASSERT_NE(after, nullptr);
  const std::string old_blob = Seal(*before, "old");
  EXPECT_EQ(after->Open(old_blob).value_or("?"), "old");
  const std::string new_blob = Seal(*after, "new");
  EXPECT_EQ(after->Open(new_blob).value_or("?"), "new");
  EXPECT_FALSE(before->Open(new_blob).ok());  // sealed with kKeyB
  // Retired: a key file without kKeyA no longer opens its blobs.
  EXPECT_FALSE(Keys(kKeyB)->Open(old_blob).ok());
}

TEST(ReasoningCipherTest, BadKeyFilesNameTheLine) {
  absl::StatusOr<std::unique_ptr<ReasoningCipher>> c =
      ReasoningCipher::Parse(std::string(kKeyA) + "\nzz\n", "keys.txt");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("keys.txt line 2"), std::string::npos) << c.status();
  c = ReasoningCipher::Parse("0011", "keys.txt");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("64 hex digits"), std::string::npos) << c.status();
  c = ReasoningCipher::Parse("# nothing\n\n", "keys.txt");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("no key"), std::string::npos) << c.status();
  c = ReasoningCipher::FromFile("/nonexistent/reasoning-keys");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("--reasoning-key-file"), std::string::npos);
  EXPECT_FALSE(ReasoningCipher::Create({"short"}).ok());
}


// The response of `messages` generated and finished, through a ResponsesStream sealing with `seal`.
Json Generated(const std::vector<harmony::Message>& messages, const ReasoningCipher* seal,
               size_t cut_after = 0) {
  tk::TokenId stop;
  const std::vector<tk::TokenId> ids = Completion(messages, &stop);
  ResponsesStream stream("resp_1", "gpt-oss", Json{{"store", false}}, 7, seal);
  ChoiceDecoder decoder(&Tok(), Decoding::kHarmony, 0, "resp_1", {});
  stream.Begin();
  std::vector<RequestEvent> events;
  const size_t fed = cut_after == 0 ? ids.size() : cut_after;
  for (size_t i = 0; i < fed; ++i) decoder.Feed({ids[i]}, events);
  if (cut_after == 0) {
    decoder.Finish(common::STOP, stop, TokenUsage{12, static_cast<uint32_t>(ids.size())}, events);
    RequestEvent end;
    end.kind = RequestEvent::Kind::kUsage;
    end.usage = events.back().usage;
    events.push_back(end);
  }
  stream.Consume(events);
  if (cut_after != 0) stream.Abort("cancelled", nullptr);
  return stream.Response();
}

TEST(EncryptedReasoningTest, ReasoningItemsCarryTheirTextSealed) {
  std::unique_ptr<ReasoningCipher> c = Keys(kKeyA);
  const Json r =
      Generated({Assistant("analysis", "Think it over."), Assistant("final", "Done.")}, c.get());
  ASSERT_EQ(r["output"].size(), 2u) << r.dump();
  const Json& reasoning = r["output"][0];
  ASSERT_EQ(reasoning["type"], "reasoning");
  ASSERT_TRUE(reasoning.contains("encrypted_content")) << reasoning.dump();
  EXPECT_EQ(c->Open(reasoning["encrypted_content"].get<std::string>()).value_or("?"),
            "Think it over.");
  EXPECT_FALSE(r["output"][1].contains("encrypted_content"));
  // Not asked for: not there.
  const Json plain = Generated({Assistant("analysis", "Think it over.")}, nullptr);
  EXPECT_FALSE(plain["output"][0].contains("encrypted_content")) << plain.dump();
}

Json InputRequest(Json input) {
  return Json{{"model", "m"}, {"input", std::move(input)}, {"store", false}};
}

absl::StatusOr<std::vector<tk::TokenId>> Prompt(const Json& body, const ReasoningCipher* cipher) {
  absl::StatusOr<ResponsesRequest> r = ParseResponsesRequest(body, cipher);
  if (!r.ok()) return r.status();
  absl::StatusOr<PreparedRequest> p = PrepareResponsesRequest(*r, Json::array(), "m", Tok(), {});
  if (!p.ok()) return p.status();
  return p->prompt;
}

Json Turn(const Json& reasoning) {
  return Json::array(
      {{{"role", "user"}, {"content", "Weather in Tokyo?"}},
       reasoning,
       {{"type", "function_call"},
        {"call_id", "call_1"},
        {"name", "get_weather"},
        {"arguments", "{}"}},
       {{"type", "function_call_output"}, {"call_id", "call_1"}, {"output", "sunny"}}});
}

TEST(EncryptedReasoningTest, SealedItemsPassedBackAreTheirReasoning) {
  std::unique_ptr<ReasoningCipher> c = Keys(kKeyA), other = Keys(kKeyB);
  const Json plain = {{"type", "reasoning"},
                      {"summary", Json::array()},
                      {"content", {{{"type", "reasoning_text"}, {"text", "Need the weather."}}}}};
  // What a store: false client sends back: no content, only the sealed text.
  const Json sealed = {{"type", "reasoning"},
                       {"id", "rs_1"},
                       {"summary", Json::array()},
                       {"encrypted_content", Seal(*c, "Need the weather.")}};
  absl::StatusOr<std::vector<tk::TokenId>> from_plain = Prompt(InputRequest(Turn(plain)), c.get());
  absl::StatusOr<std::vector<tk::TokenId>> from_sealed =
      Prompt(InputRequest(Turn(sealed)), c.get());
  ASSERT_TRUE(from_plain.ok()) << from_plain.status();
  ASSERT_TRUE(from_sealed.ok()) << from_sealed.status();
  EXPECT_EQ(*from_sealed, *from_plain);
  // The sealed text stands for the item, whatever its content claims.
  Json forged = sealed;
  forged["content"] = {{{"type", "reasoning_text"}, {"text", "Something else."}}};
  EXPECT_EQ(Prompt(InputRequest(Turn(forged)), c.get()).value_or(std::vector<tk::TokenId>{}),
            *from_plain);

  Json tampered = sealed;
  std::string blob = tampered["encrypted_content"];
  blob[blob.size() / 2] = blob[blob.size() / 2] == 'A' ? 'B' : 'A';
  tampered["encrypted_content"] = blob;
  Json foreign = sealed, not_string = sealed;
  foreign["encrypted_content"] = Seal(*other, "x");
  not_string["encrypted_content"] = 5;
  for (const Json& item : {tampered, foreign, not_string}) {
    absl::StatusOr<std::vector<tk::TokenId>> p = Prompt(InputRequest(Turn(item)), c.get());
    ASSERT_FALSE(p.ok()) << item.dump();
    const ApiError e = ErrorFromStatus(p.status());
    EXPECT_EQ(e.http_status, 400) << e.message;
    EXPECT_EQ(e.param, "input[1].encrypted_content") << e.message;
  }
}

TEST(BackgroundResponseTest, CancelledKeepsTheOutputSoFar) {
  tk::TokenId stop;
  const std::vector<tk::TokenId> ids =
      Completion({Assistant("analysis", "A long thought that goes on")}, &stop);
  const Json r =
      Generated({Assistant("analysis", "A long thought that goes on")}, nullptr, ids.size() - 2);
  EXPECT_EQ(r["status"], "cancelled");
  EXPECT_TRUE(r["error"].is_null());
  EXPECT_TRUE(r["usage"].is_null());
  ASSERT_EQ(r["output"].size(), 1u) << r.dump();
  EXPECT_EQ(r["output"][0]["status"], "incomplete");
  EXPECT_FALSE(r["output"][0]["content"][0]["text"].get<std::string>().empty());

  // Failed: the error says why; a finished response is not aborted afterwards.
  ResponsesStream failed("resp_2", "gpt-oss", Json::object(), 7);
  failed.Begin();
  failed.Abort("failed", Json{{"code", "server_error"}, {"message", "a worker was lost"}});
  EXPECT_EQ(failed.Response()["status"], "failed");
  EXPECT_EQ(failed.Response()["error"]["message"], "a worker was lost");
  const Json done = Generated({Assistant("final", "Hi.")}, nullptr);
  EXPECT_EQ(done["status"], "completed");
}

}  // namespace
}  // namespace flotilla::coordinator
