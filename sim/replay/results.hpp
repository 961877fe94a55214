// Replay outputs: the per-step CSV (--out), its policies sidecar, the per-layer summary
// (--summary), the stdout comparison table, and the decisions dump (--dump-decisions).
// Column meanings are documented in docs/outputs.md.
#pragma once

#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "analysis/bootstrap.hpp"
#include "core/csv_format.hpp"
#include "core/partial_files.hpp"
#include "sim/replay/engine.hpp"
#include "sim/run/result_files.hpp"
#include "traces/hdf5_util.hpp"

namespace kvsim {

// One row per (policy, sample, layer, KV head, decode step).
class StepCsvWriter {
 public:
  StepCsvWriter(const std::string& path, const std::vector<PolicyConfig>& policies);
  static std::string header();  // the engine's columns, then every registered metric's
  ~StepCsvWriter();
  void write(const LayerResult& r);
  void close();

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  std::vector<std::string> labels_;
  std::vector<bool> counts_;  // per observed column: an integer count
  std::string buffer_;
};

// `<csv path without .csv>.policies.csv`: where write_policies_sidecar writes.
std::string policies_sidecar_path(const std::string& csv_path);
// Writes policies_sidecar_path(csv_path): label, policy, lookahead, params, notes (what the
// policy adjusted on some samples, e.g. a window clamped to the budget; "; "-separated).
void write_policies_sidecar(const std::string& csv_path, const std::vector<PolicyConfig>& policies,
                            const std::map<std::string, std::vector<std::string>>& notes = {});

// The sums of a run of decode steps' metrics (StepMetrics): what every aggregate of the per-step
// results (replay's summary and table, a sweep's item rows) is computed from, so that they agree.
struct StepSums {
  double cache = 0, attended = 0, recall = 0, error = 0, value_error = 0, kv_bytes = 0;
  double min_recall = 1e30;
  double prefill_kept = 0;          // per layer: the fewest entries a head kept after the prefill
  long count = 0, error_count = 0;  // steps, and steps with output errors (the trace has v)
  void add(const StepMetrics& m);
  void merge(const StepSums& a);
};

// Aggregates results per (policy, sample, layer) and overall. The overall figures fold the
// per-layer sums in (sample, layer) order, so a replay resumed from finished samples
// (add_sample_state) prints and writes the same bytes as one that ran straight through. Overall
// figures carry the number of samples and 95% percentile-bootstrap intervals over samples
// (analysis/bootstrap.hpp); the runs of a policy over seeds (--seeds) are also reported together.
class Summary {
 public:
  explicit Summary(const std::vector<PolicyConfig>& policies, int kv_heads = 0)
      : policies_(policies), kv_heads_(kv_heads) {}
  void add(const LayerResult& r);
  void write_csv(const std::string& path) const;
  // The human-readable comparison table printed by `kvsim replay`.
  std::string table() const;
  // Per reported row: the mean over samples of each sample's pooled figures (NaN without any).
  struct SampleMeans {
    std::string label;
    long samples = 0;
    double output_rel_error = NAN, mass_recall = NAN;
  };
  std::vector<SampleMeans> sample_means() const;
  // What `sample` contributed, exactly (hexadecimal floating point): what a checkpoint keeps.
  std::string sample_state(const std::string& sample) const;
  // Adds a sample_state() back; throws std::runtime_error naming `origin` when it is malformed.
  void add_sample_state(const std::string& sample, const std::string& state,
                        const std::string& origin);

 private:
  struct PerSample {
    long steps = 0;   // decode steps of the sample
    int budget = -1;  // resolved budget in entries; -1 without one
    // Entries held at each decode step (stored minus the step's own token: what the policy kept
    // through its last hook), summed over layers and cache heads; the peak over the steps.
    std::vector<long> held_by_step;
    long peak_restored = -1;  // the peak, as a checkpoint kept it
    int layers = 0;
    int cache_heads = 0;  // per layer
    long peak_held() const;
  };
  struct Total {
    StepSums acc;
    long layers = 0, steps = 0;
  };
  // One row of the reports: a policy, or the runs of one policy over seeds pooled (members in
  // run order, labelled by seed_group_of). `samples` holds what each sample contributed, summed
  // over layers and members, in sample order: what intervals resample.
  struct Reported {
    std::string label;
    std::vector<int> members;
    Total total;
    std::vector<StepSums> samples;
    Interval recall_ci, error_ci, value_error_ci;
    MeanSd recall_over_seeds, error_over_seeds;  // each member's overall figure (seed groups)
    // Peak entries held per (layer, KV head), the largest over samples; and the sample whose peak
    // differs most from its budget, as peak / budget (NaN without a budget or decode steps).
    double peak_held = NAN, held_over_budget = NAN;
    bool sizes_itself = false;  // no budget (and not the full cache)
  };
  std::vector<Reported> reported() const;
  Reported report(const std::string& label, const std::vector<int>& members,
                  const std::map<int, Total>& all) const;
  std::vector<PolicyConfig> policies_;
  int kv_heads_;  // of the trace: held entries are reported per KV head (0: per cache head)
  std::map<std::tuple<int, std::string, int>, StepSums> per_layer_;  // (policy, sample, layer)
  std::map<std::pair<int, std::string>, PerSample> per_sample_;      // (policy, sample)
  // Every policy with results: the per-layer sums folded in (sample, layer) order.
  std::map<int, Total> totals() const;
  // The resolved budget of a policy over every sample: "128", "96-128" when samples differ, ""
  // without a budget.
  std::string budget_entries(int policy) const;
  // The table's budget cell: the budget as given, what it resolved to, the lookahead mark.
  std::string budget_cell(int policy) const;
  // The table's line of one row (label, budget cell and held/budget cell given, widths w, bw).
  static std::string table_line(const Reported& r, const std::string& label, int w,
                                const std::string& budget, int bw, const std::string& held);
};

// --dump-decisions: one group per policy (named by its label, attribute `params`), then
// samples/<name>/layers/<l>/heads/<g>/evicted int32 [N, 2] (step, position) in eviction order,
// step -1 for the end of the prefill; merging policies add merged int32 [M, 3].
class DecisionWriter {
 public:
  DecisionWriter(const std::string& path, const std::vector<PolicyConfig>& policies);
  void write(const LayerResult& r);
  // Copies what the DecisionWriter file `from` holds for `sample` (every policy's group).
  void copy_sample(const std::string& from, const std::string& sample);
  void close();

 private:
  std::string path_;
  std::vector<PolicyConfig> policies_;
  H5Handle file_;
};

}  // namespace kvsim
