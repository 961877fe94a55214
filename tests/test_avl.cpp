// avl on hand-worked traces (tiny_trace.hpp: q_i = c_i, k_j = ln w_j, so p_ij ∝ w_j^c_i).
//
// P = 6, modality [T I I I I T], G = 4, w = [1, 4, 3, 1, 2, 1 | 1, 1, 1, 1], c = 1 except the
// query of step 2 (position 8), c = -1. Four image tokens; S = 50% -> 2 secondary, C = 25% ->
// 1 core. The last prompt token attends images 1..4 as 4, 3, 1, 2: secondary {1, 2}, core {1};
// 3 and 4 are minor and evicted. K = 2: steps 0 and 1 attend the core only, step 2 attends all
// secondary entries and, with c = -1 (p ∝ 1/w), ranks image 2 (1/3) above image 1 (1/4): the core
// becomes {2} for step 3.
#include <gtest/gtest.h>

#include "tests/replay_helpers.hpp"
#include "tests/tiny_trace.hpp"

namespace kvsim::test {
namespace {

using V = std::vector<int>;

TinyTrace avl_trace(int layers = 1) {
  return TinyTrace{.prompt_len = 6,
                   .weights = {1, 4, 3, 1, 2, 1, 1, 1, 1, 1},
                   .query_power = {1, 1, 1, 1, 1, 1, 1, 1, -1, 1},
                   .modality = {0, 1, 1, 1, 1, 0, 0, 0, 0, 0},
                   .layers = layers};
}

const std::map<std::string, std::string> kNoText = {
    {"S", "50"}, {"C", "25"}, {"K", "2"}, {"P", "100"}, {"T", "100"}};

TEST(Avl, CoreSecondaryAndUpdateDecode) {
  const auto r = run_policy(avl_trace().write("avl.h5"), "avl", kNoText);
  const auto& s = r[0].steps[0];
  EXPECT_EQ(evicted_at(r[0], -1), (V{3, 4}));
  // Step 0: stored {0 1 2 5 6}, attended {0 1 5 6}: recall (1 + 4 + 1 + 1) / 13.
  EXPECT_EQ(s[0].cache_size, 5);
  EXPECT_EQ(s[0].attended_size, 4);
  EXPECT_NEAR(s[0].mass_recall, 7.0 / 13, 1e-6);
  EXPECT_EQ(s[1].attended_size, 5);  // {0 1 5 6 7}
  // Step 2 (update decode) attends every stored entry; p ∝ 1/w over 0..8 sums to 7.0833, the
  // attended positions {0 1 2 5 6 7 8} hold 5.5833 of it.
  EXPECT_EQ(s[2].attended_size, s[2].cache_size);
  EXPECT_NEAR(s[2].mass_recall, 5.58333 / 7.08333, 1e-5);
  // Step 3 attends the new core {2}: (1 + 3 + 1 + 4 * 1) / 16; with core {1} it would be 10 / 16.
  EXPECT_EQ(s[3].attended_size, s[3].cache_size - 1);
  EXPECT_NEAR(s[3].mass_recall, 9.0 / 16, 1e-6);
}

TEST(Avl, TextWindowEvictsFromItsOlderHalf) {
  // text_window = limit: 2 prompt text tokens + a generation limit (max_new_tokens) of 4,
  // T = 50% -> a window of 3 (the limit, not the trace's own generation length, which a deployed
  // run cannot know; here both are 4). Step 1 holds text {0 5 6 7}; the newest floor(3 / 2) = 1
  // is protected; scores (prompt column sums + renormalised decode attention): s0 = 1.878,
  // s5 = .351, s6 = .268 -> evict 6.
  auto p = kNoText;
  p["T"] = "50";
  p["max_new_tokens"] = "4";
  p["text_window"] = "limit";
  const auto r = run_policy(avl_trace().write("avl_text.h5"), "avl", p);
  EXPECT_EQ(evicted_at(r[0], -1), (V{3, 4}));
  EXPECT_TRUE(evicted_at(r[0], 0).empty());
  EXPECT_EQ(evicted_at(r[0], 1), (V{6}));
}

TEST(Avl, TextWindowOfTheTextSeenSoFar) {
  // text_window = seen (the default): T = 50% of the text that exists, rounded up. Prefill: text
  // {0, 5}, window ceil(1) = 1, nothing protected (floor(1 / 2) = 0): 5 (column sum 1/12) goes
  // and 0 (1 + 1/5 + 1/8 + 1/9 + 1/11 + 1/12) stays. Step 0: text {0, 6}, window ceil(1.5) = 2:
  // nothing. Step 1: {0, 6, 7}, window 2, the newest one protected: 6 (.27) goes, not 0 (1.88).
  // Step 2: {0, 7, 8}, window ceil(2.5) = 3: nothing.
  auto p = kNoText;
  p["T"] = "50";
  const auto r = run_policy(avl_trace().write("avl_text_seen.h5"), "avl", p);
  EXPECT_EQ(evicted_at(r[0], -1), (V{3, 4, 5}));
  EXPECT_TRUE(evicted_at(r[0], 0).empty());
  EXPECT_EQ(evicted_at(r[0], 1), (V{6}));
  EXPECT_TRUE(evicted_at(r[0], 2).empty());
  // text_window = prompt: a fixed window of ceil(50% of 2) = 1 text entry: 5 goes at the
  // prefill, then each step's new token, the lower-scored of the two (6, then 7).
  p["text_window"] = "prompt";
  const auto q = run_policy(avl_trace().write("avl_text_prompt.h5"), "avl", p);
  EXPECT_EQ(evicted_at(q[0], -1), (V{3, 4, 5}));
  EXPECT_EQ(evicted_at(q[0], 0), (V{6}));
  EXPECT_EQ(evicted_at(q[0], 1), (V{7}));
}

TEST(Avl, PrefillPruningFromTheThirdLayer) {
  // P = 50%: the second layer's last-token attention keeps images {1, 2} for layers >= 2.
  const auto r = run_policy(avl_trace(3).write("avl_prefill.h5"), "avl",
                            {{"S", "100"}, {"C", "100"}, {"P", "50"}, {"T", "100"}});
  EXPECT_TRUE(evicted_at(r[0], -1).empty());
  EXPECT_TRUE(evicted_at(r[1], -1).empty());
  EXPECT_EQ(evicted_at(r[2], -1), (V{3, 4}));
}

TEST(Avl, CoreMustNotExceedSecondary) {
  EXPECT_THROW(run_policy(avl_trace().write("avl_bad.h5"), "avl", {{"S", "20"}, {"C", "30"}}),
               std::invalid_argument);
}

}  // namespace
}  // namespace kvsim::test
