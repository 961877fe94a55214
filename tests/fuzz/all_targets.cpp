#include "tests/fuzz/targets.hpp"

namespace kvsim::fuzz {

const std::vector<NamedTarget>& all_targets() {
  static const std::vector<NamedTarget> targets = {
      {"safetensors", safetensors}, {"config_json", config_json}, {"kvtrace", kvtrace},
      {"kvprompt", kvprompt},       {"ini_config", ini_config},   {"cli_values", cli_values},
      {"result_table", result_table}};
  return targets;
}

}  // namespace kvsim::fuzz
