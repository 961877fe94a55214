// madakv on a hand-worked trace (tiny_trace.hpp: p_ij ∝ w_j). Layers with the same attention,
// modality [T I I I I T T], w = [3, 4, 1, 1, 2, 2.5, 1 | 1], one proxy token (the last prompt
// token): ψ = w / 14.5 over the prompt.
// w_v = (4 + 1 + 1 + 2) / 14.5, w_t = (3 + 2.5 + 1) / 14.5: the visual share is 8 / 14.5 = .552.
// θ = 0.8: k_v = 3 (4 + 2 = 6 < 6.4 <= 7: images 1, 4 and, of the tied 2 and 3, the newer 3),
// k_t = 2 (3 < 5.2 <= 5.5: texts 0, 5); every head of every layer needs k_v + k_t = 5 entries.
// A layer with layer_power 0 attends uniformly: ψ = 1/7 each, w_v = 4/7, w_t = 3/7, and θ = 0.8
// needs k_v = 4 (3 < 3.2) and k_t = 3 (2 < 2.4): 7 entries, the whole prompt.
#include <gtest/gtest.h>

#include <set>

#include "tests/replay_helpers.hpp"
#include "tests/tiny_trace.hpp"

namespace kvsim::test {
namespace {

using V = std::vector<int>;

std::string madakv_trace(const std::string& name, int layers = 2,
                         std::vector<double> layer_power = {}) {
  return TinyTrace{.prompt_len = 7,
                   .weights = {3, 4, 1, 1, 2, 2.5, 1, 1},
                   .modality = {0, 1, 1, 1, 1, 0, 0, 0},
                   .layers = layers,
                   .layer_power = std::move(layer_power)}
      .write(name);
}

// The ledger reading without scaling, which most of the hand-worked cases below follow.
const std::map<std::string, std::string> kParams = {
    {"budget", "3"}, {"proxy", "1"}, {"theta", "0.8"}, {"hcc_reading", "conserve"}};

TEST(MadaKV, DefaultScalesEveryLayersNeedsToTheBudget) {
  // Default reading (scaled), B = 4 on 2 layers: 8 entries. Layer 0 (ψ ∝ w) needs 5, layer 1
  // (uniform) needs 7: s = 8 / 12, shares 3.33 and 4.67 -> 3 + 4 and the one left to the larger
  // fraction: 3 and 5. Layer 0: round(.552 · 3) = 2 visual {1, 4} + 1 text {0}. Layer 1: round(4/7
  // · 5) = 3 visual of the tied 1-4, the newest {2, 3, 4}, and 2 text of the tied 0, 5, 6: {5, 6}.
  const std::map<std::string, std::string> p = {{"budget", "4"}, {"proxy", "1"}, {"theta", "0.8"}};
  const std::string path = madakv_trace("madakv_scaled.h5", 2, {1, 0});
  auto r = run_policy(path, "madakv", p);
  EXPECT_EQ(evicted_at(r[0], -1), (V{2, 3, 5, 6}));
  EXPECT_EQ(evicted_at(r[1], -1), (V{0, 1}));
  EXPECT_TRUE(r[1].notes.empty());
  // conserve spends layer 0's need first (5 of 8, 1 set aside) and leaves layer 1 the 3 left
  // (round(4/7 · 3) = 2 visual {3, 4} + 1 text {6}), and says the budget ran dry there.
  auto q = p;
  q["hcc_reading"] = "conserve";
  r = run_policy(path, "madakv", q);
  EXPECT_EQ(evicted_at(r[0], -1), (V{2, 6}));
  EXPECT_EQ(evicted_at(r[1], -1), (V{0, 1, 2, 5}));
  ASSERT_EQ(r[1].notes.size(), 1u);
  EXPECT_NE(r[1].notes[0].find("ran dry at layer 1: 1 of 2 layers"), std::string::npos)
      << r[1].notes[0];
}

TEST(MadaKV, ScaledHoldsAtTheBoundsOfAHead) {
  // B = 6 on 2 layers: 12 entries, needs 5 and 7, s = 1: each keeps its need exactly. B = 7 (the
  // whole prompt): 14 entries, s = 14/12 would give layer 1 8.2 > P = 7: it is held at 7 and
  // layer 0 gets the other 7. Neither evicts.
  const std::string path = madakv_trace("madakv_scaled_bounds.h5", 2, {1, 0});
  auto r = run_policy(path, "madakv", {{"budget", "6"}, {"proxy", "1"}, {"theta", "0.8"}});
  EXPECT_EQ(evicted_at(r[0], -1), (V{2, 6}));
  EXPECT_TRUE(evicted_at(r[1], -1).empty());
  r = run_policy(path, "madakv", {{"budget", "7"}, {"proxy", "1"}, {"theta", "0.8"}});
  EXPECT_TRUE(evicted_at(r[0], -1).empty());
  EXPECT_TRUE(evicted_at(r[1], -1).empty());
}

TEST(MadaKV, LayersSpendTheirNeedAndLaterLayersPay) {
  // Default reading (conserve), B = 3 on 2 layers: 6 entries in all. Layer 0: φ^0 = 6 / 2 = 3, the
  // head needs 5 and leaves 1 >= 1 for layer 1, so it keeps 5: Eq. 8 splits them
  // round(.552 · 5) = 3 visual {1, 4, 3} and 2 text {0, 5}. K^0 = 5 - 3 = 2, φ^1 = 3 - 2 / 1 = 1:
  // layer 1 keeps round(.552) = 1 visual {1} and no text.
  const auto r = run_policy(madakv_trace("madakv.h5"), "madakv", kParams);
  EXPECT_EQ(evicted_at(r[0], -1), (V{2, 6}));
  EXPECT_EQ(evicted_at(r[1], -1), (V{0, 2, 3, 4, 5, 6}));
  EXPECT_TRUE(evicted_at(r[0], 0).empty());  // decoding appends
  EXPECT_EQ(r[1].steps[0][0].cache_size, 2);
}

TEST(MadaKV, SavedBudgetGoesToLaterLayersAndIsNotForcedOnTheLast) {
  // Default (conserve), B = 6 on 2 layers: 12 entries in all. Layer 0: φ^0 = 6, the head needs 5
  // and keeps 5 (3 visual {1, 4, 3}, 2 text {0, 5}): K^0 = 5 - 6 = -1, a saved budget, and
  // φ^1 = 6 + 1 / 1 = 7 (Eq. 11), the 7 entries left. Layer 1 needs 5 too and keeps 5: 10 of the
  // 12 entries are spent.
  auto p = kParams;
  p["budget"] = "6";
  auto r = run_policy(madakv_trace("madakv_saved.h5"), "madakv", p);
  EXPECT_EQ(evicted_at(r[0], -1), (V{2, 6}));
  EXPECT_EQ(evicted_at(r[1], -1), (V{2, 6}));
  // conserve_capped makes the last layer spend all 7 that are left: the whole prompt.
  p["hcc_reading"] = "conserve_capped";
  r = run_policy(madakv_trace("madakv_saved_capped.h5"), "madakv", p);
  EXPECT_EQ(evicted_at(r[0], -1), (V{2, 6}));
  EXPECT_TRUE(evicted_at(r[1], -1).empty());
}

TEST(MadaKV, ExhaustedBudgetLeavesOneEntryPerLaterHead) {
  // Default, B = 2 on 3 layers: 6 entries. Layer 0 needs 5 but one entry is set aside for each
  // later layer: it keeps 6 - 2 = 4 = round(.552 · 4) = 2 visual {1, 4} + 2 text {0, 5}. Layers 1
  // and 2 keep the entry left to each: round(.552) = 1 visual, {1}.
  auto p = kParams;
  p["budget"] = "2";
  const auto r = run_policy(madakv_trace("madakv_exhausted.h5", 3), "madakv", p);
  EXPECT_EQ(evicted_at(r[0], -1), (V{2, 3, 6}));
  EXPECT_EQ(evicted_at(r[1], -1), (V{0, 2, 3, 4, 5, 6}));
  EXPECT_EQ(evicted_at(r[2], -1), (V{0, 2, 3, 4, 5, 6}));
}

TEST(MadaKV, ConserveCappedBoundsOverspendAndTheLastLayerSpendsWhatIsLeft) {
  // conserve_capped: three layers, max_overspend = .5, 9 entries in all. Layer 0: φ = 3, cap
  // floor(1.5 · 3) = 4 < 5: keeps 4 = 2 visual {1, 4} (round 2.21) + 2 text {0, 5}. Layer 1: φ = (9
  // - 4) / 2 = 2.5 (Eq. 11: 3 - 1 / 2), cap floor(3.75) = 3: 2 visual {1, 4} (round 1.66) + 1 text
  // {0}. Layer 2 (last): the 2 left, 1 visual {1} (round 1.10) + 1 text {0}. 4 + 3 + 2 = 9.
  auto p = kParams;
  p["hcc_reading"] = "conserve_capped";
  p["max_overspend"] = "0.5";
  const auto r = run_policy(madakv_trace("madakv_cap.h5", 3), "madakv", p);
  EXPECT_EQ(evicted_at(r[0], -1), (V{2, 3, 6}));
  EXPECT_EQ(evicted_at(r[1], -1), (V{2, 3, 5, 6}));
  EXPECT_EQ(evicted_at(r[2], -1), (V{2, 3, 4, 5, 6}));
}

TEST(MadaKV, KeptEntriesNeverExceedTheBudgetOfEveryLayerAndHead) {
  // On a GQA synthetic trace, at several budgets: Σ over layers and KV heads of the entries kept
  // after the prefill is at most L · Hkv · B (conserve) and exactly that with scaled and
  // conserve_capped (whose last layer spends what is left); in all, layers differ.
  const std::string path = small_synthetic_trace("madakv_total.h5", 6);
  for (const std::string reading : {"scaled", "conserve", "conserve_capped"})
    for (int B : {3, 10, 25}) {
      const auto r =
          run_policy(path, "madakv",
                     {{"budget", std::to_string(B)}, {"proxy", "4"}, {"hcc_reading", reading}});
      long kept = 0;
      std::set<int> sizes;
      for (const auto& layer : r)
        for (std::size_t g = 0; g < layer.steps.size(); ++g) {
          const int n = layer.steps[g][0].cache_size - 1;  // minus step 0's own token
          kept += n;
          sizes.insert(n);
        }
      const long budget = static_cast<long>(r.size()) * r[0].steps.size() * B;
      if (reading == "conserve")
        EXPECT_LE(kept, budget) << "budget " << B;
      else  // scaled holds every layer's share, conserve_capped's last layer spends the rest
        EXPECT_EQ(kept, budget) << "budget " << B;
      EXPECT_GT(sizes.size(), 1u) << reading << ": HCC moved no budget at " << B;
    }
}

TEST(MadaKV, LiteralReadingsOfEq10And11) {
  // literal: layer 0 keeps φ = 3 (2 visual {1, 4}, 1 text {0}) yet is charged its need:
  // K^0 = 5 - 3 = 2, φ^1 = 1 -> {1}. 4 entries kept of the 6 budgeted.
  auto p = kParams;
  p["hcc_reading"] = "literal";
  auto r = run_policy(madakv_trace("madakv_literal.h5"), "madakv", p);
  EXPECT_EQ(evicted_at(r[0], -1), (V{2, 3, 5, 6}));
  EXPECT_EQ(evicted_at(r[1], -1), (V{0, 2, 3, 4, 5, 6}));
  // need: each layer keeps its Eq. 9 sets {0, 1, 3, 4, 5}, whatever φ^l is.
  p["hcc_reading"] = "need";
  r = run_policy(madakv_trace("madakv_need.h5"), "madakv", p);
  EXPECT_EQ(evicted_at(r[0], -1), (V{2, 6}));
  EXPECT_EQ(evicted_at(r[1], -1), (V{2, 6}));
}

TEST(MadaKV, AblationsOfTable3) {
  auto p = kParams;
  // The top 5 by ψ regardless of modality: 1 (4), 0 (3), 5 (2.5), 4 (2) and, of 2, 3 and 6 tied
  // at 1, the newest, 6.
  p["mpa"] = "false";
  auto r = run_policy(madakv_trace("madakv_mpa.h5"), "madakv", p);
  EXPECT_EQ(evicted_at(r[0], -1), (V{2, 3}));
  p = kParams;
  p["hcc"] = "false";  // φ = 3 in both layers: 2 visual {1, 4}, 1 text {0}
  r = run_policy(madakv_trace("madakv_hcc.h5"), "madakv", p);
  EXPECT_EQ(evicted_at(r[0], -1), (V{2, 3, 5, 6}));
  EXPECT_EQ(evicted_at(r[1], -1), (V{2, 3, 5, 6}));
}

}  // namespace
}  // namespace kvsim::test
