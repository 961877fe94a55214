#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>

#include "core/suggest.hpp"
#include "policies/policy.hpp"
#include "sim/cli/cli.hpp"

namespace kvsim::cli {

namespace {

std::string range_of(const ParamSpec& s) {
  if (s.type != ParamType::kInt && s.type != ParamType::kFloat) return "";
  return " in [" + CLI::detail::to_string(s.min) + ", " + CLI::detail::to_string(s.max) + "]";
}

const char* lookahead_mark(const PolicyInfo& p) {
  return p.lookahead ? "  [lookahead: reads future attention, upper reference]" : "";
}

// Columns as wide as this policy's longest name, type (with its range) and default, so that
// every parameter's meaning starts in one column.
void print_policy(const PolicyInfo& p) {
  std::printf("%s%s\n  %s\n  source: %s\n", p.name.c_str(), lookahead_mark(p), p.summary.c_str(),
              p.provenance.c_str());
  int name_width = 0, type_width = 0, default_width = 0;
  for (const auto& s : p.params) {
    name_width = std::max<int>(name_width, s.name.size());
    type_width = std::max<int>(type_width, (param_type_name(s) + range_of(s)).size());
    default_width = std::max<int>(default_width, s.default_value.size());
  }
  for (const auto& s : p.params)
    std::printf("    %-*s  %-*s  default %-*s  %s\n", name_width, s.name.c_str(), type_width,
                (param_type_name(s) + range_of(s)).c_str(), default_width, s.default_value.c_str(),
                s.doc.c_str());
  std::printf("\n");
}

// --brief: a line per policy and per preset.
void print_brief(const std::vector<std::string>& policies,
                 const std::vector<const PolicyPreset*>& presets) {
  int policy_width = 0, preset_width = 0;
  for (const auto& n : policies) policy_width = std::max<int>(policy_width, n.size());
  for (const PolicyPreset* p : presets) preset_width = std::max<int>(preset_width, p->name.size());
  const auto& registry = PolicyRegistry::instance();
  for (const auto& n : policies) {
    const PolicyInfo& p = registry.get(n);
    std::printf("%-*s  %s%s\n", policy_width, n.c_str(), p.summary.c_str(), lookahead_mark(p));
  }
  if (!presets.empty() && !policies.empty()) std::printf("\nPresets:\n");
  for (const PolicyPreset* p : presets)
    std::printf("%-*s  %s\n", preset_width, p->name.c_str(), p->summary.c_str());
}

nlohmann::json policy_json(const PolicyInfo& p) {
  nlohmann::json params = nlohmann::json::array();
  for (const auto& s : p.params) {
    nlohmann::json j = {{"name", s.name},
                        {"type", param_type_name(s)},
                        {"default", s.default_value},
                        {"doc", s.doc}};
    if (s.type == ParamType::kInt || s.type == ParamType::kFloat)
      j["min"] = s.min, j["max"] = s.max;
    if (!s.choices.empty()) j["choices"] = s.choices;
    params.push_back(j);
  }
  return {{"name", p.name},           {"summary", p.summary}, {"provenance", p.provenance},
          {"lookahead", p.lookahead}, {"merges", p.merges},   {"params", params}};
}

// The policies and presets NAMES select (all when empty): a policy name selects it and its
// presets, a preset name the preset alone. Unknown names are an error listing the valid ones.
std::pair<std::vector<std::string>, std::vector<const PolicyPreset*>> select(
    const std::vector<std::string>& names) {
  const auto& registry = PolicyRegistry::instance();
  std::set<std::string> wanted(names.begin(), names.end()), known;
  for (const auto& n : registry.names()) known.insert(n);
  for (const auto& p : policy_presets()) known.insert(p.name);
  for (const auto& n : wanted)
    if (!known.count(n)) {
      std::string valid;
      for (const auto& k : known) valid += (valid.empty() ? "" : ", ") + k;
      throw std::invalid_argument("no policy or preset '" + n + "'" +
                                  did_you_mean(n, {known.begin(), known.end()}) +
                                  " (known: " + valid + ")");
    }
  std::vector<std::string> policies;
  std::vector<const PolicyPreset*> presets;
  for (const auto& n : registry.names())
    if (wanted.empty() || wanted.count(n)) policies.push_back(n);
  for (const auto& p : policy_presets())
    if (wanted.empty() || wanted.count(p.name) || wanted.count(p.policy)) presets.push_back(&p);
  return {policies, presets};
}

}  // namespace

Runner add_policies(CLI::App& app) {
  app.description(
      "List the registered policies (or the NAMEs given): one-line description, provenance, and "
      "each parameter with its type, default, valid range and meaning. Set parameters with --set "
      "NAME.key=value or an INI file (--config) with one [NAME] section per policy. Then the "
      "presets: named parameter sets pinning one reference reading (e.g. snapkv:kvpress), with "
      "their source and fully resolved parameters.");
  app.footer(
      "Examples:\n  kvsim policies                  every policy and preset\n"
      "  kvsim policies snapkv hae:table1  SnapKV with its presets, and one HAE preset\n"
      "  kvsim policies --brief          a line per policy and preset\n"
      "  kvsim policies --json > policies.json");
  auto names = std::make_shared<std::vector<std::string>>();
  auto json = std::make_shared<bool>(false);
  auto brief = std::make_shared<bool>(false);
  app.add_option("names", *names, "Policies or presets to show (default: all)");
  app.add_flag("--brief", *brief, "A line per policy and preset: the name and what it does");
  app.add_flag("--json", *json,
               "Print JSON: {policies: [...], presets: [...]}, as kvsim.policies()")
      ->excludes("--brief");
  return [names, json, brief] {
    const auto [policies, presets] = select(*names);
    const auto& registry = PolicyRegistry::instance();
    if (*brief) {
      print_brief(policies, presets);
      return 0;
    }
    if (*json) {
      nlohmann::json out = {{"policies", nlohmann::json::array()},
                            {"presets", nlohmann::json::array()}};
      for (const auto& n : policies) out["policies"].push_back(policy_json(registry.get(n)));
      for (const PolicyPreset* p : presets)
        out["presets"].push_back({{"name", p->name},
                                  {"policy", p->policy},
                                  {"summary", p->summary},
                                  {"provenance", p->provenance},
                                  {"params", make_policy_config(p->name, {}).params.str()}});
      std::printf("%s\n", out.dump(2).c_str());
      return 0;
    }
    for (const auto& n : policies) print_policy(registry.get(n));
    if (presets.empty()) return 0;
    std::printf("Presets (use as --policy NAME; --set NAME.key=value still applies):\n\n");
    for (const PolicyPreset* preset : presets)
      std::printf("%s\n  %s\n  source: %s\n  resolved: %s\n\n", preset->name.c_str(),
                  preset->summary.c_str(), preset->provenance.c_str(),
                  make_policy_config(preset->name, {}).params.str().c_str());
    return 0;
  };
}

}  // namespace kvsim::cli
