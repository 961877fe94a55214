// meda and the sample entropies it allocates layer budgets with, on hand-worked traces
// (tiny_trace.hpp: d = 1, k_j = ln w_j, q = 1, so p_ij = w_j / Σ_{m<=i} w_m and the cosine of two
// keys is the product of their signs).
#include <gtest/gtest.h>

#include <cmath>

#include "sim/sample_stats.hpp"
#include "tests/replay_helpers.hpp"
#include "tests/tiny_trace.hpp"

namespace kvsim::test {
namespace {

TEST(SampleStats, CrossModalAndFullEntropyByHand) {
  // modality [text, image, image, text], w = 1: text query 3 sees the two images uniformly
  // (entropy ln 2), text query 0 sees none (skipped); image queries 1 and 2 see one text key each
  // (entropy 0). E_CM = ln 2 + 0. Full rows: 0, ln 2, ln 3, ln 4, mean (ln 24) / 4.
  TinyTrace t{.prompt_len = 4, .weights = {1, 1, 1, 1, 1}, .modality = {0, 1, 1, 0, 0}};
  TraceReader reader(t.write("entropy.h5"));
  const SampleInfo s = reader.read_sample("s0");
  for (bool naive : {false, true}) {
    const SampleStats st = compute_sample_stats(reader, s, 2, naive);
    EXPECT_NEAR(st.cross_modal_entropy[0], std::log(2.0), 1e-6);
    EXPECT_NEAR(st.attention_entropy[0], std::log(24.0) / 4, 1e-6);
  }
}

// P = 6, modality [T I I I I T | T], w = [2, 3, .5, 4, .25, 2 | 2], v = [1 .. 6, 8], budget 4 on
// one layer (S_l = 4), M = floor(.75 * 4) = 3, N = 1.
// A_s (prompt column sums) = [2.349, 2.024, .237, 1.172, .047, .170]; text entries 0 and 5 get
// + 2.349. Recent {3, 4, 5}; the top 1 of {0, 1, 2} is 0. Conserved {0, 3, 4, 5}, less {1, 2}.
// Merging by key sign: k1 = ln 3 > 0 matches 0, 3 and 5 equally -> the newest, 5;
// k2 = ln .5 < 0 matches only k4 = ln .25. So k5 = (ln 2 + ln 3) / 2 = ln sqrt(6), v5 = 4;
// k4 = ln sqrt(1/8), v4 = 4.
// Step 0 (w = 2) attends 0, 3, 4', 5', 6 with weights 2, 4, .3536, 2.4495, 2 (sum 10.803):
// ô = (2 + 16 + 4 * 2.8031 + 16) / 10.803 = 4.1851; full o = 54.75 / 13.75 = 3.9818, error .0511.
// Recall counts positions 0, 3, 4, 5, 6: 10.25 / 13.75.
TinyTrace meda_trace() {
  return TinyTrace{.prompt_len = 6,
                   .weights = {2, 3, 0.5, 4, 0.25, 2, 2},
                   .values = {1, 2, 3, 4, 5, 6, 8},
                   .modality = {0, 1, 1, 1, 1, 0, 0}};
}

TEST(Meda, TextPriorSelectionAndAverageMerging) {
  const auto r = run_policy(meda_trace().write("meda.h5"), "meda", {{"budget", "4"}});
  ASSERT_EQ(r[0].merged[0].size(), 2u);
  EXPECT_EQ(r[0].merged[0][0].step, -1);
  EXPECT_EQ(r[0].merged[0][0].position, 1);
  EXPECT_EQ(r[0].merged[0][0].into_position, 5);
  EXPECT_EQ(r[0].merged[0][1].position, 2);
  EXPECT_EQ(r[0].merged[0][1].into_position, 4);
  EXPECT_TRUE(r[0].evicted[0].empty());  // merged, not evicted
  const auto& m = r[0].steps[0][0];
  EXPECT_EQ(m.cache_size, 5);
  EXPECT_NEAR(m.mass_recall, 10.25 / 13.75, 1e-6);
  EXPECT_NEAR(m.output_rel_error, std::abs(3.981818 - 4.185117) / 3.981818, 1e-4);
}

TEST(Meda, WithoutMergingUnselectedEntriesAreEvicted) {
  const auto r = run_policy(meda_trace().write("meda_nomerge.h5"), "meda",
                            {{"budget", "4"}, {"merge", "false"}});
  EXPECT_EQ(evicted_at(r[0], -1), (std::vector<int>{1, 2}));
  EXPECT_TRUE(r[0].merged[0].empty());
}

TEST(Meda, FirstDecodeReading) {
  // Step 0 attends the full cache; then the recent window {4, 5, 6} includes the new token and
  // the top 1 of {0 .. 3} is 0 (text-boosted): 1, 2, 3 merge. k3 = ln 4 > 0 joins the newest
  // positive kept key, 6 (k6 = ln 2).
  const auto r = run_policy(meda_trace().write("meda_first.h5"), "meda",
                            {{"budget", "4"}, {"compress_at", "first_decode"}});
  EXPECT_FLOAT_EQ(r[0].steps[0][0].mass_recall, 1.0f);
  ASSERT_EQ(r[0].merged[0].size(), 3u);
  EXPECT_EQ(r[0].merged[0][0].step, 0);
  EXPECT_EQ(r[0].merged[0][2].position, 3);
  EXPECT_EQ(r[0].merged[0][2].into_position, 6);
}

TEST(Meda, LayerBudgetsFollowTheEntropySoftmax) {
  // Two layers that differ in sharpness; budgets are ceil(softmax(E_CM) * L * B), at most P.
  const std::string path = small_synthetic_trace("meda_layers.h5", 3);
  TraceReader reader(path);
  const SampleInfo s = reader.read_sample("000000");
  const SampleStats st = compute_sample_stats(reader, s, 1);
  const int B = 20;
  const auto r = run_policy(path, "meda", {{"budget", std::to_string(B)}, {"merge", "false"}});
  double z = 0;
  for (double e : st.cross_modal_entropy) z += std::exp(e);
  for (int l = 0; l < 3; ++l) {
    const int want = std::min(
        s.prompt_len,
        static_cast<int>(std::ceil(std::exp(st.cross_modal_entropy[l]) / z * 3 * B - 1e-9)));
    EXPECT_EQ(r[l].prefill_kept_min, want) << "layer " << l;
  }
}

}  // namespace
}  // namespace kvsim::test

namespace kvsim::test {
namespace {

TEST(Meda, MergedEntriesAreTheAverageOfTheirMembers) {
  // The hand-worked case above, inspected in the cache itself: position 5 absorbed 1 and
  // position 4 absorbed 2 (keys ln w, values v).
  TraceReader reader(meda_trace().write("meda_cache.h5"));
  const SampleInfo s = reader.read_sample("s0");
  const PolicyConfig cfg = make_policy_config("meda", {{"budget", "4"}});
  const SampleStats stats = compute_sample_stats(reader, s, 1);
  const LayerAttention att(reader.info(), s, reader.read_layer(s, 0), cfg.needs(), 1);
  KvCache cache(1, 1);
  cache.fill_prompt(s.prompt_len);
  cache.set_step(-1);
  auto policy = cfg.info->create(cfg.params, s);
  policy->on_prefill(LayerView(att, false, &stats), cache);
  ASSERT_EQ(cache.positions(0), (std::vector<std::int32_t>{0, 3, 4, 5}));
  EXPECT_EQ(cache.merged_key(0, 0), nullptr);
  EXPECT_NEAR(cache.merged_key(0, 3)[0], (std::log(2.0) + std::log(3.0)) / 2, 1e-6);
  EXPECT_NEAR(cache.merged_value(0, 3)[0], (6 + 2) / 2.0, 1e-6);
  EXPECT_NEAR(cache.merged_key(0, 2)[0], (std::log(0.25) + std::log(0.5)) / 2, 1e-6);
  EXPECT_NEAR(cache.merged_value(0, 2)[0], (5 + 3) / 2.0, 1e-6);
}

}  // namespace
}  // namespace kvsim::test
