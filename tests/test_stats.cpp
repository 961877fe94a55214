// kvsim stats: every metric against values worked out by hand (tiny_trace.hpp: p_ij ∝ w_j^c).
#include <gtest/gtest.h>

#include <cmath>

#include "analysis/attention_stats.hpp"
#include "analysis/key_similarity.hpp"
#include "tests/tiny_trace.hpp"

namespace kvsim::test {
namespace {

TEST(StatsPrimitives, ByHand) {
  EXPECT_DOUBLE_EQ(ppci({1, 2, 3, 4}, {4, 3, 2, 1}, 0.5), 0.0);  // top-2 {2, 3} vs {0, 1}
  EXPECT_DOUBLE_EQ(ppci({1, 2, 3, 4}, {1, 2, 4, 3}, 0.5), 1.0);
  EXPECT_DOUBLE_EQ(ppci({1, 2, 3, 4}, {0, 5, 0, 4}, 0.25), 0.0);  // k = 1: 3 vs 1
  EXPECT_DOUBLE_EQ(ppci({1, 1, 1, 1}, {1, 2, 1, 1}, 0.5), 0.5);   // ties to later: {2, 3} vs {1, 3}
  EXPECT_DOUBLE_EQ(concentration({5, 3, 1, 1}, 0.8), 0.5);        // 5 + 3 = 8 of 10
  EXPECT_DOUBLE_EQ(concentration({5, 3, 1, 1}, 0.9), 0.75);
  EXPECT_NEAR(cosine_similarity({1, 0}, {1, 1}), 1 / std::sqrt(2.0), 1e-12);
  EXPECT_NEAR(population_variance({1, 2, 3}), 2.0 / 3, 1e-12);
}

TEST(Stats, TinyTraceByHand) {
  // P = 4, modality [T I I T], segment [system, user, user, user], w = 1 everywhere, q = 1:
  // row i attends 1 / (i + 1) to each earlier key. ε = .3 catches row 3's four entries (.25).
  TinyTrace t{.prompt_len = 4,
              .weights = {1, 1, 1, 1, 1, 1},
              .modality = {0, 1, 1, 0, 0, 0},
              .segment = {0, 1, 1, 1, 2, 2}};
  TraceReader reader(t.write("stats.h5"));
  const SampleInfo s = reader.read_sample("s0");
  StatsOptions o;
  o.epsilon = 0.3;
  o.concentration = {0.8};
  o.ppci = {0.5};
  const SampleAttentionStats st = compute_attention_stats(reader, s, o);
  // Causal entries per key: 4 - j. Text keys {0, 3}: 5 entries, 2 below ε; vision {1, 2}: 5, 2.
  EXPECT_NEAR(st.sparsity_causal[0], 0.4, 1e-12);
  EXPECT_NEAR(st.sparsity_causal[1], 0.4, 1e-12);
  EXPECT_NEAR(st.sparsity_causal[2], 0.4, 1e-12);
  // Masked reading: key j has j masked zeros; text (2 + 0 + 3) / 8, vision (2 + 1 + 2) / 8,
  // all (4 + 6) / 16.
  EXPECT_NEAR(st.sparsity_masked[0], 0.625, 1e-12);
  EXPECT_NEAR(st.sparsity_masked[1], 0.625, 1e-12);
  EXPECT_NEAR(st.sparsity_masked[2], 0.625, 1e-12);
  // Column sums: [25/12, 13/12, 7/12, 1/4]; text mass (25/12 + 1/4) / 4, vision the rest.
  EXPECT_NEAR(st.modality_share[0], (25.0 / 12 + 0.25) / 4, 1e-6);
  EXPECT_NEAR(st.modality_share[1], (13.0 / 12 + 7.0 / 12) / 4, 1e-6);
  EXPECT_NEAR(st.cumulative_variance[0], std::pow((25.0 / 12 - 0.25) / 2, 2), 1e-6);
  EXPECT_NEAR(st.cumulative_variance[1], std::pow((13.0 / 12 - 7.0 / 12) / 2, 2), 1e-6);
  // 80% of the text mass (25/12 of 28/12) needs 1 of 2 text tokens; vision 13/20 < .8: both.
  EXPECT_DOUBLE_EQ(st.concentration[0], 0.5);
  EXPECT_DOUBLE_EQ(st.concentration[1], 1.0);
  // Decode step 0 attends 5 keys uniformly: system .2, images .4, user .2, generated .2.
  EXPECT_NEAR(st.segment_share[0], 0.2, 1e-6);
  EXPECT_NEAR(st.segment_share[1], 0.4, 1e-6);
  EXPECT_NEAR(st.segment_share[2], 0.2, 1e-6);
  EXPECT_NEAR(st.segment_share[3], 0.2, 1e-6);
  EXPECT_NEAR(st.layer_cosine[0], 1.0, 1e-12);
  EXPECT_DOUBLE_EQ(st.ppci_layers[0], 1.0);
  EXPECT_DOUBLE_EQ(st.ppci_steps[0], 1.0);
  // Full rows' entropy: 0, ln 2, ln 3, ln 4; E_CM (Eq. 4, unmasked): text rows 0 and 3 over the
  // two images, ln 2 each; image rows over text keys 0 and 3, ln 2 each: ln 2 + ln 2.
  EXPECT_NEAR(st.entropy[0], std::log(24.0) / 4, 1e-6);
  EXPECT_NEAR(st.cross_modal_entropy[0], 2 * std::log(2.0), 1e-6);
  // One head: both readings of "head-averaged" agree.
  EXPECT_NEAR(st.entropy_mean_of_heads[0], std::log(24.0) / 4, 1e-6);
  EXPECT_NEAR(st.cross_modal_entropy_mean_of_heads[0], 2 * std::log(2.0), 1e-6);
}

TEST(Stats, DigestByBandOfLayers) {
  // Two samples of four layers, one head: bands {0}, {1}, {2, 3}; band means of the layers, then
  // the samples' mean and range; NaN (no vision key) left out.
  auto sample = [](std::vector<double> sparsity, std::vector<double> vision) {
    SampleAttentionStats s;
    s.layers = 4;
    s.heads = 1;
    for (int l = 0; l < 4; ++l) {
      s.sparsity_causal.insert(s.sparsity_causal.end(), {sparsity[l], 0, 0});
      s.modality_share.insert(s.modality_share.end(), {1 - vision[l], vision[l]});
    }
    return s;
  };
  const std::vector<std::pair<std::string, SampleAttentionStats>> samples = {
      {"a", sample({0.1, 0.2, 0.5, 0.7}, {0.4, 0.3, 0.2, NAN})},
      {"b", sample({0.3, 0.4, 0.7, 0.9}, {0.6, 0.5, 0.1, 0.3})}};
  const std::string digest = stats_digest(samples, 1e-4);
  // Band 2-3: sample a (0.5 + 0.7) / 2 = 0.6 and vision 0.2 (NaN left out); b 0.8 and 0.2.
  for (const char* row : {"0           0.200 [0.100, 0.300]        0.500 [0.400, 0.600]\n",
                          "1           0.300 [0.200, 0.400]        0.400 [0.300, 0.500]\n",
                          "2-3         0.700 [0.600, 0.800]        0.200 [0.200, 0.200]\n",
                          "2 sample(s): their mean [min, max]"})
    EXPECT_NE(digest.find(row), std::string::npos) << row << "\n" << digest;
  // A text-only sample: no vision share anywhere.
  const std::string text_only =
      stats_digest({{"t", sample({0.1, 0.2, 0.3, 0.4}, {NAN, NAN, NAN, NAN})}}, 1e-4);
  EXPECT_NE(text_only.find("2-3         0.350                       -\n"), std::string::npos)
      << text_only;
}

TEST(Stats, KeySimilarityByHand) {
  // d = 1, so a key's cosine with another is the product of their signs (0 for k = ln 1 = 0).
  // modality [T I I I T], w = [2 3 .5 4 1] -> keys [+ + - + 0], v = [1 2 3 -5 4].
  // Nearest other key: text 0 -> 1 (keys 1, 3), text 4 -> 0 (zero norm); vision 1 -> 1,
  // vision 2 -> 0 (every other key is + or 0), vision 3 -> 1.
  // Vision pairs (1,2), (1,3), (2,3): key cosines (-1, 1, -1), value cosines (1, -1, -1):
  // Pearson -0.5. Text has one pair (0, 4): no correlation.
  TinyTrace t{.prompt_len = 5,
              .weights = {2, 3, 0.5, 4, 1, 1},
              .values = {1, 2, 3, -5, 4, 1},
              .modality = {0, 1, 1, 1, 0, 0}};
  TraceReader reader(t.write("key_similarity.h5"));
  const SampleInfo s = reader.read_sample("s0");
  const KeySimilarity k = key_similarity(reader.info(), s, reader.read_layer(s, 0), 2);
  std::vector<double> text = k.nearest[0], vision = k.nearest[1];
  std::sort(text.begin(), text.end());
  std::sort(vision.begin(), vision.end());
  EXPECT_EQ(text, (std::vector<double>{0, 1}));
  EXPECT_EQ(vision, (std::vector<double>{0, 1, 1}));
  EXPECT_NEAR(k.key_value_correlation[1], -0.5, 1e-6);
  EXPECT_TRUE(std::isnan(k.key_value_correlation[0]));
  EXPECT_NEAR(quantile(vision, 0.1), 0.2, 1e-12);  // 0 + .2 · (1 - 0)
  EXPECT_DOUBLE_EQ(quantile(vision, 0.5), 1.0);
  EXPECT_TRUE(std::isnan(quantile({}, 0.5)));
}

TEST(Stats, DapAgreementAcrossLayers) {
  // Layer 0 (c = 1) and layer 1 (c = 0, uniform) of modality [T I I I I T], w = [1 4 3 1 .5 1].
  // HAE r = .2, α = .5. Layer 0: the text query 5 sees images [4 3 1 .5] / 10.5 -> A < .2 Σ
  // (= .2 · 8.5 / 10.5) holds for 1 / 10.5 and .5 / 10.5: {3, 4}. Layer 1: uniform 1/6 each,
  // .2 Σ = .133 < 1/6: none, agreement 0.
  TinyTrace t{.prompt_len = 6,
              .weights = {1, 4, 3, 1, 0.5, 1, 1},
              .modality = {0, 1, 1, 1, 1, 0, 0},
              .layers = 2,
              .layer_power = {1, 0}};
  TraceReader reader(t.write("stats_dap.h5"));
  StatsOptions o;
  o.dap_r = {0.2};
  o.dap_alpha = 0.5;
  const auto st = compute_attention_stats(reader, reader.read_sample("s0"), o);
  EXPECT_DOUBLE_EQ(st.dap_agreement[0], 1.0);
  EXPECT_DOUBLE_EQ(st.dap_agreement[1], 0.0);
}

}  // namespace
}  // namespace kvsim::test
