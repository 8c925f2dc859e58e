#include "common/grammar/string_formats.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace flotilla::grammar {
namespace {

// RFC 3339 full-date: days per month, 29 February in leap years only.
constexpr char kDate[] =
    R"((?:\d\d(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)-02-29)"
    R"(|\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30))"
    R"(|02-(?:0[1-9]|1\d|2[0-8])))";
// RFC 3339 full-time: the offset is required; at most 9 fraction digits.
constexpr char kTime[] =
    R"((?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,9})?(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d))";
constexpr char kLabel[] = R"([A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)";
constexpr char kHex4[] = "[0-9a-fA-F]{1,4}";

std::string Ipv6() {
  const std::string h = kHex4;
  const std::vector<std::string> forms = {
      "(?:" + h + ":){7}" + h,
      "(?:" + h + ":){1,7}:",
      "(?:" + h + ":){1,6}:" + h,
      "(?:" + h + ":){1,5}(?::" + h + "){1,2}",
      "(?:" + h + ":){1,4}(?::" + h + "){1,3}",
      "(?:" + h + ":){1,3}(?::" + h + "){1,4}",
      "(?:" + h + ":){1,2}(?::" + h + "){1,5}",
      h + ":(?::" + h + "){1,6}",
      ":(?:(?::" + h + "){1,7}|:)",
  };
  return "^(?:" + absl::StrJoin(forms, "|") + ")$";
}

const std::map<std::string, std::string, std::less<>>& Formats() {
  static const auto* formats = new std::map<std::string, std::string, std::less<>>{
      {"date", absl::StrCat("^(?:", kDate, ")$")},
      {"time", absl::StrCat("^", kTime, "$")},
      {"date-time", absl::StrCat("^(?:", kDate, ")T", kTime, "$")},
      {"uuid", "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"},
      // RFC 5321 dot-atom local part; a domain of labels and an alphabetic TLD.
      {"email",
       R"(^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*)"
       R"(@(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.)+[A-Za-z]{2,}$)"},
      // RFC 1123: labels of at most 63 characters, 253 in all.
      {"hostname", absl::StrCat("^(?=.{1,253}$)", kLabel, "(?:\\.", kLabel, ")*$")},
      {"ipv4", R"(^(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)$)"},
      {"ipv6", Ipv6()},
      // RFC 3986 with an authority: scheme://host[:port][/path][?query][#fragment].
      {"uri",
       R"(^[A-Za-z][A-Za-z0-9+.-]*://[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)"
       R"((?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::\d{1,5})?)"
       R"((?:/(?:[A-Za-z0-9._~!$&'()*+,;=:@-]|%[0-9A-Fa-f]{2})*)*)"
       R"((?:\?(?:[A-Za-z0-9._~!$&'()*+,;=:@/?-]|%[0-9A-Fa-f]{2})*)?)"
       R"((?:#(?:[A-Za-z0-9._~!$&'()*+,;=:@/?-]|%[0-9A-Fa-f]{2})*)?$)"},
  };
  return *formats;
}

}  // namespace

absl::StatusOr<std::string> FormatPattern(std::string_view format) {
  auto it = Formats().find(format);
  if (it != Formats().end()) return it->second;
  std::vector<std::string> names;
  for (const auto& [name, pattern] : Formats()) names.push_back(name);
  return absl::NotFoundError(absl::StrCat("unsupported format '", std::string(format),
                                          "' (enforced: ", absl::StrJoin(names, ", "), ")"));
}

}  // namespace flotilla::grammar
