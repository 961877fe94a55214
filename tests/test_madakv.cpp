// madakv on a hand-worked trace (tiny_trace.hpp: p_ij ∝ w_j). Two layers with the same
// attention, modality [T I I I I T T], w = [3, 4, 1, 1, 2, 2.5, 1 | 1], one proxy token (the last
// prompt token): ψ = w / 14.5 over the prompt.
// w_v = (4 + 1 + 1 + 2) / 14.5, w_t = (3 + 2.5 + 1) / 14.5: the visual share is 8 / 14.5 = .552.
// Layer 0, φ = 3: φ_v = round(1.655) = 2 -> images {1, 4}; φ_t = 1 -> text {0}.
// θ = 0.8: k_v = 3 (4 + 2 = 6 < 6.4 <= 7), k_t = 2 (3 < 5.2 <= 5.5); K^0 = 3 + 2 - 3 = 2;
// φ^1 = 3 - 2 / (2 - 1) = 1. Layer 1: φ_v = round(.552) = 1 -> image {1}, φ_t = 0.
#include <gtest/gtest.h>

#include "tests/replay_helpers.hpp"
#include "tests/tiny_trace.hpp"

namespace kvsim::test {
namespace {

using V = std::vector<int>;

std::string madakv_trace(const std::string& name) {
  return TinyTrace{.prompt_len = 7,
                   .weights = {3, 4, 1, 1, 2, 2.5, 1, 1},
                   .modality = {0, 1, 1, 1, 1, 0, 0, 0},
                   .layers = 2}
      .write(name);
}

const std::map<std::string, std::string> kParams = {
    {"budget", "3"}, {"proxy", "1"}, {"theta", "0.8"}};

TEST(MadaKV, ModalityBudgetsAndCompensation) {
  const auto r = run_policy(madakv_trace("madakv.h5"), "madakv", kParams);
  EXPECT_EQ(evicted_at(r[0], -1), (V{2, 3, 5, 6}));
  EXPECT_EQ(evicted_at(r[1], -1), (V{0, 2, 3, 4, 5, 6}));
  EXPECT_TRUE(evicted_at(r[0], 0).empty());  // decoding appends
  EXPECT_EQ(r[1].steps[0][0].cache_size, 2);
}

TEST(MadaKV, AblationsOfTable3) {
  auto p = kParams;
  p["mpa"] = "false";  // the top 3 by ψ regardless of modality: 1 (4), 0 (3), 5 (2.5)
  auto r = run_policy(madakv_trace("madakv_mpa.h5"), "madakv", p);
  EXPECT_EQ(evicted_at(r[0], -1), (V{2, 3, 4, 6}));
  p = kParams;
  p["hcc"] = "false";  // φ stays 3 in layer 1
  r = run_policy(madakv_trace("madakv_hcc.h5"), "madakv", p);
  EXPECT_EQ(evicted_at(r[1], -1), (V{2, 3, 5, 6}));
}

TEST(MadaKV, NeedReadingKeepsTheSparsitySets) {
  // hcc_keep = need: each layer keeps its Eq. 9 sets, k_v = 3 images by ψ (4, 2, then 1 and 1 tie:
  // the newer, 3) and k_t = 2 texts (3, 2.5): {0, 1, 3, 4, 5}, whatever φ^l is.
  auto p = kParams;
  p["hcc_keep"] = "need";
  const auto r = run_policy(madakv_trace("madakv_need.h5"), "madakv", p);
  EXPECT_EQ(evicted_at(r[0], -1), (V{2, 6}));
  EXPECT_EQ(evicted_at(r[1], -1), (V{2, 6}));
}

}  // namespace
}  // namespace kvsim::test
