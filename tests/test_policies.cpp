// Each baseline on tiny traces whose kept sets are worked out by hand (see tiny_trace.hpp: with
// q = 1 and k_j = ln w_j, p_ij = w_j / Σ_{m<=i} w_m; with q = 0, attention is uniform).
#include <gtest/gtest.h>

#include "core/kv_cache.hpp"
#include "policies/selection.hpp"
#include "tests/replay_helpers.hpp"
#include "tests/tiny_trace.hpp"

namespace kvsim::test {
namespace {

using V = std::vector<int>;

// The cache's own bookkeeping, by hand: positions stay ascending through every edit, the count
// of attended entries follows set_attended, evictions and merges, and every eviction is logged.
TEST(KvCacheEdits, OrderAttendedCountAndLogs) {
  KvCache c(1, 2);
  c.fill_prompt(6);  // positions 0 1 2 3 4 5, all attended
  c.set_step(-1);
  c.set_attended(0, 1, false);
  c.set_attended(0, 1, false);  // twice: still one parked entry
  c.set_attended(0, 4, false);
  EXPECT_EQ(c.attended_size(0), 4);
  const int one[1] = {1};  // a single eviction (the tail shifts): the parked position 1
  c.evict(0, one);
  EXPECT_EQ(c.positions(0), (std::vector<std::int32_t>{0, 2, 3, 4, 5}));
  EXPECT_EQ(c.attended_size(0), 4);
  c.set_step(0);
  c.append(0, 6);
  EXPECT_EQ(c.attended_size(0), 5);
  const int two[2] = {4, 0};  // positions 5 and 0, in any order
  c.evict(0, two);
  EXPECT_EQ(c.positions(0), (std::vector<std::int32_t>{2, 3, 4, 6}));
  EXPECT_FALSE(c.attended(0, 2));  // position 4 is still parked
  EXPECT_EQ(c.attended_size(0), 3);
  c.keep_only(0, {1, 1, 0, 1});  // drops the parked position 4
  EXPECT_EQ(c.attended_size(0), 3);
  const float kv[2] = {0.5f, 0.25f};
  c.merge(0, 0, 1, kv, kv);  // position 2 into position 3: not an eviction
  EXPECT_EQ(c.positions(0), (std::vector<std::int32_t>{3, 6}));
  EXPECT_EQ(c.attended_size(0), 2);
  c.check_invariants(0);
  ASSERT_EQ(c.evictions(0).size(), 4u);
  const std::int32_t logged[4][2] = {{-1, 1}, {0, 0}, {0, 5}, {0, 4}};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(c.evictions(0)[i].step, logged[i][0]) << i;
    EXPECT_EQ(c.evictions(0)[i].position, logged[i][1]) << i;
  }
  EXPECT_THROW(c.append(0, 5), std::logic_error);  // older than the newest entry
  const int bad[1] = {2};
  EXPECT_THROW(c.evict(0, bad), std::logic_error);
}

TEST(Selection, TiesKeepTheNewerPosition) {
  const std::vector<double> s = {1, 2, 2, 0, 2};
  const auto keep = keep_top_scores(s, 2);
  EXPECT_EQ(keep, (std::vector<std::uint8_t>{0, 0, 1, 0, 1}));  // 2, 2, 2 tie: newest two
}

TEST(Selection, ForcedEntriesCountAgainstTheBudget) {
  const std::vector<double> s = {5, 1, 4, 3, 0};
  const auto keep = keep_top_scores(s, 3, sink_and_recent_mask(5, 0, 1));
  EXPECT_EQ(keep, (std::vector<std::uint8_t>{1, 0, 1, 0, 1}));
}

TEST(Selection, PoolingSamePadding) {
  const std::vector<double> x = {1, 3, 2, 0};
  EXPECT_EQ(pool_max(x, 3), (std::vector<double>{3, 3, 3, 2}));
  const auto a = pool_avg(x, 3);  // padding counts as zero
  EXPECT_DOUBLE_EQ(a[0], 4.0 / 3);
  EXPECT_DOUBLE_EQ(a[3], 2.0 / 3);
}

TEST(Full, NeverEvicts) {
  TinyTrace t{.prompt_len = 4, .weights = {1, 2, 3, 4, 5, 6}, .values = {1, 2, 3, 4, 5, 6}};
  const auto r = run_policy(t.write("full.h5"), "full", {});
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(r[0].evicted[0].empty());
  for (const auto& m : r[0].steps[0]) {
    EXPECT_FLOAT_EQ(m.mass_recall, 1.0f);
    EXPECT_FLOAT_EQ(m.output_rel_error, 0.0f);
  }
  EXPECT_EQ(r[0].steps[0][1].cache_size, 6);
}

TEST(StreamingLlm, SinksPlusRecentWindow) {
  // P = 6, G = 2, sinks = 1, B = 3; uniform attention (q = 0).
  TinyTrace t{.prompt_len = 6,
              .weights = {1, 1, 1, 1, 1, 1, 1, 1},
              .query_power = std::vector<double>(8, 0.0),
              .values = {1, 2, 3, 4, 5, 6, 7, 8}};
  const auto r = run_policy(t.write("sllm.h5"), "streamingllm", {{"budget", "3"}, {"sinks", "1"}});
  EXPECT_EQ(evicted_at(r[0], -1), (V{1, 2, 3}));  // keep {0, 4, 5}
  EXPECT_EQ(evicted_at(r[0], 0), (V{4}));         // {0, 4, 5, 6} -> {0, 5, 6}
  EXPECT_EQ(evicted_at(r[0], 1), (V{5}));
  // Step 0 attends {0, 4, 5, 6} of 7 uniform keys: recall 4/7; o = mean(v0..v6) = 4,
  // ô = (1 + 5 + 6 + 7) / 4 = 4.75, relative error 0.75 / 4.
  const auto& m = r[0].steps[0][0];
  EXPECT_EQ(m.cache_size, 4);
  EXPECT_NEAR(m.mass_recall, 4.0 / 7, 1e-6);
  EXPECT_NEAR(m.output_rel_error, 0.1875, 1e-6);
  EXPECT_NEAR(m.output_value_error, 0.1875, 1e-6);  // all values positive: Σ p |v| = ‖o‖
  EXPECT_EQ(m.kv_bytes, 4 * 2 * 1 * 4);             // entries * (k, v) * d * float32
}

TEST(Metrics, ValueErrorStaysFiniteWhenTheOutputIsSmall) {
  // P = 3, uniform attention (c = 0), v = [2, -2, 4 | -2]. StreamingLLM, budget 2, 1 sink, keeps
  // {0, 2}; step 0 attends {0, 2, 3}: ô = (2 + 4 - 2) / 3 = 4/3. Full: o = (2 - 2 + 4 - 2) / 4 = .5
  // and Σ p |v| = 10 / 4 = 2.5. ‖o - ô‖ = 5/6: relative to ‖o‖ 5/3, to the values' norm 1/3.
  TinyTrace t{.prompt_len = 3,
              .weights = {1, 1, 1, 1},
              .query_power = std::vector<double>(4, 0.0),
              .values = {2, -2, 4, -2}};
  const auto r =
      run_policy(t.write("value_error.h5"), "streamingllm", {{"budget", "2"}, {"sinks", "1"}});
  const auto& m = r[0].steps[0][0];
  EXPECT_NEAR(m.output_rel_error, 5.0 / 3, 1e-5);
  EXPECT_NEAR(m.output_value_error, 1.0 / 3, 1e-5);
}

TEST(StreamingLlm, BudgetMustExceedSinks) {
  TinyTrace t{.prompt_len = 6, .weights = {1, 1, 1, 1, 1, 1, 1}};
  EXPECT_THROW(run_policy(t.write("sllm_bad.h5"), "streamingllm", {{"budget", "4"}}),
               std::invalid_argument);
}

TEST(H2O, CumulativeScoresWithRecentWindow) {
  // P = 4, G = 2, w = [4, 1, 2, 1 | 1, 1], B = 2, recent = 50% of 2 = 1.
  // Prompt column sums: row 0 [1]; row 1 [.8 .2]; row 2 [4/7 1/7 2/7]; row 3 [.5 .125 .25 .125]
  //   -> s = [2.871, 0.468, 0.536, 0.125]. Keep recent {3} + best of {0, 1, 2} = 0.
  // Step 0 attends {0, 3, 4} with weights 4, 1, 1: s0 += 4/6, s3 = 0.292, s4 = 1/6.
  //   Keep recent {4} + best of {0, 3} = 0: evict 3. Recall = (4 + 1 + 1) / 9.
  // Step 1 attends {0, 4, 5}: s4 = 1/3, s5 = 1/6; keep {5} + 0: evict 4. Recall = 6 / 10.
  TinyTrace t{.prompt_len = 4, .weights = {4, 1, 2, 1, 1, 1}};
  const auto r = run_policy(t.write("h2o.h5"), "h2o", {{"budget", "2"}});
  EXPECT_EQ(evicted_at(r[0], -1), (V{1, 2}));
  EXPECT_EQ(evicted_at(r[0], 0), (V{3}));
  EXPECT_EQ(evicted_at(r[0], 1), (V{4}));
  EXPECT_NEAR(r[0].steps[0][0].mass_recall, 6.0 / 9, 1e-6);
  EXPECT_NEAR(r[0].steps[0][1].mass_recall, 0.6, 1e-6);
  EXPECT_TRUE(std::isnan(r[0].steps[0][0].output_rel_error));  // no v in this trace
}

TEST(H2O, DecodeAttentionAccumulates) {
  // P = 3, w = [1, 1, 1 | 8, 1], B = 2, recent = 0: at the prefill s = [11/6, 5/6, 1/3] keeps {0,
  // 1}. Step 0 attends {0, 1, 3} with weights 1, 1, 8: s1 = 5/6 + 0.1 = 0.933 > s3 = 0.8, so 3 is
  // evicted although it took most of this step's attention. Step 1 attends {0, 1, 4}, 1/3 each:
  // s1 = 1.267 > s4 = 0.333, evict 4.
  TinyTrace t{.prompt_len = 3, .weights = {1, 1, 1, 8, 1}};
  const auto r = run_policy(t.write("h2o_acc.h5"), "h2o", {{"budget", "2"}, {"recent", "0"}});
  EXPECT_EQ(evicted_at(r[0], -1), (V{2}));
  EXPECT_EQ(evicted_at(r[0], 0), (V{3}));
  EXPECT_EQ(evicted_at(r[0], 1), (V{4}));
}

TEST(H2O, SumsOverTheQueryHeadsOfAKvHead) {
  // Two query heads share one KV head. Head 0 attends in proportion to w = [1, 1, 6, 1]; head 1
  // attends as w^-1 (q = -1), i.e. in proportion to [1, 1, 1/6, 1].
  // Column sums (P = 4): head 0: row0 [1], row1 [.5 .5], row2 [1/8 1/8 6/8], row3 [1/9 1/9 6/9 1/9]
  //   = [1.736, .736, 1.417, .111]; head 1: rows [1], [.5 .5], [6/13 6/13 1/13],
  //   [6/19 6/19 1/19 6/19] = [2.277, 1.277, .129, .316]. Summed: [4.013, 2.013, 1.546, .427].
  // B = 2, recent = 0: keep {0, 1}. Head 0 alone would keep {0, 2}.
  TinyTrace t{.prompt_len = 4, .weights = {1, 1, 6, 1, 1}, .heads = 2, .head_power = {1, -1}};
  const auto r = run_policy(t.write("h2o_gqa.h5"), "h2o", {{"budget", "2"}, {"recent", "0"}});
  EXPECT_EQ(evicted_at(r[0], -1), (V{2, 3}));
}

TEST(SnapKV, WindowVotesPooledWithTiesToTheNewer) {
  // P = 6, window = 2, B = 3, w = [1, 3, 1, 1, 2, 1 | 1].
  // Window rows 4 and 5: [1 3 1 1 2]/8 and [1 3 1 1 2 1]/9 -> prefix scores (j < 4)
  //   s = [.236, .708, .236, .236].
  // kernel 1: keep the window {4, 5} + argmax {1}.
  // kernel 3, max pool: [.708, .708, .708, .236]: a three-way tie, the newest (2) is kept.
  TinyTrace t{.prompt_len = 6, .weights = {1, 3, 1, 1, 2, 1, 1}};
  const std::string path = t.write("snapkv.h5");
  auto r = run_policy(path, "snapkv", {{"budget", "3"}, {"window", "2"}, {"kernel", "1"}});
  EXPECT_EQ(evicted_at(r[0], -1), (V{0, 2, 3}));
  r = run_policy(path, "snapkv", {{"budget", "3"}, {"window", "2"}, {"kernel", "3"}});
  EXPECT_EQ(evicted_at(r[0], -1), (V{0, 1, 3}));
  // avg pool, count_include_pad: [(0+.236+.708)/3, (.236+.708+.236)/3, same, (.236+.236+0)/3]:
  // positions 1 and 2 tie, 2 is kept.
  r = run_policy(path, "snapkv",
                 {{"budget", "3"}, {"window", "2"}, {"kernel", "3"}, {"pooling", "avg"}});
  EXPECT_EQ(evicted_at(r[0], -1), (V{0, 1, 3}));
  // Decoding appends without eviction.
  EXPECT_TRUE(evicted_at(r[0], 0).empty());
  EXPECT_EQ(r[0].steps[0][0].cache_size, 4);
}

TEST(SnapKV, AveragesOverTheQueryHeadsOfAKvHead) {
  // Head 0: w = [1, 4, 1, 1, 1, 1]; head 1 (q = -1): [1, 1/4, 1, 1, 1, 1]. window = 1 (row 5),
  // kernel 1, B = 2: head 0 row 5 = [1 4 1 1 1 1]/9, head 1 row 5 = [4 1 4 4 4 4]/21.
  // Mean of prefix j < 5: j0 = (1/9 + 4/21)/2 = .151, j1 = (4/9 + 1/21)/2 = .246,
  // j2 = j3 = j4 = .151. Keep {5} + 1: position 1.
  TinyTrace t{.prompt_len = 6, .weights = {1, 4, 1, 1, 1, 1, 1}, .heads = 2, .head_power = {1, -1}};
  const auto r = run_policy(t.write("snapkv_gqa.h5"), "snapkv",
                            {{"budget", "2"}, {"window", "1"}, {"kernel", "1"}});
  EXPECT_EQ(evicted_at(r[0], -1), (V{0, 2, 3, 4}));
}

TEST(Oracle, KeepsWhatTheRemainingStepsAttend) {
  // P = 3, G = 2, B = 2, w = [1, 5, 2 | 1, 1].
  // Step 0 probabilities [1 5 2 1]/9, step 1 [1 5 2 1 1]/10.
  // Prefill: future = [.211, 1.056, .422] -> keep {1, 2}. Step 0: cache {1, 2, 3}, future of
  // step 1 = [.5, .2, .1] -> evict 3. Step 1: no future, all zero: keep the newest {2, 4}.
  TinyTrace t{.prompt_len = 3, .weights = {1, 5, 2, 1, 1}};
  const auto r = run_policy(t.write("oracle.h5"), "oracle", {{"budget", "2"}});
  EXPECT_EQ(evicted_at(r[0], -1), (V{0}));
  EXPECT_EQ(evicted_at(r[0], 0), (V{3}));
  EXPECT_EQ(evicted_at(r[0], 1), (V{1}));
  EXPECT_NEAR(r[0].steps[0][0].mass_recall, 8.0 / 9, 1e-6);
  EXPECT_NEAR(r[0].steps[0][1].mass_recall, 0.8, 1e-6);
}

TEST(Policies, PercentBudgetRoundsUp) {
  // 20% of a 7-token prompt = ceil(1.4) = 2 entries.
  TinyTrace t{.prompt_len = 7, .weights = {1, 1, 1, 1, 1, 1, 1, 1}};
  const auto r = run_policy(t.write("pct.h5"), "h2o", {{"budget", "20%"}});
  EXPECT_EQ(evicted_at(r[0], -1).size(), 5u);
}

TEST(Policies, LayersAndHeadsStayWithinBudget) {
  const std::string path = small_synthetic_trace("budget_inv.h5");
  for (const std::string p : {"streamingllm", "h2o", "oracle"}) {
    const auto rs = run_policy(path, p, {{"budget", "16"}});
    for (const auto& r : rs)
      for (const auto& head : r.steps)
        for (const auto& m : head) EXPECT_LE(m.cache_size, 17) << p;  // B + the current token
  }
  for (const auto& r : run_policy(path, "snapkv", {{"budget", "40"}}))
    for (std::size_t g = 0; g < r.steps.size(); ++g)
      EXPECT_EQ(r.steps[g][0].cache_size, 41);  // grows from B by one per step
}

}  // namespace
}  // namespace kvsim::test
