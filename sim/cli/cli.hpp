// Subcommands of the `kvsim` binary; each registers its options on the app and returns the
// function that runs it.
#pragma once

#include <CLI/CLI.hpp>
#include <algorithm>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "traces/kvtrace.hpp"

namespace kvsim::cli {

using Runner = std::function<int()>;

Runner add_synth(CLI::App& app);
Runner add_inspect(CLI::App& app);
Runner add_replay(CLI::App& app);
Runner add_policies(CLI::App& app);
Runner add_stats(CLI::App& app);
Runner add_figures(CLI::App& app);
Runner add_sweep(CLI::App& app);
Runner add_live(CLI::App& app);
Runner add_compare(CLI::App& app);
Runner add_compact(CLI::App& app);

// The longest window of prompt rows any policy or preset reads at its defaults (at least 64):
// what a compact trace keeps by default (kvsim compact, kvsim live capture --compact), so that
// every such run replays from it.
int default_compact_window();

// -p values split at the commas outside brackets: "h2o,tova[budget=20%,recent=5%]" is two
// policies (a sweep's labels hold commas); empty items are dropped.
inline std::vector<std::string> split_policy_list(const std::vector<std::string>& given) {
  std::vector<std::string> out;
  for (const std::string& g : given) {
    int depth = 0;
    std::string item;
    for (char c : g) {
      depth += c == '[' ? 1 : (c == ']' && depth > 0 ? -1 : 0);
      if (c == ',' && depth == 0) {
        if (!item.empty()) out.push_back(item);
        item.clear();
      } else {
        item += c;
      }
    }
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// -j/--threads: a positive count, or 0 for every core of the machine.
inline CLI::Option* add_threads_option(CLI::App& app, int& threads, const std::string& help) {
  return app.add_option("-j,--threads", threads, help + " (0: every core)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber)
      ->transform([](std::string value) {
        const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
        return value == "0" ? std::to_string(cores) : value;
      });
}

// --seeds: how many draws of a policy that has a `seed` parameter (the random floor) each run
// makes when no seed is given; results report their mean and their spread over seeds.
inline constexpr int kDefaultSeeds = 5;
inline CLI::Option* add_seeds_option(CLI::App& app, int& seeds) {
  return app
      .add_option("--seeds", seeds,
                  "Runs of each policy with a `seed` parameter (random) and no seed given: seeds "
                  "0..N-1, labelled NAME@seedK, reported together as their mean and spread")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
}

// --equal-memory: every budgeted policy holds at most its budget's entries after every hook
// (equal_memory_overrides, policies/policy.hpp); policies that size their caches themselves are
// named in a warning and reported apart.
inline CLI::Option* add_equal_memory_flag(CLI::App& app, bool& equal_memory) {
  return app.add_flag(
      "--equal-memory", equal_memory,
      "Hold every budgeted policy to its budget at every step (decode=cap where it would grow, "
      "its own decoding eviction where it has one, the recycle bin or kept text inside the "
      "budget: docs/policies.md); policies that size their caches themselves are reported apart");
}

// --prompt-tail N|question: every policy compresses the prompt less its last N tokens (or its
// question), which are then fed as decode steps against the compressed cache, so that the first
// answer token is computed from the compressed cache (ReplayOptions::prompt_tail).
inline CLI::Option* add_prompt_tail_option(CLI::App& app, std::string& tail) {
  return app
      .add_option("--prompt-tail", tail,
                  "Compress the prompt less its last N tokens (or its question: 'question'), "
                  "then feed those as decode steps against the compressed cache, so no answer "
                  "token comes from the full prompt; the steps then start with them "
                  "(docs/commands.md)")
      ->check([](const std::string& v) {
        try {
          parse_prompt_tail(v);
          return std::string();
        } catch (const std::invalid_argument& e) {
          return std::string(e.what());
        }
      });
}
// What the run's header says of its prompt tail ("" without one).
inline std::string prompt_tail_note(const std::string& tail) {
  if (tail.empty() || parse_prompt_tail(tail) == 0) return "";
  return "; the prompt's last " + (tail == "question" ? "question" : tail + " token(s)") +
         " fed after compression (steps start with them)";
}

}  // namespace kvsim::cli
