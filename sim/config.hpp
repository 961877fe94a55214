// Policy parameter overrides from INI files (--config, read with Boost.Program_options) and from
// --set NAME.key=value, merged as {policy name -> {key -> value}}; --set wins over the file.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace kvsim {

using PolicyOverrides = std::map<std::string, std::map<std::string, std::string>>;

// INI: one section per policy, e.g.
//   [h2o]
//   budget = 20%
//   recent = 50%
// Throws std::invalid_argument naming the file and the offending line or key.
PolicyOverrides read_policy_config(const std::string& path);

// A sweep file (INI, Boost.Program_options): a [sweep] section with repeatable `trace`, `sample`,
// `policy` and a `budget`; a [grid] section of `NAME.key = v1,v2,...` or `start:stop:step` axes;
// a [set] section of `NAME.key = value`. Command-line options add to it.
struct SweepFile {
  std::vector<std::string> traces, samples, policies, grids, sets;
  std::string budget;
};
SweepFile read_sweep_file(const std::string& path);

// "h2o.budget=64" -> overrides["h2o"]["budget"] = "64".
void apply_set_option(const std::string& assignment, PolicyOverrides& overrides);

}  // namespace kvsim
