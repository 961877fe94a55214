// No policy sees the future unless it declares lookahead: replaying a trace whose generation is
// cut short must give, for every registered policy, the same decisions at the prefill and at every
// step the cut trace still has, and the same measurements.
#include <gtest/gtest.h>

#include <xtensor/xview.hpp>

#include "tests/replay_helpers.hpp"
#include "tests/tiny_trace.hpp"

namespace kvsim::test {
namespace {

// `trace`'s first sample with only its first `gen` generated tokens.
std::string cut_generation(const std::string& trace, const std::string& name, int gen) {
  TraceReader reader(trace);
  const SampleInfo s = reader.read_sample(reader.sample_names()[0]);
  SampleInfo cut = s;
  cut.gen_len = gen;
  const std::size_t T = s.prompt_len + gen;
  cut.modality.resize(T);
  cut.segment.resize(T);
  if (!cut.media_id.empty()) cut.media_id.resize(T);
  if (!cut.token_ids.empty()) cut.token_ids.resize(T);
  const std::string path = temp_path(name);
  TraceWriter w(path, reader.info(), WriteOptions{.dtype = s.dtype});
  w.write_sample(cut);
  for (int l = 0; l < reader.info().num_layers; ++l) {
    const LayerTensors t = reader.read_layer(s, l);
    auto first_rows = [T](const xt::xtensor<float, 3>& x) {
      return xt::xtensor<float, 3>(xt::view(x, xt::range(0, T), xt::all(), xt::all()));
    };
    w.write_layer(cut, LayerTensors{l, first_rows(t.q), first_rows(t.k),
                                    t.has_v() ? first_rows(t.v) : xt::xtensor<float, 3>()});
  }
  return path;
}

std::vector<EvictionRecord> decisions_before(const std::vector<EvictionRecord>& all, int step) {
  std::vector<EvictionRecord> out;
  for (const auto& e : all)
    if (e.step < step) out.push_back(e);
  return out;
}

TEST(Causality, NoPolicyDecidesOnTokensNotYetGenerated) {
  // 6 layers (ST3 prunes from layer 3, FastV at 2), GQA, an image, 12 generated tokens.
  const std::string trace = small_synthetic_trace("causality.h5", 6, true, 4, 2);
  constexpr int kCut = 5;
  const std::string cut = cut_generation(trace, "causality_cut.h5", kCut);
  int tested = 0;
  for (const auto& name : PolicyRegistry::instance().names()) {
    std::map<std::string, std::string> params;
    apply_default_budget(name, "40%", params);
    if (make_policy_config(name, {}).params.values().count("window")) params["window"] = "8";
    const PolicyConfig config = make_policy_config(name, params);
    if (config.info->lookahead) continue;  // declared: labelled as an upper reference
    const auto whole = run_policy(trace, name, params);
    const auto shortened = run_policy(cut, name, params);
    ASSERT_EQ(whole.size(), shortened.size()) << name;
    for (std::size_t i = 0; i < whole.size(); ++i) {
      const LayerResult &a = whole[i], &b = shortened[i];
      for (std::size_t g = 0; g < a.evicted.size(); ++g) {
        const auto da = decisions_before(a.evicted[g], kCut), db = b.evicted[g];
        ASSERT_EQ(da.size(), db.size()) << name << " layer " << a.layer << " head " << g;
        for (std::size_t e = 0; e < da.size(); ++e)
          EXPECT_TRUE(da[e].step == db[e].step && da[e].position == db[e].position)
              << name << " layer " << a.layer << " head " << g << ": decision " << e;
        ASSERT_EQ(b.steps[g].size(), static_cast<std::size_t>(kCut));
        for (int t = 0; t < kCut; ++t) {
          EXPECT_EQ(a.steps[g][t].cache_size, b.steps[g][t].cache_size) << name << " step " << t;
          // The decode logits come from one GEMM per layer, whose blocking (and so the last bit)
          // depends on the trace's length.
          EXPECT_NEAR(a.steps[g][t].mass_recall, b.steps[g][t].mass_recall, 1e-6)
              << name << " step " << t;
        }
      }
    }
    ++tested;
  }
  EXPECT_GE(tested, 16);
}

}  // namespace
}  // namespace kvsim::test
