#include "tools/cli/multi_turn_workload.h"

#include <httplib.h>

#include <algorithm>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace flotilla::cli {

MultiTurnConversation::MultiTurnConversation(const MultiTurnOptions& options) : options_(options) {
  options_.turns = std::max(1, options_.turns);
  options_.turn_tokens = std::max(0, options_.turn_tokens);
  options_.vocab = std::max(1, options_.vocab);
  options_.first_prompt_min = std::max(1, options_.first_prompt_min);
  options_.first_prompt_max = std::max(options_.first_prompt_min, options_.first_prompt_max);
}

const std::vector<int32_t>& MultiTurnConversation::Next(std::mt19937_64& rng) {
  std::uniform_int_distribution<int32_t> tok(0, options_.vocab - 1);
  if (continues_ && turn_ >= 1 && turn_ < options_.turns) {
    shared_ = static_cast<int64_t>(prompt_.size());
    for (int i = 0; i < options_.turn_tokens; ++i) prompt_.push_back(tok(rng));
    ++turn_;
  } else {
    std::uniform_int_distribution<int> len(options_.first_prompt_min, options_.first_prompt_max);
    prompt_.resize(len(rng));
    for (int32_t& t : prompt_) t = tok(rng);
    shared_ = 0;
    turn_ = 1;
  }
  continues_ = false;  // until Done() says the turn finished
  return prompt_;
}

std::optional<double> PrometheusValue(std::string_view text, std::string_view name) {
  std::optional<double> sum;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.empty() || line[0] == '#' || line.substr(0, name.size()) != name) continue;
    std::string_view rest = line.substr(name.size());
    if (rest.empty() || (rest[0] != ' ' && rest[0] != '{')) continue;  // a longer name
    if (rest[0] == '{') {
      const size_t close = rest.rfind('}');
      if (close == std::string_view::npos) continue;
      rest = rest.substr(close + 1);
    }
    const std::string value(rest);
    char* parsed_end = nullptr;
    const double v = std::strtod(value.c_str(), &parsed_end);
    if (parsed_end == value.c_str()) continue;
    sum = sum.value_or(0) + v;
  }
  return sum;
}

absl::StatusOr<std::string> HttpGetMetrics(const std::string& url, const std::string& api_key) {
  constexpr std::string_view kScheme = "http://";
  if (url.substr(0, kScheme.size()) != kScheme) {
    return absl::InvalidArgumentError(absl::StrCat("metrics URL must start with http://: ", url));
  }
  const size_t slash = url.find('/', kScheme.size());
  const std::string base = url.substr(0, slash);
  const std::string path = slash == std::string::npos ? "/metrics" : url.substr(slash);
  if (base.size() == kScheme.size()) {
    return absl::InvalidArgumentError(absl::StrCat("metrics URL has no host: ", url));
  }
  httplib::Client client(base);
  client.set_connection_timeout(5);
  client.set_read_timeout(10);
  if (!api_key.empty()) client.set_bearer_token_auth(api_key);
  httplib::Result res = client.Get(path);
  if (!res) {
    return absl::UnavailableError(absl::StrCat("GET ", url, ": ", httplib::to_string(res.error())));
  }
  if (res->status != 200) {
    return absl::UnavailableError(absl::StrCat("GET ", url, ": HTTP ", res->status));
  }
  return res->body;
}

absl::StatusOr<std::vector<double>> PrometheusValues(std::string_view text, std::string_view source,
                                                     absl::Span<const std::string_view> required,
                                                     absl::Span<const std::string_view> optional) {
  std::vector<double> values;
  values.reserve(required.size() + optional.size());
  for (std::string_view name : required) {
    std::optional<double> v = PrometheusValue(text, name);
    if (!v)
      return absl::NotFoundError(absl::StrCat(std::string(source), " has no ", std::string(name)));
    values.push_back(*v);
  }
  for (std::string_view name : optional) values.push_back(PrometheusValue(text, name).value_or(0));
  return values;
}

absl::StatusOr<std::vector<double>> ReadPrometheusValues(
    const std::string& url, const std::string& api_key, absl::Span<const std::string_view> required,
    absl::Span<const std::string_view> optional) {
  absl::StatusOr<std::string> text = HttpGetMetrics(url, api_key);
  if (!text.ok()) return text.status();
  return PrometheusValues(*text, url, required, optional);
}

}  // namespace flotilla::cli
