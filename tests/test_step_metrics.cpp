// Per-step metrics as plugins (sim/replay/step_metric.hpp): a metric registered from one file
// runs when asked for, fills its columns by hand-worked values, and reaches every output; the
// metric below is docs/extending.md's worked example.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "sim/replay/results.hpp"
#include "sim/replay/step_metric.hpp"
#include "tests/replay_helpers.hpp"
#include "tests/tiny_trace.hpp"

namespace kvsim::test {
namespace {

// How much of the full cache's attention the policy still attends among the newest kWindow
// positions of each step (the current token's included), mean over the KV head's query heads.
constexpr int kWindow = 2;

class RecentRecall : public StepObserver {
 public:
  void observe(const LayerAttention& ref, const KvCache& cache, int step, int g, const float*,
               float* values) override {
    const int s = ref.prompt_len() + step, group = ref.group_size();
    double mass = 0;
    for (int e = 0; e < cache.size(g); ++e) {
      const int j = cache.position(g, e);
      if (j <= s - kWindow) continue;
      for (int r = 0; r < group; ++r) mass += ref.decode_probs(step, g * group + r)[j];
    }
    values[0] = static_cast<float>(mass / group);
  }
};

StepMetricInfo recency() {
  return {.name = "recency",
          .description = "mass recall from the newest positions",
          .columns = {{"recent_recall"}},
          .observer = [] { return std::make_unique<RecentRecall>(); }};
}

// The H2O case of Engine.DiagnosticsByHand (P = 4, w = [4 1 2 1 | 1 1], B = 2). Step 0: the
// full cache attends [4 1 2 1 1] / 9, h2o stores {0 3 4}, the newest two positions are 3 and 4:
// 2 / 9; the oracle stores {0 2 4}: 1 / 9. Step 1: [4 1 2 1 1 1] / 10, h2o stores {0 4 5}, the
// newest two are 4 and 5: 2 / 10.
TEST(StepMetrics, AMetricFromOneFileByHand) {
  const StepMetricRegistration registered(recency());
  TinyTrace t{.prompt_len = 4, .weights = {4, 1, 2, 1, 1, 1}};
  TraceReader reader(t.write("step_metric.h5"));
  const std::vector<PolicyConfig> policies = {make_policy_config("h2o", {{"budget", "2"}}),
                                              make_policy_config("oracle", {{"budget", "2"}})};
  std::vector<LayerResult> out;
  Replayer(reader, policies, {.threads = 1, .metrics = {"recency"}})
      .replay_sample("s0", [&](const LayerResult& r) { out.push_back(r); });
  ASSERT_EQ(out.size(), 2u);
  EXPECT_NEAR(observed_value(out[0], "recent_recall", 0, 0), 2.0 / 9, 1e-6);
  EXPECT_NEAR(observed_value(out[0], "recent_recall", 0, 1), 2.0 / 10, 1e-6);
  EXPECT_NEAR(observed_value(out[1], "recent_recall", 0, 0), 1.0 / 9, 1e-6);
  // Its column is in the per-step CSV, after the registered ones, in the metrics' name order.
  const std::string path = temp_path("step_metric.csv");
  StepCsvWriter csv(path, policies);
  for (const auto& r : out) csv.write(r);
  csv.close();
  std::ifstream in(path);
  std::string header, row;
  std::getline(in, header);
  std::getline(in, row);
  EXPECT_EQ(header.substr(header.rfind("mass90,")),
            "mass90,misses_top10,evicted_mass,cumulative_evicted_mass,recent_recall,regret");
  EXPECT_NE(row.find(",0.222222224,"), std::string::npos) << row;  // 2 / 9 in float32
  // Not asked for, it leaves its column empty (NaN); the metrics that always run still run.
  out.clear();
  Replayer(reader, policies, {.threads = 1}).replay_sample("s0", [&](const LayerResult& r) {
    out.push_back(r);
  });
  EXPECT_TRUE(std::isnan(observed_value(out[0], "recent_recall", 0, 0)));
  EXPECT_NEAR(observed_value(out[0], "regret", 0, 0), 7.0 / 9 - 6.0 / 9, 1e-6);
}

TEST(StepMetrics, UnknownAndAlwaysOnNamesAreRefused) {
  TinyTrace t{.prompt_len = 4, .weights = {4, 1, 2, 1, 1, 1}};
  TraceReader reader(t.write("step_metric_names.h5"));
  const std::vector<PolicyConfig> policies = {make_policy_config("h2o", {{"budget", "2"}})};
  for (const std::string name : {"diagnostic", "regret"}) {
    try {
      Replayer(reader, policies, {.threads = 1, .metrics = {name}});
      FAIL() << name;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("unknown metric '" + name + "'"), std::string::npos);
      EXPECT_NE(std::string(e.what()).find("diagnostics"), std::string::npos) << e.what();
    }
  }
  // A scoped registration is gone after its scope; a name is registered once.
  { const StepMetricRegistration registered(recency()); }
  EXPECT_THROW(Replayer(reader, policies, {.threads = 1, .metrics = {"recency"}}),
               std::invalid_argument);
  const StepMetricRegistration registered(recency());
  EXPECT_THROW(StepMetricRegistration again(recency()), std::logic_error);
}

}  // namespace
}  // namespace kvsim::test
