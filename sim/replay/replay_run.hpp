// What `kvsim replay` does with a trace: every sample through the policies into the outputs asked
// for, one finished sample at a time, so that an interrupted replay keeps what it finished.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "sim/replay/engine.hpp"
#include "sim/replay/results.hpp"

namespace kvsim {

struct ReplayOutputs {
  std::string steps_csv;     // --out: per step, with NAME.policies.csv beside it
  std::string summary_csv;   // --summary: per layer and overall
  std::string decisions_h5;  // --dump-decisions
  std::string bounds_csv;    // --bounds (the replay's options then hold bounds_check)
  double bounds_epsilon = 0.01;
  // Where finished samples are kept until the outputs are written. Empty: beside the first
  // output, as "<output>.checkpoint". No output asked for: nothing is kept.
  std::string checkpoint;
  bool any() const;
  std::string checkpoint_dir() const;
};

struct ReplayRunReport {
  std::string table;  // the comparison table over every sample
  // Per reported row (a policy, or a seed group): the mean over samples of each sample's pooled
  // output error and mass recall (what a prediction card's map reads).
  std::vector<Summary::SampleMeans> sample_means;
  int samples_resumed = 0;
  std::string checkpoint_dir;  // empty when nothing was kept
  long theorem_rows = 0, theorem_failures = 0, flushes = 0, corollary_failures = 0;
  // What policies noted while replaying (e.g. a budget that ran dry), each once with the number
  // of samples; also in the policies sidecar of --out.
  std::vector<std::string> notes;
};

// Replays `samples` (names of the trace at `trace_path`, each at most once) through `policies`.
// Each sample's results are complete in the checkpoint directory before the next sample's are
// delivered; a rerun of the same command skips the samples found finished there (a checkpoint of
// another replay is refused, naming what differs). Once every sample is finished the outputs are
// assembled in `samples` order, byte for byte what a replay without interruption writes, and the
// checkpoint is removed. `on_layer` is called after each replayed layer; `notes` go into the
// policies sidecar of --out.
ReplayRunReport run_replay(const std::string& trace_path, const TraceReader& reader,
                           const std::vector<PolicyConfig>& policies, const ReplayOptions& options,
                           const std::vector<std::string>& samples, const ReplayOutputs& outputs,
                           const std::map<std::string, std::vector<std::string>>& notes,
                           const std::function<void()>& on_layer = {});

// The manifest of a replay's checkpoint: what its finished samples depend on.
std::string replay_manifest(const std::string& trace_hash,
                            const std::vector<PolicyConfig>& policies, const ReplayOptions& options,
                            const ReplayOutputs& outputs);

}  // namespace kvsim
