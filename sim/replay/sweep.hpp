// Hyperparameter sweeps: traces x samples x policy configurations. All configurations of one
// (trace, sample) replay together, so they share one attention computation per layer. Each
// finished (trace, sample, configuration) is written atomically under a key derived from the
// trace's content hash, the sample, the policy, its resolved parameters and the kvsim version:
// rerunning a sweep skips what is done. While a (trace, sample) replays, its configurations'
// finished layers are kept beside their items (one .progress file), so a killed sweep loses at
// most the layer in flight:
// the rerun resumes the item at its next layer, each policy instance first seeing the prefill of
// the layers below (the Policy contract: no decode-time state crosses layers), with the same
// results as an uninterrupted run.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "policies/policy_config.hpp"

namespace kvsim {

// "NAME.key=v1,v2", "NAME.key=start:stop:step" (inclusive stop; "5%:40%:5%" for percentages) or
// both ("5%:40%:5%,60%"), or a coupled axis "NAME.k1+k2=a1/b1,a2/b2" that moves several
// parameters together (ST3's (S, R) pairs). NAME "*" is every swept policy that has the
// parameter. Throws std::invalid_argument, also for a value given twice.
struct GridAxis {
  std::string policy, key;
  std::vector<std::string> values;
};
GridAxis parse_grid_axis(const std::string& text);

// Axes on the same policy and key become one (their values joined; a value given twice is
// refused); a key moved by two different axes is refused. Throws std::invalid_argument.
std::vector<GridAxis> merge_grid_axes(const std::vector<GridAxis>& axes);

// Every configuration of `policies` (names or presets) over the axes that name them (merged:
// merge_grid_axes); a policy with no axis contributes its single configuration. Labels are
// "name[key=value,...]", the values those the configuration holds.
std::vector<PolicyConfig> expand_grid(const std::vector<std::string>& policies,
                                      const std::vector<GridAxis>& axes,
                                      const PolicyOverrides& fixed);

// The configurations of a sweep's command line: --grid axes, --set fixed values ("NAME.key=v",
// or "*.key=v" for every policy that has the key), and --budget for every policy that has one
// and no grid or --set for it (an axis on the budget wins). `seeds` > 1 adds an axis seed = 0 ..
// seeds − 1 for every policy that declares `seed` and is given none; `equal_memory` holds every
// configuration to its budget (hold_to_budget, policies/policy_config.hpp).
struct SweepConfigOptions {
  int seeds = 1;
  bool equal_memory = false;
};
std::vector<PolicyConfig> sweep_configs(const std::vector<std::string>& policies,
                                        const std::vector<std::string>& grids,
                                        const std::vector<std::string>& sets,
                                        const std::string& budget,
                                        const SweepConfigOptions& options = {});

// A 64-bit hash of the file's bytes (four interleaved multiply-rotate lanes over 8-byte words, a
// splitmix64 finish), as 16 hex digits: the identity of a trace or prompt file for resuming.
std::string file_content_hash(const std::string& path);

struct SweepOptions {
  std::string out_dir;
  int threads = 1;
  std::vector<std::string> samples;  // empty: every sample
  // Called, before any work, with what a configuration adjusts on some samples (Policy::notes,
  // e.g. a window clamped to the budget), once per distinct note.
  std::function<void(const std::string&)> on_note;
};

struct SweepReport {
  long items_total = 0, items_done_before = 0, items_run = 0;
  // Items an interrupted run left part-way, resumed at their next layer: the layers they had,
  // of all their layers.
  long items_resumed = 0, layers_resumed = 0, layers_of_resumed = 0;
  // Per configuration, means over every (trace, sample, layer, KV head) row: the table printed at
  // the end of a sweep.
  std::string table;
  // What the configurations noted while replaying (e.g. MadaKV's dry budget): "LABEL: NOTE (K of
  // N sample(s))", N the (trace, sample) items; each (trace, sample) in out_dir/notes.csv.
  std::vector<std::string> notes;
};

// Every configuration is first created on every (trace, sample): those that cannot run are listed
// at once, with their traces and samples, in one std::invalid_argument, before any work.
// Runs the sweep, then writes out_dir/results.csv (every finished item, sorted): who made each row
// (trace, its hash, sample, label, policy, params), the budget as numbers (budget_entries,
// budget_fraction of the prompt; empty for policies without one), one column per parameter of any
// configuration (empty where a policy lacks it), then the measurements. `progress` is
// called after each replayed layer (or, under MPI, on rank 0 after each item handed out). Built
// with MPI and run by mpirun with more than one rank, rank 0 distributes (trace, sample) items to
// the other ranks and writes the results file; the bytes equal a single-process run's.
SweepReport run_sweep(const std::vector<std::string>& traces,
                      const std::vector<PolicyConfig>& configs, const SweepOptions& options,
                      const std::function<void(long, long)>& progress = {});

}  // namespace kvsim
