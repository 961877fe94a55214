// The baselines the papers compare against, on hand-worked tiny traces
// (tiny_trace.hpp: p_ij ∝ w_j).
#include <gtest/gtest.h>

#include <cmath>

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
  // FastV rounds with Python's round(): R = 30% keeps round(2.8) = 3 images (int() would keep
  // 2); R = 62.5% keeps round(1.5) = 2 (half to even; int() keeps 1).
  const auto r30 = run_policy(image_trace("fastv_r30.h5", 2), "fastv", {{"K", "1"}, {"R", "30"}});
  EXPECT_EQ(evicted_at(r30[1], -1), (V{3}));
  const auto half =
      run_policy(image_trace("fastv_half.h5", 2), "fastv", {{"K", "1"}, {"R", "62.5"}});
  EXPECT_EQ(evicted_at(half[1], -1), (V{3, 4}));
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

namespace kvsim::test {
namespace {

// Uniform attention (q = 0): only the budgets matter.
std::string flat_trace(const std::string& name, int P, int layers) {
  return TinyTrace{.prompt_len = P,
                   .weights = std::vector<double>(P + 1, 1.0),
                   .query_power = std::vector<double>(P + 1, 0.0),
                   .layers = layers}
      .write(name);
}

TEST(PyramidKV, LinearLayerBudgets) {
  // L = 4, P = 20, B = 8, w = 2, β = 3: min = 6 // 3 = 2, max = 12 - 2 = 10.
  // exact: 10, 7.33, 4.67, 2 -> floors 10, 7, 4, 2 (23), the remainder 1 to the largest fraction
  // (layer 2): 10, 7, 5, 2 (sum 24 = 4 x 6). reference: step (10 - 2) // 3 = 2 -> 10, 8, 6, 4.
  const std::string path = flat_trace("pyramid.h5", 20, 4);
  const std::map<std::string, std::string> p = {
      {"budget", "8"}, {"window", "2"}, {"beta", "3"}, {"kernel", "1"}};
  auto r = run_policy(path, "pyramidkv", p);
  const std::vector<int> exact = {12, 9, 7, 4}, reference = {12, 10, 8, 6};
  for (int l = 0; l < 4; ++l) EXPECT_EQ(r[l].prefill_kept_min, exact[l]) << l;
  auto q = p;
  q["rounding"] = "reference";
  r = run_policy(path, "pyramidkv", q);
  for (int l = 0; l < 4; ++l) EXPECT_EQ(r[l].prefill_kept_min, reference[l]) << l;
  // P = 20 < 2 (B - w) = 22 with B = 13: the uniform fall-back keeps B everywhere.
  q = p;
  q["budget"] = "13";
  for (const auto& layer : run_policy(path, "pyramidkv", q)) EXPECT_EQ(layer.prefill_kept_min, 13);
}

TEST(AdaKV, HeadsShareTheLayerBudgetAboveAFloor) {
  // Two KV heads, P = 6, window 1, kernel 1, B = 3 (2 prefix entries per head), α = .5 -> a
  // floor of 1 per head; 2 more go to the best remaining scores of either head.
  // Head 0's last prompt row: [1 8 1 1 1] / 13 over the prefix; head 1's: [4 4 3 1 1] / 14.
  // Floors: head 0 -> 1; head 1 -> 1 (tie with 0, the newer). Joint: head 1's 0 (.286) and 2
  // (.214) beat head 0's .077s. Head 0 keeps {1, 5}, head 1 keeps {0, 1, 2, 5}.
  TinyTrace t{
      .prompt_len = 6, .weights = {1, 8, 1, 1, 1, 1, 1}, .weights_kv1 = {4, 4, 3, 1, 1, 1, 1}};
  const auto r = run_policy(t.write("adakv.h5"), "adakv",
                            {{"budget", "3"}, {"window", "1"}, {"kernel", "1"}, {"alpha", "0.5"}});
  EXPECT_EQ(evicted_at(r[0], -1, 0), (V{0, 2, 3, 4}));
  EXPECT_EQ(evicted_at(r[0], -1, 1), (V{3, 4}));
}

}  // namespace
}  // namespace kvsim::test

namespace kvsim::test {
namespace {

// P = 8, modality [T I I I I T T T], w = [1, 10, 1, 1, 1, .5, 1, 1 | 1], B = 4,
// recent_ratio .5 -> M = 2 ({6, 7}), 1 sink ({0}); the last slot goes to text 5 although image 1
// holds far more attention (text-prior). Keys are ln w: k1 > 0, k2..k4 = 0 (cosine 0 with
// everything), k5 < 0, k0 = k6 = k7 = 0. Every evicted entry's best similarity is 0, shared by
// 0, 6 and 7 -> the newest, 7.
std::string lookm_trace(const std::string& name) {
  return TinyTrace{.prompt_len = 8,
                   .weights = {1, 10, 1, 1, 1, 0.5, 1, 1, 1},
                   .values = {1, 2, 3, 4, 5, 6, 7, 8, 9},
                   .modality = {0, 1, 1, 1, 1, 0, 0, 0, 0}}
      .write(name);
}

const std::map<std::string, std::string> kLookM = {
    {"budget", "4"}, {"recent_ratio", "0.5"}, {"sinks", "1"}};

TEST(LookM, TextPriorEviction) {
  auto p = kLookM;
  p["merge"] = "none";
  const auto r = run_policy(lookm_trace("lookm.h5"), "lookm", p);
  EXPECT_EQ(evicted_at(r[0], -1), (V{1, 2, 3, 4}));
}

TEST(LookM, MergeVariants) {
  // Into 7 (k = 0, v = 8) merge 1 (ln 10, v 2), 2, 3, 4 (k 0; v 3, 4, 5):
  //   average  k = ln 10 / 5,                  v = (8 + 2 + 3 + 4 + 5) / 5
  //   pivotal  k = (0 + ln 10 / 2) / 5,         v = (8 + (2+8)/2 + (3+8)/2 + (4+8)/2 + (5+8)/2) / 5
  //   weighted (similarities 0)  k = 0,         v = 8 / 5
  TraceReader reader(lookm_trace("lookm_merge.h5"));
  const SampleInfo s = reader.read_sample("s0");
  const double ln10 = std::log(10.0);
  const std::map<std::string, std::pair<double, double>> want = {{"average", {ln10 / 5, 22.0 / 5}},
                                                                 {"pivotal", {ln10 / 10, 31.0 / 5}},
                                                                 {"weighted", {0, 8.0 / 5}}};
  for (const auto& [kind, kv] : want) {
    auto p = kLookM;
    p["merge"] = kind;
    const PolicyConfig cfg = make_policy_config("lookm", p);
    const LayerAttention att(reader.info(), s, reader.read_layer(s, 0), cfg.needs(), 1);
    KvCache cache(1, 1);
    cache.fill_prompt(s.prompt_len);
    cfg.info->create(cfg.params, s)->on_prefill(LayerView(att, false), cache);
    ASSERT_EQ(cache.positions(0), (std::vector<std::int32_t>{0, 5, 6, 7})) << kind;
    ASSERT_EQ(cache.merges(0).size(), 4u) << kind;
    EXPECT_EQ(cache.merges(0)[0].into_position, 7) << kind;
    EXPECT_NEAR(cache.merged_key(0, 3)[0], kv.first, 1e-6) << kind;
    EXPECT_NEAR(cache.merged_value(0, 3)[0], kv.second, 1e-6) << kind;
  }
}

}  // namespace
}  // namespace kvsim::test
