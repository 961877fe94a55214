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

// "h2o.budget=64" -> overrides["h2o"]["budget"] = "64".
void apply_set_option(const std::string& assignment, PolicyOverrides& overrides);

}  // namespace kvsim
