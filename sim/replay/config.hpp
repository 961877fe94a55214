// Policy parameter overrides from INI files (--config, read with Boost.Program_options) and from
// --set NAME.key=value, merged as {policy name -> {key -> value}}; --set wins over the file.
#pragma once

#include <istream>
#include <map>
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

// "h2o.budget=64" -> overrides["h2o"]["budget"] = "64".
void apply_set_option(const std::string& assignment, PolicyOverrides& overrides);

// The policies of a command line: --policy names (each once), overridden by the --config file,
// then --set (which must name a listed policy), then --budget where no budget was given.
// `verb` completes the --set error ("is not <verb> (add --policy NAME)"). With seeds > 1, a
// policy that declares `seed` and is given none runs once per seed 0 .. seeds − 1, labelled
// seeded_label(NAME, k) (--seeds: the random floor's mean and spread over draws).
std::vector<PolicyConfig> resolve_policy_list(const std::vector<std::string>& policies,
                                              const std::vector<std::string>& sets,
                                              const std::string& config, const std::string& budget,
                                              const std::string& verb, int seeds = 1);

}  // namespace kvsim
