#include "common/command_line.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <regex>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace flotilla {
namespace {

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The apps a command line reaches: `app`, then each subcommand named in it.
std::vector<const CLI::App*> ActiveApps(const CLI::App& app, const std::vector<std::string>& args) {
  std::vector<const CLI::App*> chain = {&app};
  for (const std::string& arg : args) {
    if (absl::StartsWith(arg, "-")) continue;
    for (const CLI::App* sub : chain.back()->get_subcommands({})) {
      if (sub->check_name(arg)) {
        chain.push_back(sub);
        break;
      }
    }
  }
  return chain;
}

const CLI::Option* FindOption(const std::vector<const CLI::App*>& chain, const std::string& name) {
  for (const CLI::App* app : chain) {
    if (const CLI::Option* opt = app->get_option_no_throw(name)) return opt;
  }
  return nullptr;
}

// Every long flag of the apps in `chain`, as "--name".
std::vector<std::string> LongFlags(const std::vector<const CLI::App*>& chain) {
  std::vector<std::string> names;
  for (const CLI::App* app : chain) {
    for (const CLI::Option* opt : app->get_options({})) {
      for (const std::string& name : opt->get_lnames()) names.push_back("--" + name);
    }
  }
  return names;
}

std::string DidYouMean(std::string_view word, const std::vector<std::string>& candidates) {
  const std::string nearest = Nearest(word, candidates);
  return nearest.empty() ? "" : absl::StrCat("; did you mean ", nearest, "?");
}

// The first flag in `args` no active app declares ("" when none).
std::string UnknownFlag(const std::vector<const CLI::App*>& chain,
                        const std::vector<std::string>& args) {
  for (const std::string& arg : args) {
    if (arg == "--" ) break;
    if (!absl::StartsWith(arg, "-") || arg == "-") continue;
    const std::string name = arg.substr(0, arg.find('='));
    if (FindOption(chain, name) == nullptr) return name;
  }
  return "";
}

// The first word in `args` where a subcommand was expected and none has that
// name ("" when none); `parent` is the app whose commands it should be.
std::string UnknownCommand(const CLI::App& app, const std::vector<std::string>& args,
                           const CLI::App** parent) {
  const CLI::App* current = &app;
  std::vector<const CLI::App*> chain = {&app};
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (absl::StartsWith(arg, "-")) {
      const CLI::Option* opt = FindOption(chain, arg.substr(0, arg.find('=')));
      if (opt != nullptr && opt->get_expected_min() > 0 && arg.find('=') == std::string::npos) {
        ++i;  // its value
      }
      continue;
    }
    const CLI::App* next = nullptr;
    for (const CLI::App* sub : current->get_subcommands({})) {
      if (sub->check_name(arg)) next = sub;
    }
    if (next != nullptr) {
      current = next;
      chain.push_back(next);
      continue;
    }
    if (!current->get_subcommands({}).empty() && current->get_options([](const CLI::Option* o) {
          return o->get_positional();
        }).empty()) {
      *parent = current;
      return arg;
    }
  }
  return "";
}

std::string CommandList(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands({})) names.push_back(sub->get_name());
  return absl::StrJoin(names, ", ");
}

std::string UnknownCommandMessage(const CLI::App& parent, const std::string& word) {
  std::vector<std::string> names;
  for (const CLI::App* sub : parent.get_subcommands({})) names.push_back(sub->get_name());
  return absl::StrCat("unknown command '", word, "'", DidYouMean(word, names),
                      " (commands: ", CommandList(parent), ")");
}

// Whether `flag` carries CLI11's PositiveNumber check (described POSITIVE;
// its message prints the bound, the smallest double, as 0).
bool MustBePositive(const std::vector<const CLI::App*>& chain, const std::string& flag) {
  const CLI::Option* opt = FindOption(chain, flag);
  if (opt == nullptr) return false;
  const std::string type = opt->get_type_name();
  return absl::StrContains(type, "POSITIVE") && !absl::StrContains(type, "NONNEGATIVE");
}

// "--workers: Value 1k not in range 1 to 64" and the like, said plainly.
std::string RangeMessage(const std::vector<const CLI::App*>& chain, const std::string& message) {
  static const std::regex range(R"(^(\S+): Value (.*) not in range (\S+) to (\S+)$)");
  std::smatch m;
  if (!std::regex_match(message, m, range)) return "";
  const std::string flag = m[1], value = m[2];
  double low = 0, high = 0, given = 0;
  if (!absl::SimpleAtod(m[3].str(), &low) || !absl::SimpleAtod(m[4].str(), &high)) return "";
  if (!absl::SimpleAtod(value, &given)) {
    return absl::StrCat(flag, ": '", value,
                        "' is not a number (counts may carry a suffix: 2k = 2000, 1Ki = 1024)");
  }
  if (high > 1e300) {
    const bool positive = low > 0 || MustBePositive(chain, flag);
    return absl::StrCat(flag, ": ", value, " must be ", positive ? "greater than 0" : "0 or more");
  }
  return absl::StrCat(flag, ": ", value, " is out of range: ", low, " to ", high);
}

// The error's class: CLI11 names some errors after the app that raised them.
std::string KindOf(const CLI::ParseError& e) {
  if (dynamic_cast<const CLI::ExtrasError*>(&e)) return "ExtrasError";
  if (dynamic_cast<const CLI::RequiredError*>(&e)) return "RequiredError";
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&e)) return "ArgumentMismatch";
  if (dynamic_cast<const CLI::ConfigError*>(&e)) return "ConfigError";
  return e.get_name();
}

}  // namespace

std::string Nearest(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = SIZE_MAX;
  for (const std::string& c : candidates) {
    const size_t d = EditDistance(word, c);
    if (d < best_distance) {
      best = c;
      best_distance = d;
    }
  }
  const size_t allowed = std::max<size_t>(2, word.size() / 3);
  return best_distance <= allowed ? best : "";
}

std::optional<std::string> ExpandSizeSuffix(std::string_view text) {
  static const std::regex size(R"(^([0-9]+)(?:\.([0-9]+))?([kKmMgG]i?)?$)");
  const std::string s(text);
  std::smatch m;
  if (!std::regex_match(s, m, size)) return std::nullopt;
  uint64_t scale = 1;
  if (m[3].matched) {
    const std::string unit = m[3];
    const bool binary = unit.size() == 2;
    const int power = std::string("kmg").find(absl::ascii_tolower(unit[0])) + 1;
    for (int i = 0; i < power; ++i) scale *= binary ? 1024 : 1000;
  } else if (m[2].matched) {
    return std::nullopt;  // a fraction with no suffix is not a count
  }
  uint64_t whole = 0;
  if (m[1].length() > 18 || !absl::SimpleAtoi(m[1].str(), &whole)) return std::nullopt;
  if (whole > UINT64_MAX / scale) return std::nullopt;
  uint64_t value = whole * scale;
  if (m[2].matched) {
    const std::string digits = m[2];
    uint64_t fraction = 0, denominator = 1;
    if (digits.size() > 9 || !absl::SimpleAtoi(digits, &fraction)) return std::nullopt;
    for (size_t i = 0; i < digits.size(); ++i) denominator *= 10;
    if ((fraction * scale) % denominator != 0) return std::nullopt;  // not a whole count
    value += fraction * scale / denominator;
  }
  return absl::StrCat(value);
}

void AcceptSizeSuffixes(CLI::App& app) {
  for (CLI::Option* opt : app.get_options({})) {
    const std::string type = opt->get_type_name();
    if (!absl::StartsWith(type, "INT") && !absl::StartsWith(type, "UINT")) continue;
    opt->transform(CLI::Validator(
        [](std::string& input) {
          if (std::optional<std::string> expanded = ExpandSizeSuffix(input)) input = *expanded;
          return std::string();
        },
        "", "size-suffix"));
  }
  for (CLI::App* sub : app.get_subcommands({})) AcceptSizeSuffixes(*sub);
}

std::string ReadableError(const CLI::App& app, const std::vector<std::string>& args,
                          std::string_view kind, std::string_view message) {
  const std::string text(message);
  const std::vector<const CLI::App*> chain = ActiveApps(app, args);
  if (kind == "ExtrasError" || kind == "RequiredError" || kind == "ArgumentMismatch") {
    const std::string flag = UnknownFlag(chain, args);
    if (!flag.empty()) {
      return absl::StrCat("unknown flag ", flag, DidYouMean(flag, LongFlags(chain)),
                          " (see --help)");
    }
    const CLI::App* parent = nullptr;
    const std::string word = UnknownCommand(app, args, &parent);
    if (!word.empty()) return UnknownCommandMessage(*parent, word);
    if (absl::StrContains(text, "subcommand is required")) {
      return absl::StrCat("give a command: ", CommandList(*chain.back()));
    }
  }
  if (kind == "ConfigError") {
    static const std::regex extra(R"(^INI was not able to parse (\S+)$)");
    std::smatch m;
    if (std::regex_match(text, m, extra)) {
      const std::string key = m[1].str().substr(m[1].str().rfind('.') + 1);
      std::vector<std::string> keys;
      for (const std::string& flag : LongFlags(chain)) keys.push_back(flag.substr(2));
      return absl::StrCat("--config: unknown key '", m[1].str(), "'", DidYouMean(key, keys),
                          " (keys are the long flags without --)");
    }
  }
  if (std::string range = RangeMessage(chain, text); !range.empty()) return range;
  return text;
}

void NameEnvironmentVariables(CLI::App& app) {
  for (CLI::Option* opt : app.get_options({})) {
    const std::vector<std::string>& names = opt->get_lnames();
    if (names.empty() || !opt->get_envname().empty()) continue;
    const std::string& name = names.back();
    if (name == "help" || name == "version" || name == "config") continue;
    std::string variable = "FLOTILLA_" + absl::AsciiStrToUpper(name);
    std::replace(variable.begin(), variable.end(), '-', '_');
    opt->envname(variable);
  }
}

std::optional<int> ParseCommandLine(CLI::App& app, int argc, char** argv) {
  AcceptSizeSuffixes(app);
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help, --version
  } catch (const CLI::RuntimeError& e) {
    return app.exit(e);  // a command's own failure, already reported
  } catch (const CLI::ParseError& e) {
    std::string program = argc > 0 ? argv[0] : "flotilla";
    program = program.substr(program.rfind('/') + 1);
    const std::vector<std::string> args(argv + std::min(argc, 1), argv + argc);
    std::cerr << program << ": " << ReadableError(app, args, KindOf(e), e.what()) << "\n";
    return e.get_exit_code();
  }
}

}  // namespace flotilla
