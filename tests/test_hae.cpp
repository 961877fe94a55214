// hae on a hand-worked trace (see tiny_trace.hpp: p_ij = w_j / Σ_{m<=i} w_m).
//
// P = 5, modality [text, image, image, image, text | text, text], w = [4, 1, 0.5, 2, 1 | 3, 3].
// DAP (Eq. 1-3), r = 0.2, α = 0.1: the text queries are positions 0 and 4; only row 4 sees the
// image: [4, 1, .5, 2, 1] / 8.5 -> A_1 = .1176, A_2 = .0588, A_3 = .2353, Σ = .4118,
// r·Σ = .0824: only A_2 is below it, and its maximum over text queries .0588 < α: evict {2}.
// Prompt scores (column sums of all prompt rows): s0 = 3.531, s1 = .633, s3 = .502, s4 = .118.
// Budget auto = |S_1| = 4, RC_size = 2. Step 0 attends {0 1 3 4 5} with [4 1 2 1 3]/11: the cache
// holds l + 1 entries, no trigger. Step 1 attends all six with [4 1 2 1 3 3]/14: 2 new tokens,
// and Eq. 4 evicts the 2 lowest scores of S_1 = {0 1 3 4}: s4 = .118 + 1/11 + 1/14 = .280 and
// s1 = .633 + 1/11 + 1/14 = .795 (s3 = .502 + 2/11 + 2/14 = .827). The new tokens 5 and 6 are not
// candidates; with candidates = all, s6 = 3/14 = .214 would go instead of s1.
#include <gtest/gtest.h>

#include <cmath>

#include "sim/replay/bounds.hpp"
#include "tests/replay_helpers.hpp"
#include "tests/tiny_trace.hpp"
#include "traces/synth.hpp"

namespace kvsim::test {
namespace {

using V = std::vector<int>;

TinyTrace hae_trace() {
  return TinyTrace{.prompt_len = 5,
                   .weights = {4, 1, 0.5, 2, 1, 3, 3},
                   .modality = {0, 1, 1, 1, 0, 0, 0},
                   .layers = 2};
}

const std::map<std::string, std::string> kParams = {
    {"r", "0.2"}, {"alpha", "0.1"}, {"rc_size", "2"}};

TEST(Hae, DualAttentionPruningThenRecycleBin) {
  const auto r = run_policy(hae_trace().write("hae.h5"), "hae", kParams);
  ASSERT_EQ(r.size(), 2u);
  for (const auto& layer : r) {
    EXPECT_EQ(evicted_at(layer, -1), (V{2})) << "broadcast to layer " << layer.layer;
    EXPECT_TRUE(evicted_at(layer, 0).empty());  // the cache may grow to l + RC_size - 1
    EXPECT_EQ(evicted_at(layer, 1), (V{1, 4}));
    EXPECT_EQ(layer.steps[0][1].cache_size, 6);  // the triggering step attends l + RC_size
    EXPECT_EQ(layer.steps[0][1].attended_size, 6);
  }
  // Step 0 attends everything but 2: (11.5 - 0.5) / 11.5 of the full-cache mass.
  EXPECT_NEAR(r[0].steps[0][0].mass_recall, 11.0 / 11.5, 1e-6);
  auto p = kParams;
  p["candidates"] = "all";
  const auto a = run_policy(hae_trace().write("hae_all.h5"), "hae", p);
  EXPECT_EQ(evicted_at(a[0], 1), (V{4, 6}));
}

TEST(Hae, Table1RetainsAFixedNumberOfVisualTokens) {
  // visual_keep = 2: DAP keeps the 2 images with the highest Eq. 1 score, A_3 = .2353 and
  // A_1 = .1176, and prunes 2 (A_2 = .0588) whatever r and α say; visual_keep = 1 keeps only 3.
  auto p = kParams;
  p["visual_keep"] = "2";
  auto r = run_policy(hae_trace().write("hae_keep2.h5"), "hae", p);
  EXPECT_EQ(evicted_at(r[1], -1), (V{2}));
  p["visual_keep"] = "1";
  r = run_policy(hae_trace().write("hae_keep1.h5"), "hae", p);
  EXPECT_EQ(evicted_at(r[1], -1), (V{1, 2}));
}

TEST(Hae, AlphaKeepsTokensThatOneTextTokenAttends) {
  auto p = kParams;
  p["alpha"] = "0.05";  // .0588 >= α: Eq. 3 fails, nothing is pruned
  const auto r = run_policy(hae_trace().write("hae_alpha.h5"), "hae", p);
  EXPECT_TRUE(evicted_at(r[0], -1).empty());
}

TEST(Hae, StagesReproduceTheAblation) {
  const std::string path = hae_trace().write("hae_stages.h5");
  auto p = kParams;
  p["stages"] = "prefill";  // DAP only: the cache then grows
  auto r = run_policy(path, "hae", p);
  EXPECT_EQ(evicted_at(r[1], -1), (V{2}));
  EXPECT_EQ(r[1].evicted[0].size(), 1u);
  EXPECT_EQ(r[1].steps[0][1].cache_size, 6);
  // DDES only, budget auto = P = 5. Step 1 triggers: of S_1 = {0 .. 4},
  // s4 = .118 + 1/11.5 + 1/14.5 = .274 and s2 = .216 + .5/11.5 + .5/14.5 = .294 are the lowest
  // (s1 = .789, s3 = .814).
  p["stages"] = "decode";
  r = run_policy(path, "hae", p);
  EXPECT_TRUE(evicted_at(r[0], -1).empty());
  EXPECT_EQ(evicted_at(r[0], 1), (V{2, 4}));
}

TEST(Hae, ExplicitBudgetEvictsDownToItAtThePrefill) {
  auto p = kParams;
  p["budget"] = "3";  // after DAP {0 1 3 4} by score: s4 = .118 is dropped
  const auto r = run_policy(hae_trace().write("hae_budget.h5"), "hae", p);
  EXPECT_EQ(evicted_at(r[0], -1), (V{2, 4}));
  for (const auto& m : r[0].steps[0]) EXPECT_LE(m.cache_size, 3 + 2);  // B + RC_size - 1 + new
}

TEST(Hae, Eq4ReranksAtTheTriggerWhereTheMarkedBinDoesNot) {
  // With candidates = all (new tokens compete, so the two readings part): the trace above, but
  // the step-1 query has c = -1 (p ∝ 1/w): over {0 1 3 4 5 6} with
  // w = [4 1 2 1 3 3] it attends [.25 1 .5 1 .333 .333] / 3.417. Scores after step 1:
  // s4 = .118 + 1/11 + 1/3.417 = .501, s5 = 3/11 + .333/3.417 = .370, s6 = .098, s1 = 1.017,
  // s3 = .830. Eq. 4 evicts the two lowest then, {5, 6}. The recycle bin (ddes = mark) marked 4
  // at step 0, when s4 = .209 < s5 = .273 was the lowest, and cannot take it back: {4, 6}.
  TinyTrace t = hae_trace();
  t.query_power = {1, 1, 1, 1, 1, 1, -1};
  const std::string path = t.write("hae_rerank.h5");
  auto p = kParams;
  p["candidates"] = "all";
  auto r = run_policy(path, "hae", p);
  EXPECT_EQ(evicted_at(r[0], 1), (V{5, 6}));
  p["ddes"] = "mark";
  r = run_policy(path, "hae", p);
  EXPECT_TRUE(evicted_at(r[0], 0).empty());  // 4 is only marked, still attended
  EXPECT_EQ(evicted_at(r[0], 1), (V{4, 6}));
  // Corollary 2.1 (--bounds): the marked flush removes more score than the two lowest held.
  TraceReader reader(path);
  for (const std::string ddes : {"eq4", "mark"}) {
    p["ddes"] = ddes;
    std::vector<LayerResult> out;
    Replayer(reader, {make_policy_config("hae", p)}, {.threads = 1, .checks = {bounds_check(0.01)}})
        .replay_sample("s0", [&](const LayerResult& l) { out.push_back(l); });
    ASSERT_EQ(bounds_record(out[0])->flushes.size(), 1u) << ddes;
    const FlushEvent& f = bounds_record(out[0])->flushes[0];
    const double s4 = 1 / 8.5 + 1 / 11.0 + 1 / 3.41666667, s5 = 3 / 11.0 + 1 / 3.0 / 3.41666667,
                 s6 = 1 / 3.0 / 3.41666667;
    EXPECT_NEAR(f.greedy, s5 + s6, 1e-6) << ddes;
    EXPECT_NEAR(f.realized, ddes == "eq4" ? s5 + s6 : s4 + s6, 1e-6) << ddes;
  }
}

}  // namespace
}  // namespace kvsim::test

namespace kvsim::test {
namespace {

TEST(Hae, PresetsOfThePapersTables) {
  // Table 1 retains 192 image tokens: on a synthetic trace with 200, DAP prunes the 8 with the
  // lowest Eq. 1 score, in every layer. Tables 2 and 3 fix the cache at 1024 and 956 entries; a
  // prompt shorter than that keeps everything at the prefill (auto would keep |S_1|).
  SynthConfig c;
  c.layers = 2, c.heads = 2, c.kv_heads = 2, c.head_dim = 16;
  c.system_tokens = 4, c.media_tokens = 200, c.user_tokens = 4, c.gen_tokens = 2;
  const std::string path = temp_path("hae_presets.h5");
  synth_write(c, path);
  const auto t1 = run_policy(path, "hae:table1", {});
  EXPECT_EQ(evicted_at(t1[0], -1).size(), 8u);
  EXPECT_EQ(evicted_at(t1[1], -1), evicted_at(t1[0], -1));
  for (const std::string preset : {"hae:table2", "hae:table3"}) {
    const PolicyConfig cfg = make_policy_config(preset, {});
    const bool t2 = preset == "hae:table2";
    EXPECT_EQ(cfg.params.get_string("budget"), t2 ? "1024" : "956");
    EXPECT_EQ(cfg.params.get_int("rc_size"), t2 ? 128 : 56);
    EXPECT_DOUBLE_EQ(cfg.params.get_float("r"), t2 ? 0.0005 : 0.0015);
    EXPECT_DOUBLE_EQ(cfg.params.get_float("alpha"), t2 ? 0.0005 : 0.0015);
  }
}

TEST(Hae, BoundsAreCheckedNotAssumed) {
  // The trace above with --bounds, ε = .01. Theorem 2.1: DAP evicted {2}; its largest text-query
  // attention is .5 / 8.5 (Attn_max). Every prompt key's attention falls from w / 11.5 to
  // w / 14.5 between the two decode steps, so λ = 1 - 11.5 / 14.5 for all of them and
  // k_bound = log(.01 / Attn_max) / log(1 - λ) = 7.64 >= c = 1: the premise holds, yet key 2
  // still draws .5 / 11.5 = .0435 > ε at step 0 — the claim fails on this trace.
  // Corollary 2.1 (Eq. 6 bounds the loss by Low_d(S_1)): the step-1 flush removes {1, 4} with
  // scores .7947 + .2800, which are also the two lowest of S_1, so realized = greedy.
  TraceReader reader(hae_trace().write("hae_bounds.h5"));
  const std::vector<PolicyConfig> policies = {make_policy_config("hae", kParams)};
  std::vector<LayerResult> out;
  Replayer(reader, policies, {.threads = 1, .checks = {bounds_check(0.01)}})
      .replay_sample("s0", [&](const LayerResult& r) { out.push_back(r); });
  const TheoremCheck& c = bounds_record(out[0])->theorem[0];
  EXPECT_EQ(c.evicted, 1);
  EXPECT_NEAR(c.attn_max, 0.5 / 8.5, 1e-6);
  EXPECT_NEAR(c.lambda, 1 - 11.5 / 14.5, 1e-6);
  EXPECT_NEAR(c.k_bound, std::log(0.01 / (0.5 / 8.5)) / std::log(11.5 / 14.5), 1e-4);
  EXPECT_NEAR(c.loss, 0.5 / 11.5, 1e-6);
  ASSERT_EQ(bounds_record(out[0])->flushes.size(), 1u);
  const FlushEvent& f = bounds_record(out[0])->flushes[0];
  EXPECT_EQ(f.step, 1);
  EXPECT_EQ(f.removed, 2);
  const double s1 = 1 / 5.0 + 1 / 5.5 + 1 / 7.5 + 1 / 8.5 + 1 / 11.0 + 1 / 14.0;
  EXPECT_NEAR(f.realized, (1 / 8.5 + 1 / 11.0 + 1 / 14.0) + s1, 1e-6);  // s4 + s1
  EXPECT_NEAR(f.greedy, f.realized, 1e-9);
}

}  // namespace
}  // namespace kvsim::test
