// kvsim: a trace replayer and simulator for KV-cache eviction policies of multimodal LLMs.
#include <cstdio>
#include <exception>
#include <map>

#include "sim/cli.hpp"

int main(int argc, char** argv) {
  CLI::App app{"kvsim " KVSIM_VERSION
               " - replay attention traces (kvtrace v1) through KV-cache eviction policies"};
  app.require_subcommand(1);
  app.set_version_flag("--version", KVSIM_VERSION);
  std::map<CLI::App*, kvsim::cli::Runner> runners;
  auto add = [&](const char* name, const char* about, auto adder) {
    CLI::App* sub = app.add_subcommand(name, about);
    runners[sub] = adder(*sub);
  };
  add("synth", "Write a synthetic multimodal kvtrace v1 file", kvsim::cli::add_synth);
  add("inspect", "Summarise and validate a kvtrace v1 file", kvsim::cli::add_inspect);
  add("replay", "Replay a trace through eviction policies and measure what they lose",
      kvsim::cli::add_replay);
  add("policies", "List every policy with its parameters, defaults and provenance",
      kvsim::cli::add_policies);
  CLI11_PARSE(app, argc, argv);
  try {
    for (auto& [sub, run] : runners)
      if (sub->parsed()) return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvsim: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
