#include "policies/policy_config.hpp"

#include <algorithm>
#include <boost/program_options.hpp>
#include <cstdio>
#include <fstream>
#include <stdexcept>

namespace kvsim {

namespace po = boost::program_options;

namespace {

// Boost's what() substitutes placeholders such as %canonical_option% into its message until none
// is left, so a line that itself contains one never terminates (found by fuzzing): the message is
// built here from the error's kind and the offending text instead.
std::string ini_error(const po::error& e) {
  if (const auto* s = dynamic_cast<const po::invalid_syntax*>(&e)) {
    const char* why = s->kind() == po::invalid_syntax::unrecognized_line
                          ? "not a [section], a key = value or a comment"
                          : "invalid syntax";
    return "line '" + s->tokens() + "': " + why;
  }
  if (const auto* n = dynamic_cast<const po::error_with_option_name*>(&e))
    return "key '" + n->get_option_name() + "': not a valid entry";
  return "not a valid INI file";
}

}  // namespace

PolicyOverrides read_policy_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument(path + ": cannot open config file");
  return read_policy_config(in, path);
}

PolicyOverrides read_policy_config(std::istream& in, const std::string& path) {
  PolicyOverrides out;
  try {
    po::options_description none;
    const po::parsed_options parsed = po::parse_config_file(in, none, /*allow_unregistered=*/true);
    for (const auto& opt : parsed.options) {
      const auto dot = opt.string_key.find('.');
      if (dot == std::string::npos)
        throw std::invalid_argument(path + ": key '" + opt.string_key +
                                    "' is outside a [policy] section");
      if (opt.value.size() != 1)
        throw std::invalid_argument(path + ": key '" + opt.string_key + "' needs one value");
      out[opt.string_key.substr(0, dot)][opt.string_key.substr(dot + 1)] = opt.value[0];
    }
  } catch (const po::error& e) {
    throw std::invalid_argument(path + ": " + ini_error(e));
  }
  return out;
}

SweepFile read_sweep_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument(path + ": cannot open sweep file");
  return read_sweep_file(in, path);
}

SweepFile read_sweep_file(std::istream& in, const std::string& path) {
  SweepFile out;
  try {
    po::options_description none;
    const po::parsed_options parsed = po::parse_config_file(in, none, /*allow_unregistered=*/true);
    for (const auto& opt : parsed.options) {
      const std::string& key = opt.string_key;
      if (opt.value.size() != 1)
        throw std::invalid_argument(path + ": key '" + key + "' needs one value");
      const std::string& v = opt.value[0];
      if (key == "sweep.trace")
        out.traces.push_back(v);
      else if (key == "sweep.sample")
        out.samples.push_back(v);
      else if (key == "sweep.policy")
        out.policies.push_back(v);
      else if (key == "sweep.budget")
        out.budget = v;
      else if (key.rfind("grid.", 0) == 0)
        out.grids.push_back(key.substr(5) + "=" + v);
      else if (key.rfind("set.", 0) == 0)
        out.sets.push_back(key.substr(4) + "=" + v);
      else
        throw std::invalid_argument(path + ": unknown key '" + key +
                                    "' (valid: [sweep] trace, "
                                    "sample, policy, budget; [grid] NAME.key; [set] NAME.key)");
    }
  } catch (const po::error& e) {
    throw std::invalid_argument(path + ": " + ini_error(e));
  }
  return out;
}

void apply_set_option(const std::string& assignment, PolicyOverrides& overrides) {
  const auto eq = assignment.find('=');
  const auto dot = assignment.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq || dot == 0 || dot + 1 == eq)
    throw std::invalid_argument("--set '" + assignment + "': expected NAME.key=value");
  overrides[assignment.substr(0, dot)][assignment.substr(dot + 1, eq - dot - 1)] =
      assignment.substr(eq + 1);
}

std::string expand_wildcard_sets(PolicyOverrides& overrides,
                                 const std::vector<std::string>& policies) {
  const auto star = overrides.find("*");
  if (star == overrides.end()) return "";
  const std::map<std::string, std::string> values = star->second;
  overrides.erase(star);
  std::string warning;
  for (const auto& [key, value] : values) {
    std::string lacking;
    bool any = false;
    for (const auto& name : policies) {
      if (!policy_declares(name, key)) {
        lacking += (lacking.empty() ? "" : ", ") + name;
        continue;
      }
      any = true;
      overrides[name].emplace(key, value);  // an explicit NAME.key wins
    }
    if (!any)
      throw std::invalid_argument("--set *." + key + "=" + value +
                                  ": no listed policy has a parameter '" + key + "'");
    if (!lacking.empty())
      warning += (warning.empty() ? "" : "; ") + std::string("--set *.") + key + "=" + value +
                 " leaves " + lacking + " as they are (no parameter '" + key + "')";
  }
  return warning;
}

std::optional<PolicyConfig> hold_to_budget(const PolicyConfig& config,
                                           const std::map<std::string, std::string>& chosen) {
  const auto wanted = equal_memory_overrides(config);
  if (!wanted) return std::nullopt;
  if (wanted->empty()) return config;
  std::map<std::string, std::string> values = config.params.values();
  for (const auto& [key, value] : *wanted) {
    const auto it = chosen.find(key);
    if (it != chosen.end() && it->second != value)
      throw std::invalid_argument("--equal-memory: " + config.label + "." + key + "=" + it->second +
                                  " holds more than the budget (equal memory sets " + key + " = " +
                                  value + "; drop one of the two)");
    values[key] = value;
  }
  PolicyConfig held = make_policy_config(config.info->name, values);
  held.label = config.label;
  return held;
}

namespace {

// The runs of one request: one, or one per seed when it draws and is given no seed; each held to
// its budget under equal memory (the labels of those that size their caches themselves go to
// `self_sizing`).
void add_runs(const PolicyRequest& request, const NamedPolicy& named, const PolicyListRules& rules,
              std::vector<PolicyConfig>& out, std::vector<std::string>& self_sizing) {
  std::map<std::string, std::string> params = request.chosen;
  apply_default_budget(named, rules.budget, params);
  std::vector<PolicyConfig> runs;
  if (rules.seeds <= 1 || params.count("seed") || !named.declares("seed")) {
    PolicyConfig c = make_policy_config(named, params);
    if (request.label) c.label = request.label(c);
    runs.push_back(std::move(c));
  } else {
    for (int k = 0; k < rules.seeds; ++k) {
      params["seed"] = std::to_string(k);
      runs.push_back(make_policy_config(named, params, seeded_label(named.name, k)));
    }
  }
  for (PolicyConfig& run : runs) {
    if (rules.equal_memory) {
      // What the user chose, as the configuration holds it (a grid's values normalised).
      std::map<std::string, std::string> chosen;
      for (const auto& [key, value] : request.chosen) {
        const auto held = run.params.values().find(key);
        chosen[key] = held == run.params.values().end() ? value : held->second;
      }
      if (std::optional<PolicyConfig> held = hold_to_budget(run, chosen))
        run = std::move(*held);
      else if (!run.info->keeps_everything)
        self_sizing.push_back(run.label);
    }
    out.push_back(std::move(run));
  }
}

}  // namespace

std::vector<PolicyConfig> build_policy_list(const std::vector<PolicyRequest>& requests,
                                            const PolicyListRules& rules,
                                            const std::function<void(const std::string&)>& warn) {
  // Each name once, in the order first asked for, with every key chosen for it in any request.
  std::vector<NamedPolicy> names;
  PolicyOverrides chosen_keys;
  for (const PolicyRequest& r : requests) {
    if (r.made) continue;
    if (std::none_of(names.begin(), names.end(),
                     [&](const NamedPolicy& n) { return n.name == r.name; }))
      names.push_back(resolve_policy_name(r.name));
    auto& keys = chosen_keys[r.name];
    keys.insert(r.chosen.begin(), r.chosen.end());
  }
  for (const std::string& w : {budget_ignored_warning(names, rules.budget),
                               budget_replaced_warning(names, chosen_keys, rules.budget)})
    if (!w.empty() && warn) warn(w);
  std::vector<PolicyConfig> out;
  std::vector<std::string> self_sizing;
  for (const PolicyRequest& r : requests) {
    if (r.made) {
      out.push_back(*r.made);
      continue;
    }
    const NamedPolicy& named = *std::find_if(
        names.begin(), names.end(), [&](const NamedPolicy& n) { return n.name == r.name; });
    add_runs(r, named, rules, out, self_sizing);
  }
  if (const std::string w = self_sizing_warning(self_sizing); !w.empty() && warn) warn(w);
  return out;
}

bool label_keeps_everything(const std::string& label) {
  try {
    return make_policy_config(label.substr(0, label.find_first_of("[@")), {})
        .info->keeps_everything;
  } catch (const std::invalid_argument&) {
    return false;
  }
}

std::string self_sizing_warning(const std::vector<std::string>& labels) {
  if (labels.empty()) return "";
  std::string names;
  for (const auto& l : labels) names += (names.empty() ? "" : ", ") + l;
  return "warning: --equal-memory: " + names +
         " size their caches themselves (no budget): compare them by the memory they held, "
         "apart from the budgeted policies";
}

std::vector<PolicyConfig> resolve_policy_list(const std::vector<std::string>& policies,
                                              const std::vector<std::string>& sets,
                                              const PolicyListOptions& options) {
  PolicyOverrides overrides;
  if (!options.config.empty()) overrides = read_policy_config(options.config);
  for (const auto& [name, _] : overrides) make_policy_config(name, {});  // known names
  for (const auto& s : sets) {
    PolicyOverrides one;
    apply_set_option(s, one);
    const auto& [name, kv] = *one.begin();
    if (name != "*" && std::find(policies.begin(), policies.end(), name) == policies.end())
      throw std::invalid_argument("--set " + s + ": policy '" + name + "' is not " + options.verb +
                                  " (add --policy " + name + ")");
    for (const auto& [k, v] : kv) overrides[name][k] = v;
  }
  if (const std::string w = expand_wildcard_sets(overrides, policies); !w.empty())
    std::fprintf(stderr, "kvsim: warning: %s\n", w.c_str());
  std::vector<PolicyRequest> requests;
  for (const auto& name : policies) {
    if (std::any_of(requests.begin(), requests.end(),
                    [&](const PolicyRequest& r) { return r.name == name; }))
      throw std::invalid_argument("--policy " + name + " given twice");
    requests.push_back({.name = name, .chosen = overrides[name]});
  }
  return build_policy_list(
      requests,
      {.budget = options.budget, .seeds = options.seeds, .equal_memory = options.equal_memory},
      [](const std::string& w) { std::fprintf(stderr, "kvsim: %s\n", w.c_str()); });
}

}  // namespace kvsim
