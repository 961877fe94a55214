// The baselines the papers compare against (issue 4), on hand-worked tiny traces
// (tiny_trace.hpp: p_ij ∝ w_j).
#include <gtest/gtest.h>

#include "tests/replay_helpers.hpp"
#include "tests/tiny_trace.hpp"

namespace kvsim::test {
namespace {

using V = std::vector<int>;

// modality [T I I I I T | T], w = [1, 4, 3, 1, 2, 1 | 1]: the last prompt token ranks the images
// 1 (4), 2 (3), 4 (2), 3 (1) in every layer.
std::string image_trace(const std::string& name, int layers) {
  return TinyTrace{.prompt_len = 6,
                   .weights = {1, 4, 3, 1, 2, 1, 1},
                   .modality = {0, 1, 1, 1, 1, 0, 0},
                   .layers = layers}
      .write(name);
}

TEST(FastV, DropsTheLeastAttendedImagesFromLayerK) {
  // K = 2, R = 50%: layer 1 keeps int(.5 * 4) = 2 images, {1, 2}; {3, 4} are gone from layer 2.
  const auto r = run_policy(image_trace("fastv.h5", 3), "fastv", {});
  EXPECT_TRUE(evicted_at(r[0], -1).empty());
  EXPECT_TRUE(evicted_at(r[1], -1).empty());
  EXPECT_EQ(evicted_at(r[2], -1), (V{3, 4}));
  // K = 1, R = 75%: one image, {1}, from layer 1 on.
  const auto k1 = run_policy(image_trace("fastv_k1.h5", 3), "fastv", {{"K", "1"}, {"R", "75"}});
  EXPECT_TRUE(evicted_at(k1[0], -1).empty());
  EXPECT_EQ(evicted_at(k1[1], -1), (V{2, 3, 4}));
  EXPECT_EQ(evicted_at(k1[2], -1), (V{2, 3, 4}));
}

TEST(Vtw, WithdrawsVisionFromHalfTheLayers) {
  const auto r = run_policy(image_trace("vtw.h5", 4), "vtw", {});  // K = 50% of 4 = 2
  EXPECT_TRUE(evicted_at(r[1], -1).empty());
  EXPECT_EQ(evicted_at(r[2], -1), (V{1, 2, 3, 4}));
  EXPECT_EQ(evicted_at(r[3], -1), (V{1, 2, 3, 4}));
  const auto k1 = run_policy(image_trace("vtw_k1.h5", 4), "vtw", {{"K", "1"}});
  EXPECT_EQ(evicted_at(k1[1], -1), (V{1, 2, 3, 4}));
}

TEST(Tova, EvictsWhatTheCurrentQueryAttendsLeast) {
  // P = 4, w = [4, 1, 2, 1 | 1, 8], B = 2. The last prompt token keeps {0, 2}. Step 0 attends
  // {0 2 4} as 4 : 2 : 1 -> evict 4. Step 1 attends {0 2 5} as 4 : 2 : 8 -> evict 2.
  TinyTrace t{.prompt_len = 4, .weights = {4, 1, 2, 1, 1, 8}};
  const auto r = run_policy(t.write("tova.h5"), "tova", {{"budget", "2"}});
  EXPECT_EQ(evicted_at(r[0], -1), (V{1, 3}));
  EXPECT_EQ(evicted_at(r[0], 0), (V{4}));
  EXPECT_EQ(evicted_at(r[0], 1), (V{2}));
}

TEST(H2O, OneshotDecidesAtThePrefillOnly) {
  // The cumulative case of test_policies (evicts {1, 2} at the prefill), then no decode eviction.
  TinyTrace t{.prompt_len = 4, .weights = {4, 1, 2, 1, 1, 1}};
  const auto r =
      run_policy(t.write("h2o_oneshot.h5"), "h2o", {{"budget", "2"}, {"mode", "oneshot"}});
  EXPECT_EQ(evicted_at(r[0], -1), (V{1, 2}));
  EXPECT_EQ(r[0].evicted[0].size(), 2u);
  EXPECT_EQ(r[0].steps[0][1].cache_size, 4);
}

}  // namespace
}  // namespace kvsim::test
