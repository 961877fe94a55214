// hae on a hand-worked trace (see tiny_trace.hpp: p_ij = w_j / Σ_{m<=i} w_m).
//
// P = 5, modality [text, image, image, image, text | text, text], w = [4, 1, 0.5, 2, 1 | 3, 3].
// DAP (Eq. 1-3), r = 0.2, α = 0.1: the text queries are positions 0 and 4; only row 4 sees the
// image: [4, 1, .5, 2, 1] / 8.5 -> A_1 = .1176, A_2 = .0588, A_3 = .2353, Σ = .4118,
// r·Σ = .0824: only A_2 is below it, and its maximum over text queries .0588 < α: evict {2}.
// Prompt scores (column sums of all prompt rows): s0 = 3.531, s1 = .633, s3 = .502, s4 = .118.
// Budget auto = |S_1| = 4, RC_size = 2. Step 0 attends {0 1 3 4 5} with [4 1 2 1 3]/11: the cache
// holds l + 1 entries, no trigger. Step 1 attends all six with [4 1 2 1 3 3]/14: 2 new tokens,
// Eq. 4 evicts the 2 lowest scores s4 = .118 + 1/11 + 1/14 = .280 and s6 = 3/14 = .214.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/replay_helpers.hpp"
#include "tests/tiny_trace.hpp"

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
    EXPECT_EQ(evicted_at(layer, 1), (V{4, 6}));
    EXPECT_EQ(layer.steps[0][1].cache_size, 6);  // buffered entries stay in attention
    EXPECT_EQ(layer.steps[0][1].attended_size, 6);
  }
  // Step 0 attends everything but 2: (11.5 - 0.5) / 11.5 of the full-cache mass.
  EXPECT_NEAR(r[0].steps[0][0].mass_recall, 11.0 / 11.5, 1e-6);
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
  // DDES only, budget auto = P = 5. Step 1 triggers: s6 = 3/14.5 = .207 and
  // s4 = .118 + 1/11.5 + 1/14.5 = .274 are the lowest (s2 = .294).
  p["stages"] = "decode";
  r = run_policy(path, "hae", p);
  EXPECT_TRUE(evicted_at(r[0], -1).empty());
  EXPECT_EQ(evicted_at(r[0], 1), (V{4, 6}));
}

TEST(Hae, ExplicitBudgetEvictsDownToItAtThePrefill) {
  auto p = kParams;
  p["budget"] = "3";  // after DAP {0 1 3 4} by score: s4 = .118 is dropped
  const auto r = run_policy(hae_trace().write("hae_budget.h5"), "hae", p);
  EXPECT_EQ(evicted_at(r[0], -1), (V{2, 4}));
  for (const auto& m : r[0].steps[0]) EXPECT_LE(m.cache_size, 3 + 2);  // B + RC_size - 1 + new
}

TEST(Hae, Eq4ReranksAtTheTriggerWhereTheMarkedBinDoesNot) {
  // The trace above, but the step-1 query has c = -1 (p ∝ 1/w): over {0 1 3 4 5 6} with
  // w = [4 1 2 1 3 3] it attends [.25 1 .5 1 .333 .333] / 3.417. Scores after step 1:
  // s4 = .118 + 1/11 + 1/3.417 = .501, s5 = 3/11 + .333/3.417 = .370, s6 = .098, s1 = 1.017,
  // s3 = .830. Eq. 4 evicts the two lowest then, {5, 6}. The recycle bin (ddes = mark) marked 4
  // at step 0, when s4 = .209 < s5 = .273 was the lowest, and cannot take it back: {4, 6}.
  TinyTrace t = hae_trace();
  t.query_power = {1, 1, 1, 1, 1, 1, -1};
  const std::string path = t.write("hae_rerank.h5");
  auto r = run_policy(path, "hae", kParams);
  EXPECT_EQ(evicted_at(r[0], 1), (V{5, 6}));
  auto p = kParams;
  p["ddes"] = "mark";
  r = run_policy(path, "hae", p);
  EXPECT_TRUE(evicted_at(r[0], 0).empty());  // 4 is only marked, still attended
  EXPECT_EQ(evicted_at(r[0], 1), (V{4, 6}));
  // Corollary 2.1 (--bounds): the marked flush removes more score than the two lowest held.
  TraceReader reader(path);
  for (const std::string ddes : {"eq4", "mark"}) {
    p["ddes"] = ddes;
    std::vector<LayerResult> out;
    Replayer(reader, {make_policy_config("hae", p)}, {.threads = 1, .bounds = true})
        .replay_sample("s0", [&](const LayerResult& l) { out.push_back(l); });
    ASSERT_EQ(out[0].flushes.size(), 1u) << ddes;
    const FlushEvent& f = out[0].flushes[0];
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

TEST(Hae, BoundsAreCheckedNotAssumed) {
  // The trace above with --bounds, ε = .01. Theorem 2.1: DAP evicted {2}; its largest text-query
  // attention is .5 / 8.5 (Attn_max). Every prompt key's attention falls from w / 11.5 to
  // w / 14.5 between the two decode steps, so λ = 1 - 11.5 / 14.5 for all of them and
  // k_bound = log(.01 / Attn_max) / log(1 - λ) = 7.64 >= c = 1: the premise holds, yet key 2
  // still draws .5 / 11.5 = .0435 > ε at step 0 — the claim fails on this trace.
  // Corollary 2.1: the step-1 flush removes {4, 6} with scores .2800 + .2143, which are also the
  // two lowest held, so realized = greedy.
  TraceReader reader(hae_trace().write("hae_bounds.h5"));
  const std::vector<PolicyConfig> policies = {make_policy_config("hae", kParams)};
  std::vector<LayerResult> out;
  Replayer(reader, policies, {.threads = 1, .bounds = true, .bounds_epsilon = 0.01})
      .replay_sample("s0", [&](const LayerResult& r) { out.push_back(r); });
  const TheoremCheck& c = out[0].theorem[0];
  EXPECT_EQ(c.evicted, 1);
  EXPECT_NEAR(c.attn_max, 0.5 / 8.5, 1e-6);
  EXPECT_NEAR(c.lambda, 1 - 11.5 / 14.5, 1e-6);
  EXPECT_NEAR(c.k_bound, std::log(0.01 / (0.5 / 8.5)) / std::log(11.5 / 14.5), 1e-4);
  EXPECT_NEAR(c.loss, 0.5 / 11.5, 1e-6);
  ASSERT_EQ(out[0].flushes.size(), 1u);
  const FlushEvent& f = out[0].flushes[0];
  EXPECT_EQ(f.step, 1);
  EXPECT_EQ(f.removed, 2);
  EXPECT_NEAR(f.realized, (1 / 8.5 + 1 / 11.0 + 1 / 14.0) + 3 / 14.0, 1e-6);  // s4 + s6
  EXPECT_NEAR(f.greedy, f.realized, 1e-9);
}

}  // namespace
}  // namespace kvsim::test
