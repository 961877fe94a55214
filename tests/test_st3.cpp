// st3 on hand-worked traces (tiny_trace.hpp: p_ij ∝ w_j). Five layers, modality
// [T I I I I T], w = [1, 4, 3, 1, 2, 1 | 1, 1, 1]: every layer's last prompt token ranks the
// images 1 (4), 2 (3), 4 (2), 3 (1).
#include <gtest/gtest.h>

#include "tests/replay_helpers.hpp"
#include "tests/tiny_trace.hpp"

namespace kvsim::test {
namespace {

using V = std::vector<int>;

std::string st3_trace(const std::string& name) {
  return TinyTrace{.prompt_len = 6,
                   .weights = {1, 4, 3, 1, 2, 1, 1, 1, 1},
                   .modality = {0, 1, 1, 1, 1, 0, 0, 0, 0},
                   .layers = 5}
      .write(name);
}

TEST(St3, Eq7KeepsAShareOfTheInitialCountInPruningOrder) {
  // Defaults: the pruning layers and their blocks anneal (Alg. 3), in T[l] order, to
  // ⌊|V^{l,0}| · β(O)⌋ (Eq. 7). PVTP with S = 2: layer 3 keeps ⌊4 · (1 - .5)⌋ = 2 -> T[3] = [1, 2];
  // layer 4 shares its block. VTA linear, τ = 4, β(O) = 1 - O/4: generated token 1 keeps
  // ⌊2 · .75⌋ = 1 ({1}), token 2 ⌊2 · .5⌋ = 1, token 3 ⌊2 · .25⌋ = 0. Layers 0-2 never anneal.
  const auto r =
      run_policy(st3_trace("st3_eq7.h5"), "st3",
                 {{"S", "2"}, {"R", "25"}, {"P", "50"}, {"schedule", "linear"}, {"tau", "4"}});
  for (int l = 0; l < 3; ++l) EXPECT_TRUE(r[l].evicted[0].empty()) << "layer " << l;
  for (int l : {3, 4}) {
    EXPECT_EQ(evicted_at(r[l], -1), (V{3, 4, 2})) << "layer " << l;
    EXPECT_TRUE(evicted_at(r[l], 0).empty()) << "layer " << l;
    EXPECT_EQ(evicted_at(r[l], 1), (V{1})) << "layer " << l;
  }
  // Without PVTP, T[3] ranks all four images [1, 2, 4, 3]: ⌊4 · .75⌋ = 3 keeps {1, 2, 4}, then
  // ⌊4 · .5⌋ = 2 keeps {1, 2}, ⌊4 · .25⌋ = 1 keeps {1}, and token 4 reaches τ.
  const auto q = run_policy(st3_trace("st3_eq7_vta.h5"), "st3",
                            {{"S", "1"}, {"pvtp", "false"}, {"schedule", "linear"}, {"tau", "4"}});
  EXPECT_TRUE(q[2].evicted[0].empty());
  EXPECT_EQ(evicted_at(q[3], -1), (V{3}));
  EXPECT_EQ(evicted_at(q[3], 0), (V{4}));
  EXPECT_EQ(evicted_at(q[3], 1), (V{2}));
  EXPECT_EQ(evicted_at(q[3], 2), (V{1}));
}

TEST(St3, Alg3ReadLiterallyCompounds) {
  // anneal_size = current: Alg. 3 lines 18-19 shrink the current size, ⌊|C| · β(O)⌋. Without
  // PVTP: ⌊4 · .75⌋ = 3 keeps {1, 2, 4}, then ⌊3 · .5⌋ = 1 keeps {1}, then ⌊1 · .25⌋ = 0.
  const auto q = run_policy(st3_trace("st3_alg3_vta.h5"), "st3",
                            {{"S", "1"},
                             {"pvtp", "false"},
                             {"schedule", "linear"},
                             {"tau", "4"},
                             {"anneal_size", "current"}});
  EXPECT_EQ(evicted_at(q[3], -1), (V{3}));
  EXPECT_EQ(evicted_at(q[3], 0), (V{2, 4}));
  EXPECT_EQ(evicted_at(q[3], 1), (V{1}));
}

TEST(St3, EveryLayerAnnealsWhenAsked) {
  // anneal_layers = all, anneal_rank = own: layers 0-2 anneal too. PVTP with S = 1: layer 3 keeps
  // ⌊4 (1 - .5)⌋ = 2 -> {1, 2}; layer 4 keeps ⌊4 (1 - .5 - .25)⌋ = 1 -> {1}. VTA linear, τ = 4:
  // generation t keeps ⌊|V^{l,0}| (1 - t/4)⌋.
  const auto r = run_policy(st3_trace("st3.h5"), "st3",
                            {{"S", "1"},
                             {"R", "25"},
                             {"P", "50"},
                             {"schedule", "linear"},
                             {"tau", "4"},
                             {"anneal_layers", "all"},
                             {"anneal_rank", "own"}});
  // Layer 0, |V0| = 4: 3, 2, 1, 0 entries for generations 1..4 (steps -1..2).
  EXPECT_EQ(evicted_at(r[0], -1), (V{3}));
  EXPECT_EQ(evicted_at(r[0], 0), (V{4}));
  EXPECT_EQ(evicted_at(r[0], 1), (V{2}));
  EXPECT_EQ(evicted_at(r[0], 2), (V{1}));
  // Layer 3, |V0| = 2 after pruning {3, 4}: floor(1.5) = 1, floor(1) = 1, floor(.5) = 0.
  EXPECT_EQ(evicted_at(r[3], -1), (V{3, 4, 2}));
  EXPECT_TRUE(evicted_at(r[3], 0).empty());
  EXPECT_EQ(evicted_at(r[3], 1), (V{1}));
  // Layer 4 keeps only {1}, and floor(.75) = 0 at once.
  EXPECT_EQ(evicted_at(r[4], -1), (V{2, 3, 4, 1}));
}

TEST(St3, TauDefaultsToTheAblationsBestAndAutoGoesAboveTheGenerationLimit) {
  // The default τ is Tables 6 and 9's best, 50: the same decisions as an explicit τ = 50, others
  // than τ = auto's.
  const std::map<std::string, std::string> base = {
      {"S", "1"}, {"pvtp", "false"}, {"schedule", "linear"}, {"max_new_tokens", "3"}};
  auto with = [&](std::map<std::string, std::string> extra) {
    extra.insert(base.begin(), base.end());
    return extra;
  };
  const auto by_default = run_policy(st3_trace("st3_default_tau.h5"), "st3", base);
  const auto fifty = run_policy(st3_trace("st3_tau50.h5"), "st3", with({{"tau", "50"}}));
  for (std::size_t l = 0; l < by_default.size(); ++l)
    for (int step = -1; step < 3; ++step)
      EXPECT_EQ(evicted_at(by_default[l], step), evicted_at(fifty[l], step)) << l << " " << step;
  // linear τ = 50 on layer 3's 4 image entries: floor(4 (1 - O/50)) = 3 for O = 1 (annealed at
  // the end of the prefill), O = 2 and O = 3: one entry goes, then none.
  EXPECT_EQ(evicted_at(by_default[3], -1).size(), 1u);
  EXPECT_EQ(evicted_at(by_default[3], 0).size(), 0u);
  EXPECT_EQ(evicted_at(by_default[3], 1).size(), 0u);
  // tau = auto is max_new_tokens + 1: a limit of 3 gives τ = 4, as the explicit run above.
  const auto a = run_policy(st3_trace("st3_auto.h5"), "st3", with({{"tau", "auto"}}));
  EXPECT_EQ(evicted_at(a[3], -1), (V{3}));
  EXPECT_EQ(evicted_at(a[3], 0), (V{4}));
  EXPECT_EQ(evicted_at(a[3], 1), (V{2}));
  EXPECT_EQ(evicted_at(a[3], 2), (V{1}));
  EXPECT_THROW(run_policy(st3_trace("st3_auto_bad.h5"), "st3", {{"tau", "soon"}}),
               std::invalid_argument);
}

TEST(St3, CosineAndExponentialSchedules) {
  // Cosine τ = 2 on layer 0: floor(4 cos(π/4)) = 2 keeps {1, 2}; generation 2 reaches τ: none.
  auto r = run_policy(st3_trace("st3_cos.h5"), "st3",
                      {{"pvtp", "false"}, {"tau", "2"}, {"anneal_layers", "all"}});
  EXPECT_EQ(evicted_at(r[0], -1), (V{3, 4}));
  EXPECT_EQ(evicted_at(r[0], 0), (V{1, 2}));
  // Exponential σ = 1: floor(4 e^-1) = 1 keeps {1}; floor(4 e^-2) = 0.
  r = run_policy(
      st3_trace("st3_exp.h5"), "st3",
      {{"pvtp", "false"}, {"schedule", "exponential"}, {"sigma", "1"}, {"anneal_layers", "all"}});
  EXPECT_EQ(evicted_at(r[0], -1), (V{2, 3, 4}));
  EXPECT_EQ(evicted_at(r[0], 0), (V{1}));
}

TEST(St3, DefaultsPruneAtLayersThreePlusMultiplesOfTheStride) {
  // Table 3's LLaVA-1.5-7B row: S = 7, R = 12.25%, P = 50% on 32 layers leaves C = 1% of the
  // visual tokens after layers 3, 10, 17, 24 and 31 (VTA off to see PVTP alone). Eq. 9's share
  // after the k-th pruning layer, 1 - .5 - k · .1225, of 40 image tokens, rounded down:
  // 20, ⌊15.1⌋ = 15, ⌊10.2⌋ = 10, ⌊5.3⌋ = 5, ⌊0.4⌋ = 0 (576 tokens would leave ⌊5.76⌋ = 5).
  const std::string path = small_synthetic_trace("st3_defaults.h5", 32);
  const auto r = run_policy(path, "st3", {{"vta", "false"}});
  const int text = 12;
  EXPECT_EQ(r[2].prefill_kept_min, text + 40);
  EXPECT_EQ(r[3].prefill_kept_min, text + 20);
  EXPECT_EQ(r[9].prefill_kept_min, text + 20);
  EXPECT_EQ(r[10].prefill_kept_min, text + 15);
  EXPECT_EQ(r[17].prefill_kept_min, text + 10);
  EXPECT_EQ(r[24].prefill_kept_min, text + 5);
  EXPECT_EQ(r[31].prefill_kept_min, text + 0);
}

TEST(St3, QkHeredityAttendsWithTheSourceLayer) {
  // Two layers, P = 3, G = 1, w = [1, 2, 1 | 4], v = [1, 2, 3, 4]. Layer 0's queries have c = 1,
  // layer 1's c = 0 (uniform). With 0:1-1, layer 1 attends with layer 0's probabilities
  // [1 2 1 4] / 8: ô = (1 + 4 + 3 + 16) / 8 = 3, against its own output o = 2.5: error 0.2. Every
  // entry is kept, so the recall of layer 1's own attention is 1.
  const std::string path = TinyTrace{
      .prompt_len = 3,
      .weights = {1, 2, 1, 4},
      .values = {1, 2, 3, 4},
      .layers = 2,
      .layer_power = {1, 0}}.write("st3_heredity.h5");
  const std::map<std::string, std::string> p = {
      {"pvtp", "false"}, {"vta", "false"}, {"heredity", "0:1-1"}};
  const auto r = run_policy(path, "st3", p);
  EXPECT_NEAR(r[0].steps[0][0].output_rel_error, 0.0, 1e-6);
  EXPECT_NEAR(r[1].steps[0][0].output_rel_error, 0.2, 1e-6);
  EXPECT_NEAR(r[1].steps[0][0].mass_recall, 1.0, 1e-6);
  EXPECT_THROW(run_policy(path, "st3", {{"heredity", "2:1-1"}}), std::invalid_argument);
  EXPECT_THROW(run_policy(path, "st3", {{"heredity", "0:1-"}}), std::invalid_argument);
}

}  // namespace
}  // namespace kvsim::test
