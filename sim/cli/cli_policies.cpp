#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>

#include "policies/policy.hpp"
#include "sim/cli/cli.hpp"

namespace kvsim::cli {

namespace {

std::string range_of(const ParamSpec& s) {
  if (s.type != ParamType::kInt && s.type != ParamType::kFloat) return "";
  return " in [" + CLI::detail::to_string(s.min) + ", " + CLI::detail::to_string(s.max) + "]";
}

void print_policy(const PolicyInfo& p) {
  std::printf("%s%s\n  %s\n  source: %s\n", p.name.c_str(),
              p.lookahead ? "  [lookahead: reads future attention, upper reference]" : "",
              p.summary.c_str(), p.provenance.c_str());
  for (const auto& s : p.params)
    std::printf("    %-10s %-14s default %-6s%s  %s\n", s.name.c_str(), param_type_name(s).c_str(),
                s.default_value.c_str(), range_of(s).c_str(), s.doc.c_str());
  std::printf("\n");
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
      throw std::invalid_argument("no policy or preset '" + n + "' (known: " + valid + ")");
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
      "  kvsim policies --json > policies.json");
  auto names = std::make_shared<std::vector<std::string>>();
  auto json = std::make_shared<bool>(false);
  app.add_option("names", *names, "Policies or presets to show (default: all)");
  app.add_flag("--json", *json,
               "Print JSON: {policies: [...], presets: [...]}, as kvsim.policies()");
  return [names, json] {
    const auto [policies, presets] = select(*names);
    const auto& registry = PolicyRegistry::instance();
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
