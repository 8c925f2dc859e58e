// Bad input never crashes: every field of a valid request replaced by every
// JSON type, random token streams in both parser modes, absurd nesting.
#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "common/harmony/openai.h"
#include "common/harmony/parser.h"
#include "common/harmony/renderer.h"

namespace flotilla::harmony {
namespace {

using Json = nlohmann::ordered_json;
namespace tk = tokenizer;

const char kRequest[] = R"({
  "reasoning_effort": "low",
  "messages": [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
    {"role": "assistant", "reasoning_content": "Tool.", "content": null,
     "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
  ],
  "tools": [{"type": "function", "function": {"name": "w", "description": "d",
             "parameters": {"type": "object", "properties": {"c": {"type": "string", "enum": ["a"]},
                            "n": {"type": "array", "items": {"type": "number"}}}, "required": ["c"]}}}],
  "tool_choice": {"type": "function", "function": {"name": "w"}}
})";

// Calls `f` with `root` where the node at each path is replaced by `value`.
void ForEachReplacement(const Json& root, const Json& value, const std::function<void(const Json&)>& f) {
  std::vector<Json::json_pointer> paths;
  std::function<void(const Json&, const Json::json_pointer&)> walk = [&](const Json& j, const Json::json_pointer& at) {
    paths.push_back(at);
    if (j.is_object()) {
      for (auto it = j.begin(); it != j.end(); ++it) walk(it.value(), at / it.key());
    } else if (j.is_array()) {
      for (size_t i = 0; i < j.size(); ++i) walk(j[i], at / i);
    }
  };
  walk(root, Json::json_pointer());
  for (const auto& p : paths) {
    Json copy = root;
    copy[p] = value;
    f(copy);
  }
}

TEST(Robustness, EveryFieldOfARequestAsEveryType) {
  const Json base = Json::parse(kRequest);
  ASSERT_TRUE(MapChatRequest(base, {}).ok());
  int errors = 0, total = 0;
  for (const Json& v : {Json(nullptr), Json(7), Json(-1.5), Json("x"), Json(true), Json::array(), Json::object(),
                        Json::array({Json::object()}), Json(std::string("\xC3"))}) {
    ForEachReplacement(base, v, [&](const Json& req) {
      ++total;
      auto mapped = MapChatRequest(req, {});
      if (!mapped.ok()) {
        ++errors;
        EXPECT_FALSE(mapped.status().message().empty());
        return;
      }
      auto r = RenderForCompletion(mapped->conversation, {});
      if (!r.ok()) ++errors;
    });
  }
  EXPECT_GT(total, 300);
  EXPECT_GT(errors, 50);  // many replacements must be rejected, not silently accepted
}

TEST(Robustness, DeeplyNestedSchemasAndRequests) {
  Json schema = {{"type", "string"}};
  for (int i = 0; i < 200; ++i) schema = {{"type", "array"}, {"items", schema}};
  ToolDescription t{"deep", "", Json{{"type", "object"}, {"properties", {{"x", schema}}}}};
  auto r = RenderFunctionTool(t);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("nested"), std::string::npos) << r.status();

  Json deep = "x";
  for (int i = 0; i < 500; ++i) deep = Json::array({deep});
  Json req = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"metadata", deep}};
  EXPECT_FALSE(MapChatRequest(req, {}).ok());
}

TEST(Robustness, RandomTokenStreamsNeverCrashTheParser) {
  auto tok = tk::Tokenizer::Create(tk::Tokenizer::DefaultRanksPath());
  ASSERT_TRUE(tok.ok()) << tok.status();
  const tk::TokenId specials[] = {tk::kStart, tk::kEnd, tk::kMessage, tk::kChannel, tk::kConstrain,
                                  tk::kReturn, tk::kCall, tk::kEndOfText, 200100, 201087, 201088};
  std::mt19937 rng(7);
  int failed = 0, recovered = 0;
  for (int round = 0; round < 3000; ++round) {
    std::vector<tk::TokenId> ids(1 + rng() % 40);
    for (auto& id : ids) {
      const int kind = static_cast<int>(rng() % 4);
      id = kind == 0 ? specials[rng() % std::size(specials)] : (kind == 1 ? rng() % 256 : rng() % 200000);
    }
    for (bool strict : {true, false}) {
      StreamParser p(tok->get(), {round % 2 ? std::optional<Role>(Role::kAssistant) : std::nullopt, strict});
      ChatDeltaMapper mapper("fuzz");
      bool ok = true;
      for (auto id : ids) {
        auto ev = p.Process(id);
        if (!ev.ok()) {
          ok = false;
          break;
        }
        for (const Json& d : mapper.OnEvent(p, *ev)) EXPECT_NO_THROW((void)d.dump());
      }
      if (ok) ok = p.Finish().ok();
      if (ok) {
        ChatReply reply = MapReply(p.messages(), std::nullopt, "fuzz");
        EXPECT_NO_THROW((void)reply.message.dump());
        if (!strict) recovered += !p.warnings().empty();
      } else {
        ++failed;
      }
    }
  }
  EXPECT_GT(failed, 0);
  EXPECT_GT(recovered, 0);
}

}  // namespace
}  // namespace flotilla::harmony
