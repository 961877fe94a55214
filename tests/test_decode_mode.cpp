// decode = grow | cap | every:N for prefill-only policies (policies/decode_mode.cpp), on
// hand-worked tiny traces (tiny_trace.hpp: p_ij ∝ w_j) and on a GQA trace for equal memory.
#include <gtest/gtest.h>

#include <algorithm>

#include "sim/replay/step_metric.hpp"
#include "tests/replay_helpers.hpp"
#include "tests/tiny_trace.hpp"

namespace kvsim::test {
namespace {

using V = std::vector<int>;

// P = 6, w = [5, 1, 4, 2, 3, 1 | 2, 6, 1, 1]. SnapKV with window 1 and no pooling scores the
// prefix by the last prompt query, ∝ w: B = 3 keeps {0, 2} and the window {5}.
std::string snapkv_trace(const std::string& name) {
  return TinyTrace{.prompt_len = 6, .weights = {5, 1, 4, 2, 3, 1, 2, 6, 1, 1}}.write(name);
}
const std::map<std::string, std::string> kSnap = {
    {"budget", "3"}, {"window", "1"}, {"kernel", "1"}};

std::map<std::string, std::string> with_decode(const std::string& mode) {
  auto p = kSnap;
  p["decode"] = mode;
  return p;
}

TEST(DecodeMode, GrowIsThePaperAndAppendsEveryToken) {
  const auto r = run_policy(snapkv_trace("decode_grow.h5"), "snapkv", kSnap);
  EXPECT_EQ(evicted_at(r[0], -1), (V{1, 3, 4}));
  for (int t = 0; t < 4; ++t) EXPECT_EQ(r[0].steps[0][t].cache_size, 4 + t) << t;
  EXPECT_EQ(r[0].evicted[0].size(), 3u);
}

TEST(DecodeMode, CapEvictsByThePolicysOwnScoresThenTheOldest) {
  // Each step appends one token and evicts one. Scored (prefix) entries go first, lowest score
  // first: step 0 evicts 2 (score 4 < 5), step 1 evicts 0. Then only unscored entries remain
  // (the window 5 and generated tokens): the oldest goes, 5 at step 2 and 6 at step 3.
  const auto r = run_policy(snapkv_trace("decode_cap.h5"), "snapkv", with_decode("cap"));
  EXPECT_EQ(evicted_at(r[0], 0), (V{2}));
  EXPECT_EQ(evicted_at(r[0], 1), (V{0}));
  EXPECT_EQ(evicted_at(r[0], 2), (V{5}));
  EXPECT_EQ(evicted_at(r[0], 3), (V{6}));
  for (int t = 0; t < 4; ++t) EXPECT_EQ(r[0].steps[0][t].cache_size, 4) << t;
}

TEST(DecodeMode, EveryNRecompressesByTheLastNQueries) {
  // every:2. Step 0 attends {0 2 5 6} ∝ 5:4:1:2 (sum 12), step 1 {0 2 5 6 7} ∝ 5:4:1:2:6 (18).
  // Votes: 0: 5/12 + 5/18, 2: 4/12 + 4/18, 5: 1/12 + 1/18, 6: 2/12 + 2/18 = .278, 7: 6/18 = .333:
  // keep {0, 2, 7}, evict {5, 6} after step 1. Step 2 attends {0 2 7 8} ∝ 5:4:6:1 (16), step 3
  // {0 2 7 8 9} ∝ 5:4:6:1:1 (17): 8 (1/16 + 1/17) and 9 (1/17) are the lowest, evicted after
  // step 3 (the votes restart after each compression).
  const auto r = run_policy(snapkv_trace("decode_every.h5"), "snapkv", with_decode("every:2"));
  EXPECT_TRUE(evicted_at(r[0], 0).empty());
  EXPECT_EQ(evicted_at(r[0], 1), (V{5, 6}));
  EXPECT_TRUE(evicted_at(r[0], 2).empty());
  EXPECT_EQ(evicted_at(r[0], 3), (V{8, 9}));
  const V sizes = {4, 5, 4, 5};
  for (int t = 0; t < 4; ++t) EXPECT_EQ(r[0].steps[0][t].cache_size, sizes[t]) << t;
}

TEST(DecodeMode, CapEvictsATextPriorPolicyInItsOwnOrder) {
  // lookm, P = 8, modality [T V V T V T T T], uniform attention: the prompt column sums
  // Σ_{i >= j} 1/(i + 1) fall with j. B = 6: the recent 3 ({5, 6, 7}) are forced, then text
  // before vision: 0 and 3, then the best vision entry, 1. Cap evicts in lookm's order: the
  // vision entry 1 first although its column sum beats 3's, then 3, then 0; then only forced
  // and generated entries remain and the oldest goes (5).
  TinyTrace t{.prompt_len = 8,
              .weights = std::vector<double>(12, 1.0),
              .modality = {0, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0}};
  const auto r = run_policy(t.write("lookm_cap.h5"), "lookm",
                            {{"budget", "6"},
                             {"sinks", "0"},
                             {"recent_ratio", "0.5"},
                             {"merge", "none"},
                             {"decode", "cap"}});
  EXPECT_EQ(evicted_at(r[0], -1), (V{2, 4}));
  EXPECT_EQ(evicted_at(r[0], 0), (V{1}));
  EXPECT_EQ(evicted_at(r[0], 1), (V{3}));
  EXPECT_EQ(evicted_at(r[0], 2), (V{0}));
  EXPECT_EQ(evicted_at(r[0], 3), (V{5}));
}

TEST(DecodeMode, CapHoldsThePrefillSizeOfEveryHeadOfEveryPolicy) {
  // Equal memory: with cap, each (layer, KV head) attends with what its prefill left plus the
  // current token, at every step; with every:3 it grows for three steps and falls back.
  const std::string trace = small_synthetic_trace("decode_gqa.h5");
  for (const std::string policy : {"snapkv", "pyramidkv", "adakv", "madakv", "lookm", "meda"}) {
    std::map<std::string, std::string> p = {{"budget", "40%"}};
    if (policy == "snapkv" || policy == "pyramidkv" || policy == "adakv") p["window"] = "8";
    const auto grow = run_policy(trace, policy, p);
    p["decode"] = "cap";
    const auto cap = run_policy(trace, policy, p);
    p["decode"] = "every:3";
    const auto every = run_policy(trace, policy, p);
    ASSERT_EQ(grow.size(), cap.size());
    long grow_sum = 0, cap_sum = 0;
    for (std::size_t l = 0; l < grow.size(); ++l)
      for (std::size_t g = 0; g < grow[l].steps.size(); ++g) {
        const int kept = grow[l].steps[g][0].cache_size - 1;
        for (std::size_t t = 0; t < grow[l].steps[g].size(); ++t) {
          EXPECT_EQ(cap[l].steps[g][t].cache_size, kept + 1) << policy << " " << l << " " << t;
          EXPECT_EQ(every[l].steps[g][t].cache_size, kept + 1 + static_cast<int>(t % 3))
              << policy << " " << l << " " << t;
          grow_sum += grow[l].steps[g][t].cache_size;
          cap_sum += cap[l].steps[g][t].cache_size;
        }
      }
    EXPECT_LT(cap_sum, grow_sum) << policy;
  }
}

TEST(DecodeMode, BadModesAreRefusedNamingTheParameter) {
  for (const std::string bad : {"sometimes", "every:0", "every:", "every:2x", "cap:3"}) {
    try {
      make_policy_config("snapkv", {{"decode", bad}});
      ADD_FAILURE() << bad << " was accepted";
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("snapkv: parameter 'decode' = '" + bad + "'"), std::string::npos) << what;
      EXPECT_NE(what.find("grow, cap or every:N"), std::string::npos) << what;
    }
  }
  EXPECT_NO_THROW(make_policy_config("meda", {{"decode", "every:16"}}));
}

TEST(DecodeMode, TheWrappedPolicysNotesAreReported) {
  // A decode mode wraps the policy; what the policy noted (SnapKV's window clamped to a budget of
  // 4) must still reach the run's warnings.
  TinyTrace t{.prompt_len = 10, .weights = std::vector<double>(13, 1.0)};
  const std::string trace = t.write("decode_notes.h5");
  TraceReader reader(trace);
  for (const std::string mode : {"grow", "cap", "every:2"}) {
    Replayer replayer(reader, {make_policy_config("snapkv", {{"budget", "4"}, {"decode", mode}})},
                      {});
    const auto notes = replayer.validate(reader.sample_names());
    ASSERT_EQ(notes.count("snapkv"), 1u) << mode;
    EXPECT_NE(notes.at("snapkv")[0].find("window clamped to 4"), std::string::npos) << mode;
  }
}

}  // namespace
}  // namespace kvsim::test

namespace kvsim::test {
namespace {

TEST(OracleMatch, HoldsExactlyWhatTheMatchedPolicyHolds) {
  // snapkv grows by one entry a step, so the matched oracle never evicts while decoding. At the
  // prefill it keeps the B = 3 positions with the most future attention: step t attends positions
  // 0..6+t ∝ w, so a prompt position's future mass is w_j (1/18 + 1/24 + 1/25 + 1/26): {0, 2, 4}.
  const auto r = run_policy(snapkv_trace("oracle_match.h5"), "oracle",
                            {{"budget", "3"}, {"match", "snapkv[window=1,kernel=1]"}});
  EXPECT_EQ(evicted_at(r[0], -1), (V{1, 3, 5}));
  EXPECT_EQ(r[0].evicted[0].size(), 3u);
  for (int t = 0; t < 4; ++t) EXPECT_EQ(r[0].steps[0][t].cache_size, 4 + t) << t;
  // The plain oracle holds its budget.
  const auto plain = run_policy(snapkv_trace("oracle_plain.h5"), "oracle", {{"budget", "3"}});
  for (int t = 0; t < 4; ++t) EXPECT_EQ(plain[0].steps[0][t].cache_size, 4) << t;
}

TEST(OracleMatch, EveryHeadAndStepOnAGqaTrace) {
  const std::string trace = small_synthetic_trace("oracle_match_gqa.h5");
  for (const std::string match :
       {"snapkv[window=8]", "pyramidkv[window=8]", "madakv", "snapkv[window=8,decode=every:3]",
        "tova", "h2o:kvcache-factory"}) {
    const std::string name = match.substr(0, match.find('['));
    std::map<std::string, std::string> own = {{"budget", "40%"}};
    if (const auto open = match.find('['); open != std::string::npos) {
      const std::string body = match.substr(open + 1, match.size() - open - 2);
      for (std::size_t s = 0; s <= body.size();) {
        const std::size_t e = std::min(body.find(',', s), body.size());
        const std::string item = body.substr(s, e - s);
        own[item.substr(0, item.find('='))] = item.substr(item.find('=') + 1);
        s = e + 1;
      }
    }
    const auto policy = run_policy(trace, name, own);
    const auto oracle = run_policy(trace, "oracle", {{"budget", "40%"}, {"match", match}});
    ASSERT_EQ(policy.size(), oracle.size());
    for (std::size_t l = 0; l < policy.size(); ++l)
      for (std::size_t g = 0; g < policy[l].steps.size(); ++g)
        for (std::size_t t = 0; t < policy[l].steps[g].size(); ++t)
          ASSERT_EQ(oracle[l].steps[g][t].cache_size, policy[l].steps[g][t].cache_size)
              << match << " layer " << l << " head " << g << " step " << t;
  }
}

// Regret is taken against the oracle that held what the policy held when the run has one, else
// against a plain oracle at the same budget with as many cache heads; an oracle matched to a
// policy with a cache per query head keeps one per query head too.
TEST(OracleMatch, RegretPrefersTheMatchedOracle) {
  const std::string trace = small_synthetic_trace("oracle_regret.h5", 2);
  const TraceReader reader(trace);
  const std::map<std::string, std::string> snap = {{"budget", "40%"}, {"window", "8"}};
  std::vector<PolicyConfig> policies = {
      make_policy_config("snapkv", snap), make_policy_config("oracle", {{"budget", "40%"}}),
      make_policy_config("oracle@snapkv", {{"budget", "40%"}, {"match", "snapkv[window=8]"}}),
      make_policy_config("snapkv@q",
                         {{"budget", "40%"}, {"window", "8"}, {"caches", "query_head"}}),
      make_policy_config("oracle@q",
                         {{"budget", "40%"}, {"match", "snapkv[window=8,caches=query_head]"}})};
  policies[0].label = "snapkv[window=8]";  // the label the matched oracle names
  policies[3].label = "snapkv[window=8,caches=query_head]";
  std::vector<LayerResult> out;
  Replayer(reader, policies, {.threads = 1})
      .replay_sample(reader.sample_names()[0], [&](const LayerResult& r) { out.push_back(r); });
  ASSERT_EQ(out.size(), 2u * policies.size());
  for (int l = 0; l < 2; ++l) {
    const LayerResult *policy = &out[l * 5], *matched = &out[l * 5 + 2],
                      *per_query = &out[l * 5 + 3], *matched_q = &out[l * 5 + 4];
    ASSERT_EQ(matched_q->steps.size(), 4u);  // the oracle follows the per-query-head caches
    for (int t = 0; t < 12; ++t) {
      EXPECT_EQ(observed_value(*policy, "regret", 0, t),
                matched->steps[0][t].mass_recall - policy->steps[0][t].mass_recall);
      EXPECT_EQ(observed_value(*per_query, "regret", 3, t),
                matched_q->steps[3][t].mass_recall - per_query->steps[3][t].mass_recall);
      EXPECT_EQ(per_query->steps[3][t].cache_size, matched_q->steps[3][t].cache_size);
    }
  }
}

TEST(OracleMatch, BadMatchesAreRefusedAtConfiguration) {
  auto error_of = [](const std::string& match) {
    try {
      make_policy_config("oracle", {{"match", match}});
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(error_of("oracle").find("names the oracle itself"), std::string::npos);
  EXPECT_NE(error_of("nope").find("unknown policy 'nope'"), std::string::npos);
  EXPECT_NE(error_of("snapkv[wndow=8]").find("unknown parameter 'wndow'"), std::string::npos);
  EXPECT_NE(error_of("snapkv[window]").find("where key=value belongs"), std::string::npos);
  EXPECT_NE(error_of("snapkv[window=8").find("NAME[key=value,...]"), std::string::npos);
  EXPECT_EQ(error_of("snapkv:kvpress"), "accepted");
  // A tagged second oracle beside a plain one.
  const PolicyConfig tagged = make_policy_config("oracle@snapkv", {{"match", "snapkv"}});
  EXPECT_EQ(tagged.label, "oracle@snapkv");
  EXPECT_EQ(tagged.info->name, "oracle");
  EXPECT_EQ(make_policy_config("snapkv:kvpress@b", {}).params.get_int("window"), 64);
  EXPECT_THROW(make_policy_config("oracle@", {}), std::invalid_argument);
  EXPECT_THROW(make_policy_config("@x", {}), std::invalid_argument);
}

}  // namespace
}  // namespace kvsim::test
