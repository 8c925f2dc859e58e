#include "common/config_file.h"

#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace flotilla {
namespace {

// The subcommand chain of `app` that the command line chose (parsed ones).
std::vector<const CLI::App*> ParsedChain(const CLI::App& app) {
  std::vector<const CLI::App*> chain = {&app};
  for (bool found = true; found;) {
    found = false;
    for (const CLI::App* sub : chain.back()->get_subcommands({})) {
      if (sub->parsed()) {
        chain.push_back(sub);
        found = true;
        break;
      }
    }
  }
  return chain;
}

// The parents under which `key` is a flag: [] for the top app, else the
// names down to the first parsed subcommand that declares it.
std::vector<std::string> ParentsOf(const CLI::App& app, const std::string& key) {
  const std::vector<const CLI::App*> chain = ParsedChain(app);
  std::vector<std::string> parents;
  for (size_t i = 0; i < chain.size(); ++i) {
    if (i > 0) parents.push_back(chain[i]->get_name());
    if (chain[i]->get_option_no_throw("--" + key) != nullptr) return parents;
  }
  return {};  // nowhere: CLI11 reports it as unknown under its own name
}

std::string Where(const YAML::Node& node) {
  return absl::StrCat("line ", node.Mark().line + 1);
}

// A scalar or a list of scalars: the flag's values.
std::vector<std::string> Inputs(const std::string& key, const YAML::Node& value) {
  if (value.IsScalar()) return {value.Scalar()};
  if (value.IsNull()) return {""};
  if (value.IsSequence()) {
    std::vector<std::string> inputs;
    for (const YAML::Node& item : value) {
      if (!item.IsScalar()) {
        throw CLI::ConfigError(absl::StrCat("--config: '", key, "' (", Where(item),
                                            "): list items must be plain values"));
      }
      inputs.push_back(item.Scalar());
    }
    return inputs;
  }
  throw CLI::ConfigError(
      absl::StrCat("--config: '", key, "' (", Where(value), "): give a value or a list"));
}

// Reads the file with YAML for one app.
class YamlConfig final : public CLI::Config {
 public:
  explicit YamlConfig(const CLI::App* app) : app_(app) {}

  std::string to_config(const CLI::App*, bool, bool, std::string) const override {
    return "";  // Flotilla never writes config files
  }

  std::vector<CLI::ConfigItem> from_config(std::istream& input) const override {
    std::stringstream text;
    text << input.rdbuf();
    return ConfigItemsFromYaml(*app_, text.str());
  }

 private:
  const CLI::App* app_;
};

}  // namespace

std::vector<CLI::ConfigItem> ConfigItemsFromYaml(const CLI::App& app, const std::string& text) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw CLI::ConfigError(absl::StrCat("--config: not YAML: ", e.what()));
  }
  if (root.IsNull()) return {};
  if (!root.IsMap()) throw CLI::ConfigError("--config: the file must be a mapping of flag: value");
  std::vector<CLI::ConfigItem> items;
  for (const auto& entry : root) {
    const std::string key = entry.first.Scalar();
    const YAML::Node& value = entry.second;
    if (value.IsMap()) {
      // A subcommand's section: its keys are that subcommand's flags.
      for (const auto& inner : value) {
        CLI::ConfigItem item;
        item.parents = {key};
        item.name = inner.first.Scalar();
        item.inputs = Inputs(absl::StrCat(key, ".", item.name), inner.second);
        items.push_back(std::move(item));
      }
      continue;
    }
    CLI::ConfigItem item;
    item.parents = ParentsOf(app, key);
    item.name = key;
    item.inputs = Inputs(key, value);
    items.push_back(std::move(item));
  }
  return items;
}

void AddConfigFlag(CLI::App& app) {
  app.set_config("--config", "",
                 "YAML file of flag: value (the long flags without --); flags on the command "
                 "line override it");
  app.config_formatter(std::make_shared<YamlConfig>(&app));
  app.allow_config_extras(CLI::config_extras_mode::error);
}

}  // namespace flotilla
