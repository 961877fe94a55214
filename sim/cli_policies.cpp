#include <cstdio>

#include "policies/policy.hpp"
#include "sim/cli.hpp"

namespace kvsim::cli {

Runner add_policies(CLI::App& app) {
  app.description(
      "List every registered policy: one-line description, provenance, and each parameter with "
      "its type, default, valid range and meaning. Set parameters with --set NAME.key=value or "
      "an INI file (--config) with one [NAME] section per policy. Then every preset: a named "
      "parameter set pinning one reference reading (e.g. snapkv:kvpress), with its source and "
      "its fully resolved parameters.");
  return [] {
    for (const auto& name : PolicyRegistry::instance().names()) {
      const PolicyInfo& p = PolicyRegistry::instance().get(name);
      std::printf("%s%s\n  %s\n  source: %s\n", p.name.c_str(),
                  p.lookahead ? "  [lookahead: reads future attention, upper reference]" : "",
                  p.summary.c_str(), p.provenance.c_str());
      for (const auto& s : p.params) {
        std::string range;
        if (s.type == ParamType::kInt || s.type == ParamType::kFloat)
          range =
              " in [" + CLI::detail::to_string(s.min) + ", " + CLI::detail::to_string(s.max) + "]";
        std::printf("    %-10s %-14s default %-6s%s  %s\n", s.name.c_str(),
                    param_type_name(s).c_str(), s.default_value.c_str(), range.c_str(),
                    s.doc.c_str());
      }
      std::printf("\n");
    }
    std::printf("Presets (use as --policy NAME; --set NAME.key=value still applies):\n\n");
    for (const auto& preset : policy_presets()) {
      const PolicyConfig c = make_policy_config(preset.name, {});
      std::printf("%s\n  %s\n  source: %s\n  resolved: %s\n\n", preset.name.c_str(),
                  preset.summary.c_str(), preset.provenance.c_str(), c.params.str().c_str());
    }
    return 0;
  };
}

}  // namespace kvsim::cli
