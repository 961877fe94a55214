#include "sim/replay/config.hpp"

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

std::vector<PolicyConfig> resolve_policy_list(const std::vector<std::string>& policies,
                                              const std::vector<std::string>& sets,
                                              const std::string& config, const std::string& budget,
                                              const std::string& verb, int seeds) {
  PolicyOverrides overrides;
  if (!config.empty()) overrides = read_policy_config(config);
  for (const auto& [name, _] : overrides) make_policy_config(name, {});  // known names
  for (const auto& s : sets) {
    PolicyOverrides one;
    apply_set_option(s, one);
    const auto& [name, kv] = *one.begin();
    if (std::find(policies.begin(), policies.end(), name) == policies.end())
      throw std::invalid_argument("--set " + s + ": policy '" + name + "' is not " + verb +
                                  " (add --policy " + name + ")");
    for (const auto& [k, v] : kv) overrides[name][k] = v;
  }
  for (const std::string& w : {budget_ignored_warning(policies, budget),
                               budget_replaced_warning(policies, overrides, budget)})
    if (!w.empty()) std::fprintf(stderr, "kvsim: %s\n", w.c_str());
  std::vector<PolicyConfig> out;
  for (const auto& name : policies) {
    if (std::any_of(out.begin(), out.end(), [&](const PolicyConfig& c) { return c.label == name; }))
      throw std::invalid_argument("--policy " + name + " given twice");
    auto ov = overrides.count(name) ? overrides.at(name) : std::map<std::string, std::string>{};
    apply_default_budget(name, budget, ov);
    if (seeds <= 1 || ov.count("seed") || !policy_declares(name, "seed")) {
      out.push_back(make_policy_config(name, ov));
      continue;
    }
    for (int k = 0; k < seeds; ++k) {
      ov["seed"] = std::to_string(k);
      out.push_back(make_policy_config(seeded_label(name, k), ov));
    }
  }
  return out;
}

}  // namespace kvsim
