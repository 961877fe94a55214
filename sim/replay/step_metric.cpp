#include "sim/replay/step_metric.hpp"

#include <algorithm>
#include <stdexcept>

namespace kvsim {

namespace {

// Kept sorted by name, whatever order the files' static initialisers run in.
std::list<StepMetricInfo>& registry() {
  static std::list<StepMetricInfo> metrics;
  return metrics;
}

}  // namespace

StepMetricRegistration::StepMetricRegistration(StepMetricInfo info) : name_(info.name) {
  auto& metrics = registry();
  const auto at = std::find_if(metrics.begin(), metrics.end(),
                               [&](const StepMetricInfo& m) { return m.name >= info.name; });
  if (at != metrics.end() && at->name == info.name)
    throw std::logic_error("step metric '" + info.name + "' registered twice");
  metrics.insert(at, std::move(info));
}

StepMetricRegistration::~StepMetricRegistration() {
  registry().remove_if([&](const StepMetricInfo& m) { return m.name == name_; });
}

const std::list<StepMetricInfo>& step_metrics() {
  return registry();
}

std::string optional_metric_names() {
  std::string out;
  for (const auto& m : step_metrics())
    if (!m.always) out += (out.empty() ? "" : ", ") + m.name;
  return out;
}

std::vector<const StepMetricInfo*> metrics_to_run(const std::vector<std::string>& asked) {
  for (const std::string& name : asked) {
    const auto& all = step_metrics();
    const auto it = std::find_if(all.begin(), all.end(),
                                 [&](const StepMetricInfo& m) { return m.name == name; });
    if (it == all.end() || it->always)
      throw std::invalid_argument("unknown metric '" + name +
                                  "' (metrics that run when asked for: " + optional_metric_names() +
                                  ")");
  }
  std::vector<const StepMetricInfo*> out;
  for (const auto& m : step_metrics())
    if (m.always || std::find(asked.begin(), asked.end(), m.name) != asked.end()) out.push_back(&m);
  return out;
}

std::vector<MetricColumn> observed_columns() {
  std::vector<MetricColumn> out;
  for (const auto& m : step_metrics()) out.insert(out.end(), m.columns.begin(), m.columns.end());
  return out;
}

ObservedColumns columns_of(const StepMetricInfo& metric) {
  ObservedColumns at;
  for (const auto& m : step_metrics()) {
    if (&m == &metric) return at;
    at.first += static_cast<int>(m.columns.size());
  }
  throw std::logic_error("step metric '" + metric.name + "' is not registered");
}

float observed_value(const LayerResult& r, const std::string& column, int kv_head, int step) {
  const std::vector<MetricColumn> columns = observed_columns();
  for (std::size_t c = 0; c < columns.size(); ++c)
    if (columns[c].name == column)
      return r.observed[kv_head][static_cast<std::size_t>(step) * r.observed_columns + c];
  throw std::invalid_argument("no per-step column '" + column + "'");
}

}  // namespace kvsim
