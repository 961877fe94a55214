// Every registered policy on degenerate traces: each either runs with its invariants
// holding, or refuses with an error that names the policy and says why. Never a crash, a hang, a
// recall above 1 or a cache that outgrows its capacity.
#include <gtest/gtest.h>

#include <functional>
#include <set>

#include "sim/replay/results.hpp"
#include "tests/replay_helpers.hpp"
#include "tests/tiny_trace.hpp"
#include "traces/synth.hpp"

namespace kvsim::test {
namespace {

struct DegenerateCase {
  std::string name;
  std::function<std::string(const std::string& path)> write;  // returns the trace's path
};

// A small multimodal trace (4 layers, so that ST³'s first pruning layer l = 3 exists).
SynthConfig small_config() {
  SynthConfig c;
  c.layers = 4;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 16;
  c.system_tokens = 3;
  c.media_tokens = 16;
  c.user_tokens = 3;
  c.gen_tokens = 5;
  c.sinks = 1;
  c.write.dtype = DType::kFloat32;
  return c;
}

DegenerateCase synth_case(const std::string& name, const std::function<void(SynthConfig&)>& edit) {
  return {name, [edit](const std::string& path) {
            SynthConfig c = small_config();
            edit(c);
            synth_write(c, path);
            return path;
          }};
}

std::vector<DegenerateCase> degenerate_cases() {
  return {
      synth_case("baseline", [](SynthConfig&) {}),
      synth_case("gen_0", [](SynthConfig& c) { c.gen_tokens = 0; }),
      synth_case("gen_1", [](SynthConfig& c) { c.gen_tokens = 1; }),
      synth_case("no_image",
                 [](SynthConfig& c) {
                   c.media_count = 0;
                   c.user_tokens = 10;
                 }),
      synth_case("only_image",
                 [](SynthConfig& c) {
                   c.system_tokens = 0;
                   c.user_tokens = 0;
                   c.sinks = 0;
                 }),
      synth_case("one_kv_head", [](SynthConfig& c) { c.kv_heads = 1; }),
      synth_case("several_media", [](SynthConfig& c) { c.media_count = 3; }),
      synth_case("video",
                 [](SynthConfig& c) {
                   c.video = true;
                   c.media_count = 3;
                 }),
      synth_case("no_v", [](SynthConfig& c) { c.with_v = false; }),
      synth_case("float16", [](SynthConfig& c) { c.write.dtype = DType::kFloat16; }),
      {"prompt_1",
       [](const std::string& path) {
         TinyTrace t{.prompt_len = 1, .weights = {1, 2, 3}, .values = {1, 2, 3}, .layers = 4};
         return t.write(path.substr(path.rfind('/') + 1));
       }},
      {"head_dim_1",
       [](const std::string& path) {
         TinyTrace t{.prompt_len = 6,
                     .weights = {5, 1, 2, 3, 1, 4, 1, 2},
                     .values = {1, -1, 2, 0.5, 3, 1, 2, 1},
                     .modality = {0, 1, 1, 1, 1, 0, 0, 0},
                     .layers = 4,
                     .heads = 2};
         return t.write(path.substr(path.rfind('/') + 1));
       }},
  };
}

// The budgets each policy with a `budget` parameter also runs at: none, one entry, all of P.
std::vector<std::map<std::string, std::string>> budget_settings(const PolicyInfo& info,
                                                                int prompt_len) {
  std::vector<std::map<std::string, std::string>> out = {{}};
  for (const auto& spec : info.params)
    if (spec.name == "budget")
      for (const int b : {0, 1, prompt_len + 3}) out.push_back({{"budget", std::to_string(b)}});
  return out;
}

std::string describe(const std::string& policy, const std::map<std::string, std::string>& p) {
  std::string s = policy;
  for (const auto& [k, v] : p) s += " " + k + "=" + v;
  return s;
}

// The logs of one layer account for every position: removed at most once, never attended after.
void expect_consistent(const LayerResult& r, const std::string& what) {
  for (std::size_t g = 0; g < r.evicted.size(); ++g) {
    std::set<int> gone;
    for (const auto& e : r.evicted[g]) EXPECT_TRUE(gone.insert(e.position).second) << what;
    for (const auto& m : r.merged[g]) EXPECT_TRUE(gone.insert(m.position).second) << what;
    for (std::size_t t = 0; t < r.steps[g].size(); ++t) {
      const StepMetrics& m = r.steps[g][t];
      int gone_before = 0;
      for (const auto& e : r.evicted[g]) gone_before += e.step < static_cast<int>(t);
      for (const auto& e : r.merged[g]) gone_before += e.step < static_cast<int>(t);
      EXPECT_EQ(m.cache_size, m.position + 1 - gone_before) << what << " step " << t;
      EXPECT_GE(m.attended_size, 1) << what;  // the current token always attends
      EXPECT_LE(m.attended_size, m.cache_size) << what;
      EXPECT_GE(m.mass_recall, 0.0f) << what;
      EXPECT_LE(m.mass_recall, 1.0f) << what << " step " << t;
      EXPECT_FALSE(std::isinf(m.output_rel_error)) << what;
    }
  }
}

class Degenerate : public ::testing::TestWithParam<DegenerateCase> {};

TEST_P(Degenerate, EveryPolicyRunsOrRefusesClearly) {
  const DegenerateCase& c = GetParam();
  const std::string trace = c.write(temp_path("degenerate_" + c.name + ".h5"));
  TraceReader reader(trace);
  const SampleInfo sample = reader.read_sample(reader.sample_names().front());
  int refusals = 0, runs = 0;
  for (const auto& name : PolicyRegistry::instance().names()) {
    if (name.rfind("test_", 0) == 0) continue;  // policies registered by other tests
    for (const auto& params :
         budget_settings(PolicyRegistry::instance().get(name), sample.prompt_len)) {
      const std::string what = describe(name, params) + " on " + c.name;
      std::vector<LayerResult> results;
      try {
        const std::vector<PolicyConfig> policies = {make_policy_config(name, params)};
        DecisionWriter dump(temp_path("degenerate_decisions.h5"), policies);
        Replayer(reader, policies, {}).replay_sample(sample.name, [&](const LayerResult& r) {
          results.push_back(r);
          dump.write(r);
        });
        dump.close();
      } catch (const std::exception& e) {
        // A refusal names the policy (and, through it, the parameter or trace property).
        EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << what << ": " << e.what();
        ++refusals;
        if (std::getenv("KVSIM_SHOW_REFUSALS")) std::printf("%s: %s\n", what.c_str(), e.what());
        continue;
      }
      ++runs;
      ASSERT_EQ(static_cast<int>(results.size()), reader.info().num_layers) << what;
      for (const auto& r : results) {
        expect_consistent(r, what);
        if (name != "full") continue;
        for (const auto& head : r.steps)
          for (const auto& m : head) EXPECT_EQ(m.mass_recall, 1.0f) << what;
      }
    }
  }
  EXPECT_GT(runs, 0);
  RecordProperty("refusals", refusals);
}

INSTANTIATE_TEST_SUITE_P(Traces, Degenerate, ::testing::ValuesIn(degenerate_cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace kvsim::test
