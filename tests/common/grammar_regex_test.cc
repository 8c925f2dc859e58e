// `pattern` and `format` automata: every pattern is checked against PCRE2 (an
// independent engine) on random strings, both for whole matches and for "can
// this prefix still match" (PCRE2's hard partial matching); formats accept
// valid examples and refuse invalid ones; unsupported syntax is refused by
// name; length bounds beside an automaton are exact.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "common/grammar/regex.h"
#include "common/grammar/string_formats.h"

namespace flotilla::grammar {
namespace {

constexpr int kStates = 2048;

// PCRE2 with JSON Schema's meaning: a search anywhere, `$` only at the end.
class Pcre {
 public:
  explicit Pcre(const std::string& pattern) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | PCRE2_DOLLAR_ENDONLY, &error, &offset, nullptr);
    EXPECT_NE(code_, nullptr) << pattern;
    data_ = pcre2_match_data_create(4, nullptr);
  }
  ~Pcre() {
    pcre2_match_data_free(data_);
    pcre2_code_free(code_);
  }
  // 1: matches, 0: a longer string could match (partial), -1: neither.
  int Match(const std::string& text, bool partial) const {
    const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0,
                               partial ? PCRE2_PARTIAL_HARD : 0, data_, nullptr);
    if (rc == PCRE2_ERROR_PARTIAL) return 0;
    return rc >= 0 ? 1 : -1;
  }

 private:
  pcre2_code* code_ = nullptr;
  pcre2_match_data* data_ = nullptr;
};

// The automaton's state after `text`, or -1 once it refused a byte.
int32_t StateAfter(const ByteDfa& dfa, const std::string& text) {
  int32_t s = 0;
  for (char c : text) {
    s = dfa.Next(s, static_cast<uint8_t>(c));
    if (s < 0) return -1;
  }
  return s;
}

bool FullMatch(const ByteDfa& dfa, const std::string& text) {
  const int32_t s = StateAfter(dfa, text);
  return s >= 0 && dfa.Accepting(s);
}

TEST(GrammarRegex, AgreesWithPcre2OnRandomStrings) {
  const std::string alphabet = "ab.-@0189xyzAZ_ \n";
  const char* patterns[] = {
      "ab",
      "^ab",
      "ab$",
      "^a+b*$",
      "^(a|b)*abb$",
      "^[a-z]{2,4}$",
      "^[^a-z]+$",
      "^a?b?a?$",
      "^\\d{3}-\\d{2}$",
      "^(?:x|y)+z$",
      "^\\w+@\\w+\\.[a-z]{2,}$",
      "^(?!a)[a-z]+$",
      "^(?=.*\\d)[a-z0-9]{3,}$",
      "^(?!.*\\.\\.)[a-z.]+$",
      "a|^b|c$",
      "^.{2,3}$",
      "^[\\s\\S]*z$",
      "^(ab|a)(bc|c)?$",
      "x{0}y",
      "^[a-]+$",
      "^[.][.]?$",
      "^\\.\\-?$",
      "^(?<word>[xyz])+$",
  };
  std::mt19937 rng(11);
  for (const char* pattern : patterns) {
    absl::StatusOr<PatternLanguage> language = CompilePattern(pattern, kStates);
    ASSERT_TRUE(language.ok()) << pattern << ": " << language.status();
    const Pcre pcre(pattern);
    for (int i = 0; i < 3000; ++i) {
      std::string text;
      const int length = rng() % 8;
      for (int k = 0; k < length; ++k) text.push_back(alphabet[rng() % alphabet.size()]);
      const bool full = pcre.Match(text, false) == 1;
      EXPECT_EQ(FullMatch(language->dfa, text), full) << pattern << " on '" << text << "'";
      // A prefix is kept exactly while some completion matches: for an
      // anchored pattern, what PCRE2's partial matching says (it gives none
      // for an empty subject); unanchored, every prefix can still match.
      const bool live = StateAfter(language->dfa, text) >= 0;
      if (pattern[0] != '^') {
        EXPECT_TRUE(live) << pattern << " prefix '" << text << "'";
      } else if (!text.empty() && std::string(pattern).find("(?=") == std::string::npos &&
                 std::string(pattern).find("(?!") == std::string::npos) {
        EXPECT_EQ(live, pcre.Match(text, true) >= 0) << pattern << " prefix '" << text << "'";
      } else if (!text.empty()) {  // PCRE2 reports a partial match whenever a lookahead
        // reaches the end, so it only bounds the live prefixes from above.
        if (live) {
          EXPECT_GE(pcre.Match(text, true), 0) << pattern << " prefix '" << text << "'";
        }
      }
    }
  }
}

TEST(GrammarRegex, Utf8ClassesAndEscapes) {
  absl::StatusOr<PatternLanguage> l = CompilePattern("^[à-ÿ]\\u00e9.[^a]$", kStates);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_TRUE(FullMatch(l->dfa, "àé€b"));
  EXPECT_TRUE(FullMatch(l->dfa, "ÿéx😀"));
  EXPECT_FALSE(FullMatch(l->dfa, "aéxb"));
  EXPECT_FALSE(FullMatch(l->dfa, "àé\nb"));  // '.' is no line break
  EXPECT_FALSE(FullMatch(l->dfa, "àéxa"));
  EXPECT_EQ(StateAfter(l->dfa, "\xC3"), StateAfter(l->dfa, "\xC3"));  // half a code point is a live prefix
  EXPECT_GE(StateAfter(l->dfa, "\xC3"), 0);
  EXPECT_EQ(StateAfter(l->dfa, "\xC3\x28"), -1);  // not UTF-8
  // Control characters a JSON string must \u-escape are left out.
  absl::StatusOr<PatternLanguage> ctl = CompilePattern("^[\\x00-\\x1f]$", kStates);
  ASSERT_TRUE(ctl.ok());
  EXPECT_TRUE(FullMatch(ctl->dfa, "\n"));
  EXPECT_FALSE(FullMatch(ctl->dfa, std::string(1, '\x01')));
}

TEST(GrammarRegex, RefusesWhatAnAutomatonCannotHoldByName) {
  const std::pair<const char*, const char*> cases[] = {
      {"(a)\\1", "backreference"},
      {"(?<=a)b", "lookbehind"},
      {"\\bword", "word boundary"},
      {"\\p{L}", "property"},
      {"a{2000}", "repetition bound"},
      {"(a$)b", "'$'"},
      {"(?:(?=a)a)+", "lookahead inside"},
      {"(a", "missing ')'"},
      {"[a-", "missing ']'"},
      {"a)", "unbalanced"},
      {"^[ab]*a[ab]{15}$", "states"},
  };
  for (const auto& [pattern, name] : cases) {
    absl::StatusOr<PatternLanguage> l = CompilePattern(pattern, kStates);
    ASSERT_FALSE(l.ok()) << pattern;
    EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument) << pattern;
    EXPECT_NE(std::string(l.status().message()).find(name), std::string::npos)
        << pattern << " -> " << l.status();
  }
}

TEST(GrammarRegex, LeadingLengthLookaheadBecomesLengthBounds) {
  absl::StatusOr<PatternLanguage> l = CompilePattern("^(?=.{1,5}$)[a-z]+(\\.[a-z]+)*$", kStates);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->min_length, 1);
  EXPECT_EQ(l->max_length, 5);
}

TEST(GrammarRegex, LengthTableIsExact) {
  // Lengths 2 and 6 only: a bound of [3, 5] leaves nothing; [2, 5] only "ab".
  absl::StatusOr<PatternLanguage> l = CompilePattern("^(ab|abcdef)$", kStates);
  ASSERT_TRUE(l.ok());
  absl::StatusOr<LengthTable> none = LengthTable::Build(l->dfa, 3, 5, 1 << 20);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->Feasible(0, 0));
  absl::StatusOr<LengthTable> short_only = LengthTable::Build(l->dfa, 2, 5, 1 << 20);
  ASSERT_TRUE(short_only.ok());
  EXPECT_TRUE(short_only->Feasible(0, 0));
  EXPECT_TRUE(short_only->Feasible(StateAfter(l->dfa, "ab"), 2));
  EXPECT_FALSE(short_only->Feasible(StateAfter(l->dfa, "abc"), 3));
  // Multi-byte code points count once.
  absl::StatusOr<PatternLanguage> any = CompilePattern("^.*$", kStates);
  ASSERT_TRUE(any.ok());
  absl::StatusOr<LengthTable> three = LengthTable::Build(any->dfa, 3, 3, 1 << 20);
  ASSERT_TRUE(three.ok());
  // Inside "€": the code point begun counts (the caller adds it).
  EXPECT_TRUE(three->Feasible(StateAfter(any->dfa, "\xE2\x82"), 1));
  EXPECT_TRUE(three->Feasible(StateAfter(any->dfa, "\xE2\x82"), 3));
  EXPECT_FALSE(three->Feasible(StateAfter(any->dfa, "\xE2\x82"), 4));
  absl::StatusOr<LengthTable> at_least = LengthTable::Build(any->dfa, 4, -1, 1 << 20);
  ASSERT_TRUE(at_least.ok());
  EXPECT_TRUE(at_least->Feasible(0, 0));
  EXPECT_TRUE(at_least->Feasible(0, 100));
}

TEST(GrammarFormats, AcceptValidAndRefuseInvalidExamples) {
  struct Case {
    const char* format;
    std::vector<std::string> good, bad;
  };
  const Case cases[] = {
      {"date", {"2024-02-29", "2000-02-29", "1999-12-31"},
       {"2023-02-29", "1900-02-29", "2024-04-31", "2024-13-01", "24-01-01"}},
      {"time", {"23:59:59Z", "00:00:00.123+05:30", "12:30:00-08:00"},
       {"24:00:00Z", "12:30:00", "12:30Z", "12:60:00Z"}},
      {"date-time", {"2024-02-29T12:30:00Z", "1999-01-01T00:00:00.5+01:00"},
       {"2024-02-30T12:30:00Z", "2024-02-29T12:30:00", "2024-02-29 12:30:00Z"}},
      {"uuid", {"123e4567-e89b-12d3-a456-426614174000", "00000000-0000-0000-0000-000000000000"},
       {"123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400g"}},
      {"email", {"a@b.co", "first.last+tag@mail.example.org"},
       {"a@b", ".a@b.co", "a..b@c.de", "a@-b.co", "a b@c.de"}},
      {"hostname", {"a", "example.com", "xn--d1acufc.xn--p1ai"},
       {"-a.com", "a-.com", "a..b", std::string(64, 'a') + ".com"}},
      {"ipv4", {"0.0.0.0", "192.168.1.255"}, {"256.1.1.1", "01.1.1.1", "1.1.1"}},
      {"ipv6", {"::", "::1", "fe80::1", "2001:db8:0:0:0:0:2:1", "1::"},
       {":::", "1:2:3:4:5:6:7:8:9", "12345::", "1::2::3"}},
      {"uri", {"https://example.com", "http://a.b:8080/p/q?x=1#frag", "urn://x/%20"},
       {"example.com", "https://", "http://a b.com", "1http://a.com"}},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::string> pattern = FormatPattern(c.format);
    ASSERT_TRUE(pattern.ok()) << c.format;
    absl::StatusOr<PatternLanguage> l = CompilePattern(*pattern, kStates);
    ASSERT_TRUE(l.ok()) << c.format << ": " << l.status();
    auto matches = [&](const std::string& text) {
      const int32_t s = StateAfter(l->dfa, text);
      const int64_t points = static_cast<int64_t>(text.size());  // ASCII examples
      return s >= 0 && l->dfa.Accepting(s) && points >= l->min_length &&
             (l->max_length < 0 || points <= l->max_length);
    };
    for (const std::string& good : c.good) EXPECT_TRUE(matches(good)) << c.format << " " << good;
    for (const std::string& bad : c.bad) EXPECT_FALSE(matches(bad)) << c.format << " " << bad;
  }
  absl::StatusOr<std::string> unknown = FormatPattern("duration");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(unknown.status().message()).find("'duration'"), std::string::npos);
}

}  // namespace
}  // namespace flotilla::grammar
