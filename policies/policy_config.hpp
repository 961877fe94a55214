// Policy parameter overrides from INI files (--config, read with Boost.Program_options) and from
// --set NAME.key=value, merged as {policy name -> {key -> value}}; --set wins over the file.
#pragma once

#include <functional>
#include <istream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "policies/policy.hpp"

namespace kvsim {

using PolicyOverrides = std::map<std::string, std::map<std::string, std::string>>;

// INI: one section per policy, e.g.
//   [h2o]
//   budget = 20%
//   recent = 50%
// Throws std::invalid_argument naming the file and the offending line or key.
PolicyOverrides read_policy_config(const std::string& path);
PolicyOverrides read_policy_config(std::istream& in, const std::string& path);  // path: for errors

// A sweep file (INI, Boost.Program_options): a [sweep] section with repeatable `trace`, `sample`,
// `policy` and a `budget`; a [grid] section of `NAME.key = v1,v2,...` or `start:stop:step` axes;
// a [set] section of `NAME.key = value`. Command-line options add to it.
struct SweepFile {
  std::vector<std::string> traces, samples, policies, grids, sets;
  std::string budget;
};
SweepFile read_sweep_file(const std::string& path);
SweepFile read_sweep_file(std::istream& in, const std::string& path);

// "h2o.budget=64" -> overrides["h2o"]["budget"] = "64"; "*.decode=cap" -> overrides["*"].
void apply_set_option(const std::string& assignment, PolicyOverrides& overrides);

// Moves the `*` entry of `overrides` (--set '*.key=value') onto every policy of `policies` that
// declares the key (an explicit NAME.key wins). Returns a warning naming, per key, the policies
// that do not have it ("" when every policy has every key); throws when none has a key.
std::string expand_wildcard_sets(PolicyOverrides& overrides,
                                 const std::vector<std::string>& policies);

// --equal-memory on one configuration: `config` with equal_memory_overrides applied (its label
// kept), or std::nullopt for a policy that sizes its cache itself. `chosen` holds the keys the
// user set for it (--set, --config, a grid axis): one that equal memory must change is an error
// naming the policy, the key and why.
std::optional<PolicyConfig> hold_to_budget(const PolicyConfig& config,
                                           const std::map<std::string, std::string>& chosen);
// The warning for policies that --equal-memory cannot hold to a budget ("" when none).
std::string self_sizing_warning(const std::vector<std::string>& labels);

// Whether a result label ("full", "full@x", "NAME[k=v,...]", "NAME@seedK") names a policy that
// keeps every entry (the full cache); false for a name kvsim does not know.
bool label_keeps_everything(const std::string& label);

// One policy of a run as the user asked for it: the policy or preset `name` with the parameters
// chosen for it (--config and --set, a sweep's grid point, a Python dict), labelled `name` or by
// what `label` makes of its configuration (a sweep's grid label); or a configuration made
// elsewhere (`made`: a Python policy object), passed through in its place.
struct PolicyRequest {
  std::string name;
  std::map<std::string, std::string> chosen;
  std::function<std::string(const PolicyConfig&)> label;
  std::optional<PolicyConfig> made;
};

// How a run's policy list is built: the --budget for every policy that declares one and is given
// none, the seeds of a policy that draws and is given no seed (one run per seed 0 .. seeds − 1,
// labelled seeded_label(NAME, k); `label` is then unused), and --equal-memory (hold_to_budget
// on every configuration).
struct PolicyListRules {
  std::string budget;
  int seeds = 1;
  bool equal_memory = false;
};

// The one builder of a run's policies (the command line's replay and live evaluation, sweeps,
// Python): resolves each name once, calls `warn` with what the run must say before it starts (a
// budget some policies ignore, one that replaces a policy's own default, then the policies equal
// memory cannot hold), and returns the configurations in request order.
std::vector<PolicyConfig> build_policy_list(const std::vector<PolicyRequest>& requests,
                                            const PolicyListRules& rules,
                                            const std::function<void(const std::string&)>& warn);

struct PolicyListOptions {
  std::string config;             // --config: INI file
  std::string budget;             // --budget
  std::string verb = "replayed";  // completes the --set error ("is not <verb> (add --policy NAME)")
  // A policy that declares `seed` and is given none runs once per seed 0 .. seeds − 1, labelled
  // seeded_label(NAME, k) (--seeds: the random floor's mean and spread over draws).
  int seeds = 1;
  bool equal_memory = false;  // --equal-memory: hold_to_budget on every policy
};

// The policies of a command line: --policy names (each once), overridden by the --config file,
// then --set (which must name a listed policy, or `*`), then --budget where no budget was given;
// then the seeds and equal memory of `options`.
std::vector<PolicyConfig> resolve_policy_list(const std::vector<std::string>& policies,
                                              const std::vector<std::string>& sets,
                                              const PolicyListOptions& options);

}  // namespace kvsim
