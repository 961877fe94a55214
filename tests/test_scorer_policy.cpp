// scorer_policy(): a registration that states only its scorer gets the selection, the protected
// entries, the merge, the notes and the eviction scores, worked out by hand on a tiny trace
// (P = 20 prompt positions, 6 generated, 2 KV heads).
#include <gtest/gtest.h>

#include <set>

#include "policies/scorer_policy.hpp"
#include "policies/selection.hpp"
#include "tests/replay_helpers.hpp"
#include "tests/tiny_trace.hpp"

namespace kvsim::test {
namespace {

// KV head 0 scores j mod 7 (ties: 6 at 6 and 13, 5 at 5 and 12, 4 at 4, 11 and 18); KV head 1
// scores -j (the oldest best); position 19 is protected on both.
PromptScorer hand_scorer(bool within_budget) {
  return {.score =
              [](const LayerView& view) {
                PromptScores s(2, std::vector<double>(view.prompt_len()));
                for (int j = 0; j < view.prompt_len(); ++j) {
                  s[0][j] = j % 7;
                  s[1][j] = -j;
                }
                s[0][19] = s[1][19] = kUnscored;
                return s;
              },
          .notes = {"test_scorer: a note of the sample"},
          .within_budget = within_budget};
}

PolicyInfo hand_info(const std::string& name, bool alpha) {
  PolicyInfo info{.name = name,
                  .summary = "test only",
                  .provenance = "tests",
                  .params = {budget_param(), budget_rounding_param(false)},
                  .switches = {.decode = true}};
  if (alpha) info.params.push_back({"alpha", ParamType::kFloat, "0.5", "floor share", 0, 1});
  return info;
}

const PolicyRegistration per_head(scorer_policy(hand_info("test_scorer_per_head", false),
                                                [](const ParamSet&, const SampleInfo&, int) {
                                                  return hand_scorer(false);
                                                }));
const PolicyRegistration scored_within(scorer_policy(hand_info("test_scorer_within", false),
                                                     [](const ParamSet&, const SampleInfo&, int) {
                                                       return hand_scorer(true);
                                                     }));
const PolicyRegistration adaptive(scorer_policy(
    hand_info("test_scorer_adaptive", true),
    [](const ParamSet&, const SampleInfo&, int) { return hand_scorer(false); },
    ScorerSelection::kHeadAdaptive));

// Per-layer selection: layer l keeps 5 + 2 l entries (the window among them).
const PolicyRegistration per_layer(scorer_policy(hand_info("test_scorer_per_layer", false),
                                                 [](const ParamSet&, const SampleInfo&, int) {
                                                   PromptScorer s = hand_scorer(false);
                                                   s.layer_keep = [](const LayerView& view) {
                                                     return 5 + 2 * view.layer();
                                                   };
                                                   return s;
                                                 }));
// Decoded positions scored: head 1's new entry scores +position (newest best), head 0's -position
// (newest worst).
const PolicyRegistration decoded(scorer_policy(hand_info("test_scorer_decoded", false),
                                               [](const ParamSet&, const SampleInfo&, int) {
                                                 PromptScorer s = hand_scorer(false);
                                                 s.score_decoded = [](const LayerView&,
                                                                      int position,
                                                                      PromptScores& scores) {
                                                   for (auto& head : scores)
                                                     head.resize(position + 1, kUnscored);
                                                   scores[0][position] = -position;
                                                   scores[1][position] = position;
                                                 };
                                                 return s;
                                               }));

std::string hand_trace(const std::string& name, int layers = 1) {
  TinyTrace t{.prompt_len = 20, .layers = layers};
  for (int i = 0; i < 26; ++i) {
    t.weights.push_back(1 + i % 3);
    t.weights_kv1.push_back(1 + i % 2);
  }
  return t.write(name);
}

std::set<int> kept_after_prefill(const LayerResult& r, int g) {
  std::set<int> kept;
  for (int j = 0; j < 20; ++j) kept.insert(j);
  for (const auto& e : r.evicted[g])
    if (e.step == -1) kept.erase(e.position);
  return kept;
}

TEST(ScorerPolicy, KeepsEachHeadsBestWithItsProtectedEntries) {
  const auto r =
      run_policy(hand_trace("scorer_per_head.h5"), "test_scorer_per_head", {{"budget", "5"}});
  // Head 0: 19 protected, then 13 and 6 (score 6), 12 and 5 (score 5). Head 1: 19, then 0..3.
  EXPECT_EQ(kept_after_prefill(r[0], 0), (std::set<int>{5, 6, 12, 13, 19}));
  EXPECT_EQ(kept_after_prefill(r[0], 1), (std::set<int>{0, 1, 2, 3, 19}));
  // Decoding appends (no decode switch set).
  EXPECT_EQ(r[0].steps[0].back().cache_size, 5 + 6);
}

TEST(ScorerPolicy, HeadAdaptiveFillsTheLayersTotalJointly) {
  const auto r = run_policy(hand_trace("scorer_adaptive.h5"), "test_scorer_adaptive",
                            {{"budget", "5"}, {"alpha", "0.5"}});
  // Each head: 19 and its int(0.5 · 5) = 2 best (13, 6; 0, 1); the other 10 - 6 = 4 by score
  // across heads: head 0's 12 and 5 (5), then 18 and 11 (4, the newer of three ties) before any
  // of head 1's (-2 and below).
  EXPECT_EQ(kept_after_prefill(r[0], 0), (std::set<int>{5, 6, 11, 12, 13, 18, 19}));
  EXPECT_EQ(kept_after_prefill(r[0], 1), (std::set<int>{0, 1, 19}));
}

TEST(ScorerPolicy, APromptTheBudgetHoldsIsScoredOnlyWhenAsked) {
  // budget 20 = P: nothing goes at the prefill; decode = cap then holds 20 entries. Scored within
  // the budget, head 1 evicts its lowest score, the newest scored prompt entry (18, then 17, ...);
  // not scored, every entry is unscored and the oldest goes (0, then 1, ...).
  const std::string trace = hand_trace("scorer_within.h5");
  const std::map<std::string, std::string> cap{{"budget", "20"}, {"decode", "cap"}};
  const auto scored = run_policy(trace, "test_scorer_within", cap);
  const auto unscored = run_policy(trace, "test_scorer_per_head", cap);
  for (int step = 0; step < 6; ++step) {
    EXPECT_EQ(evicted_at(scored[0], step, 1), std::vector<int>{18 - step}) << step;
    EXPECT_EQ(evicted_at(unscored[0], step, 1), std::vector<int>{step}) << step;
  }
}

TEST(ScorerPolicy, PerLayerSelectionKeepsEachLayersCount) {
  const auto r =
      run_policy(hand_trace("scorer_per_layer.h5", 3), "test_scorer_per_layer", {{"budget", "5"}});
  // Head 0 ranks 19 (protected), 13, 6, 12, 5, then 18, 11, 4 (score 4, newest first), 17 (3).
  EXPECT_EQ(kept_after_prefill(r[0], 0), (std::set<int>{5, 6, 12, 13, 19}));
  EXPECT_EQ(kept_after_prefill(r[1], 0), (std::set<int>{5, 6, 11, 12, 13, 18, 19}));
  EXPECT_EQ(kept_after_prefill(r[2], 0), (std::set<int>{4, 5, 6, 11, 12, 13, 17, 18, 19}));
  EXPECT_EQ(kept_after_prefill(r[2], 1), (std::set<int>{0, 1, 2, 3, 4, 5, 6, 7, 19}));
}

TEST(ScorerPolicy, DecodedPositionsScoredAreEvictedByTheirScores) {
  // budget 5, decode = cap: the prefill keeps head 0's {5, 6, 12, 13, 19} and head 1's
  // {0, 1, 2, 3, 19}. Each step appends position 20 + s and evicts the lowest score: on head 0
  // the new entry itself (its -position is below every prompt score); on head 1 the new entry
  // (+position) stays and the prompt goes from the newest kept (3, then 2, 1, 0), then the
  // oldest generated entry once 19 (unscored) is all the prompt left.
  const auto r = run_policy(hand_trace("scorer_decoded.h5"), "test_scorer_decoded",
                            {{"budget", "5"}, {"decode", "cap"}});
  for (int step = 0; step < 6; ++step)
    EXPECT_EQ(evicted_at(r[0], step, 0), std::vector<int>{20 + step}) << step;
  const std::vector<int> head1{3, 2, 1, 0, 20, 21};
  for (int step = 0; step < 6; ++step)
    EXPECT_EQ(evicted_at(r[0], step, 1), std::vector<int>{head1[step]}) << step;
}

TEST(ScorerPolicy, TheScorersNotesAreThePolicys) {
  const auto config = make_policy_config("test_scorer_per_head", {{"budget", "5"}});
  SampleInfo sample;
  sample.prompt_len = 20;
  const auto policy = config.info->create(config.params, sample);
  EXPECT_EQ(policy->notes(), std::vector<std::string>{"test_scorer: a note of the sample"});
}

TEST(ScorerPolicy, ARegistrationWithoutABudgetIsRefused) {
  PolicyInfo info{.name = "test_scorer_no_budget", .params = {}};
  EXPECT_THROW(scorer_policy(info, [](const ParamSet&, const SampleInfo&,
                                      int) { return hand_scorer(false); }),
               std::logic_error);
  EXPECT_THROW(scorer_policy(
                   hand_info("test_scorer_no_alpha", false),
                   [](const ParamSet&, const SampleInfo&, int) { return hand_scorer(false); },
                   ScorerSelection::kHeadAdaptive),
               std::logic_error);
}

}  // namespace
}  // namespace kvsim::test
