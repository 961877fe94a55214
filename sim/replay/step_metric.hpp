// Per-step metrics beyond the engine's own (StepMetrics): each is one registration in its own
// file under sim/replay/metrics/ that declares its columns and fills them, as an observer of
// every measured decode step, or of a layer's results of every policy (docs/extending.md).
//
// Every per-step result (replay --out, kvsim.replay, the snapshot) holds the engine's columns
// and then every registered metric's, in the order of the metrics' names; a metric that did not
// run leaves NaN (an empty CSV cell). A metric is `always` on, or runs when asked for by name
// (replay --metrics, kvsim.replay(metrics=...)).
#pragma once

#include <functional>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "sim/replay/engine.hpp"

namespace kvsim {

struct MetricColumn {
  std::string name;    // the column's name in every per-step result
  bool count = false;  // an integer: written without a fraction (Python: nullable Int64)
};

// One metric's work in one policy's replay of one layer: made fresh for each, so it may keep
// scratch space and running sums.
class StepObserver {
 public:
  virtual ~StepObserver() = default;
  // After KV head `kv_head` attended at decode step `step` (the layer's numbering): writes this
  // metric's columns to `values`. `previous` holds them at the measured step before (nullptr at
  // the first), for running sums. `ref` is the layer's full-cache attention measured against.
  virtual void observe(const LayerAttention& ref, const KvCache& cache, int step, int kv_head,
                       const float* previous, float* values) = 0;
};

// Where a metric's columns sit in a LayerResult's observed values.
struct ObservedColumns {
  int first = 0;  // its first column among all registered metrics' columns
  float& at(LayerResult& r, int kv_head, int step, int column) const {
    return r
        .observed[kv_head][static_cast<std::size_t>(step) * r.observed_columns + first + column];
  }
};

struct StepMetricInfo {
  std::string name;         // what --metrics and kvsim.replay(metrics=...) call it
  std::string description;  // one line (replay --help)
  std::vector<MetricColumn> columns;
  bool always = false;  // runs in every replay; otherwise only when asked for
  // The statistics of the full-cache attention it reads (LayerAttention), beyond the engine's.
  AttentionNeeds needs;
  // Its per-step observer; empty for a metric computed across policies alone.
  std::function<std::unique_ptr<StepObserver>()> observer;
  // After every policy replayed a layer (results in policy order): fills this metric's columns
  // from all of them, e.g. a comparison with a reference policy of the same run.
  std::function<void(std::vector<LayerResult>& results, const std::vector<PolicyConfig>& policies,
                     const ObservedColumns& at)>
      across_policies;
};

// Every registered metric, by name (a list: a metric's address stays valid while it is
// registered).
const std::list<StepMetricInfo>& step_metrics();
// The metrics a replay runs: the `always` ones and those named in `asked` (each a registered
// metric that is not always on, else std::invalid_argument listing the choices).
std::vector<const StepMetricInfo*> metrics_to_run(const std::vector<std::string>& asked);
// The names of the metrics that run only when asked for, comma-separated (for --help).
std::string optional_metric_names();
// Every registered metric's columns, in result order.
std::vector<MetricColumn> observed_columns();
ObservedColumns columns_of(const StepMetricInfo& metric);
// A column's value at (KV head, step) of a result, by the column's name (tests, Python).
float observed_value(const LayerResult& r, const std::string& column, int kv_head, int step);

// Registers a metric while it lives: a metric's file ends with one (static, so registered before
// main); a test may hold one in a scope.
class StepMetricRegistration {
 public:
  explicit StepMetricRegistration(StepMetricInfo info);
  ~StepMetricRegistration();
  StepMetricRegistration(const StepMetricRegistration&) = delete;
  StepMetricRegistration& operator=(const StepMetricRegistration&) = delete;

 private:
  std::string name_;
};

}  // namespace kvsim
