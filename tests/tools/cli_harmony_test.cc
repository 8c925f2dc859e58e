// `flotilla render` and `flotilla parse`.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace {

using Json = nlohmann::ordered_json;

std::pair<int, std::string> RunFlotilla(const std::string& args) {
  std::string out;
  FILE* p = popen((std::string(FLOTILLA_BIN) + " " + args + " 2>&1").c_str(), "r");
  if (p == nullptr) return {-1, ""};
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int rc = pclose(p);
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, out};
}

std::string WriteTemp(const std::string& name, const std::string& body) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary) << body;
  return path;
}

Json Case(const std::string& name) {
  std::ifstream in(std::string(FLOTILLA_SOURCE_DIR) + "/tests/data/harmony/cases.json");
  Json all = Json::parse(in);
  for (const auto& c : all["cases"]) {
    if (c["name"] == name) return c;
  }
  ADD_FAILURE() << "no case " << name;
  return Json();
}

TEST(FlotillaRender, ConversationFileMatchesReferenceCase) {
  for (const char* name : {"render_function_tools", "dropping_cot_by_default", "preserve_cot"}) {
    Json c = Case(name);
    const std::string path = WriteTemp(std::string(name) + ".json", Json{{"conversation", c["conversation"]}}.dump());
    const bool drop = c.value("auto_drop_analysis", false);
    auto [rc, out] = RunFlotilla("render --conversation " + path + (drop ? " --auto-drop-analysis" : ""));
    ASSERT_EQ(rc, 0) << out;
    EXPECT_EQ(out, c["expected_text"].get<std::string>()) << name;
  }
}

TEST(FlotillaRender, RequestFileWithDateAndTokens) {
  const std::string path = WriteTemp("request.json", R"({"messages": [{"role": "user", "content": "hello world"}]})");
  auto [rc, out] = RunFlotilla("render --request " + path + " --date 2025-01-02");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("Current date: 2025-01-02\n"), std::string::npos) << out;
  EXPECT_NE(out.find("<|start|>user<|message|>hello world<|end|><|start|>assistant"), std::string::npos) << out;
  auto [rc2, ids] = RunFlotilla("render --request " + path + " --date 2025-01-02 --tokens");
  ASSERT_EQ(rc2, 0) << ids;
  Json j = Json::parse(ids);
  ASSERT_TRUE(j.is_array());
  EXPECT_EQ(j.front(), 200006);
  EXPECT_EQ(j.back(), 173781);  // "assistant"
}

// `flotilla ARGS` exits 1 naming `want`.
void ExpectFails(const std::string& args, const std::string& want) {
  const auto [rc, out] = RunFlotilla(args);
  EXPECT_EQ(rc, 1) << args;
  EXPECT_NE(out.find(want), std::string::npos) << args << ": " << out;
}

TEST(FlotillaRender, BadInputIsAClearError) {
  const std::string bad_utf8 = WriteTemp("bad_utf8.json", "{\"messages\": [{\"role\": \"user\", \"content\": \"a\xFF\"}]}");
  auto [rc, out] = RunFlotilla("render --request " + bad_utf8 + " --date 2025-01-02");
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("not valid UTF-8"), std::string::npos) << out;
  EXPECT_NE(out.find("offset 44"), std::string::npos) << out;

  const std::string wizard = WriteTemp("wizard.json", R"({"conversation": [{"role": "wizard", "content": "x"}]})");
  ExpectFails("render --conversation " + wizard, "unknown role 'wizard'");

  const std::string ok = WriteTemp("ok.json", R"({"messages": [{"role": "user", "content": "x"}]})");
  ExpectFails("render --request " + ok + " --date 2025-13-01", "2025-13-01");

  ExpectFails("render --request /nonexistent/request.json", "/nonexistent/request.json");

  std::tie(rc, out) = RunFlotilla("render");
  EXPECT_NE(rc, 0);
}

TEST(FlotillaParse, TokensToMessages) {
  Json c = Case("simple_tool_call");
  std::string list;
  for (const auto& t : c["tokens"]) {
    if (!list.empty()) list.push_back(',');
    list.append(std::to_string(t.get<int>()));
  }
  auto [rc, out] = RunFlotilla("parse --start-role assistant --tokens " + list);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(Json::parse(out), c["expected_messages"]);
}

TEST(FlotillaParse, BadTokensAreClearErrors) {
  ExpectFails("parse --tokens 200006,173781,201088", "201088 is outside the vocabulary");
  ExpectFails("parse --tokens 200006,abc", "'abc' is not a token id");
  // Stops mid-header: <|start|>assistant<|channel|>
  ExpectFails("parse --tokens 200006,173781,200005", "mid-header");
  auto [rc, out] = RunFlotilla("parse --non-strict --tokens 200006,173781,200005,17196");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("\"channel\": \"final\""), std::string::npos) << out;
}

TEST(FlotillaParse, OpenAiReply) {
  auto [rc, out] = RunFlotilla(
      "parse --openai --start-role assistant --text "
      "'<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>'");
  ASSERT_EQ(rc, 0) << out;
  Json j = Json::parse(out);
  EXPECT_EQ(j["message"]["content"], "4");
  EXPECT_EQ(j["message"]["reasoning_content"], "Think.");
  EXPECT_EQ(j["finish_reason"], "stop");
}

}  // namespace
