// Subcommands of the `kvsim` binary; each registers its options on the app and returns the
// function that runs it.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

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

}  // namespace kvsim::cli
