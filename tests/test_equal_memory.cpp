// --equal-memory: every budgeted policy and preset holds at most its budget's entries at every
// decode step; --set '*.key=value'; the policies that size themselves are reported apart.
#include <gtest/gtest.h>

#include "policies/policy_config.hpp"
#include "tests/cli_helpers.hpp"
#include "tests/replay_helpers.hpp"
#include "tests/tiny_trace.hpp"
#include "traces/synth.hpp"

namespace kvsim::test {
namespace {

// Every registered policy and preset that declares a budget, but those that pin theirs to
// `auto` (hae:table1: the size DAP leaves), which equal memory refuses (tested below).
std::vector<std::string> budgeted_names() {
  std::vector<std::string> names;
  for (const auto& n : PolicyRegistry::instance().names())
    if (n != "full" && policy_declares(n, "budget")) names.push_back(n);
  for (const auto& p : policy_presets())
    if (policy_declares(p.name, "budget") &&
        !(p.params.count("budget") && p.params.at("budget") == "auto"))
      names.push_back(p.name);
  return names;
}

TEST(EqualMemory, EveryBudgetedPolicyHoldsAtMostItsBudgetAtEveryStep) {
  // GQA, image tokens and a question after them (kvpress's presets append it unless held), 24
  // decode steps: long enough for HAE's bin and the growing policies to pass the budget.
  SynthConfig c;
  c.samples = 2;
  c.layers = 3;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 16;
  c.media_tokens = 96;
  c.user_tokens = 12;
  c.gen_tokens = 24;
  const std::string trace = temp_path("equal_memory.h5");
  synth_write(c, trace);
  const std::vector<std::string> names = budgeted_names();
  // 20%, and 7 entries: fewer than LOOK-M's 4 sinks and its recent window of 5 together.
  std::vector<PolicyConfig> configs;
  for (const std::string budget : {"20%", "7"}) {
    const auto some =
        resolve_policy_list(names, {}, {.budget = budget, .seeds = 1, .equal_memory = true});
    ASSERT_EQ(some.size(), names.size());
    configs.insert(configs.end(), some.begin(), some.end());
  }
  TraceReader reader(trace);
  for (const PolicyConfig& config : configs) {
    Replayer replayer(reader, {config}, ReplayOptions{.threads = 1});
    for (const auto& sample : reader.sample_names()) {
      std::vector<long> held;  // Σ over layers and KV heads, per decode step
      int budget = -1, layers = 0;
      replayer.replay_sample(sample, [&](const LayerResult& r) {
        budget = r.budget_entries;
        ++layers;
        ASSERT_EQ(r.steps.size(), 2u) << config.label << ": one cache per KV head";
        for (const auto& head : r.steps) {
          held.resize(head.size(), 0);
          for (std::size_t t = 0; t < head.size(); ++t) held[t] += head[t].cache_size - 1;
        }
      });
      ASSERT_GT(budget, 0) << config.label;
      ASSERT_EQ(held.size(), 24u) << config.label;
      for (std::size_t t = 0; t < held.size(); ++t)
        EXPECT_LE(held[t], static_cast<long>(budget) * layers * 2)
            << config.label << " (" << config.params.str() << ") on " << sample << " at step " << t;
    }
  }
}

TEST(EqualMemory, SetsEachPolicysOwnReadingAndRefusesAConflict) {
  const auto configs = resolve_policy_list(
      {"snapkv", "h2o:kvcache-factory", "streamingllm:kvpress", "lookm:released", "hae", "fastv"},
      {}, {.budget = "20%", .equal_memory = true});
  auto value = [&](int i, const std::string& key) { return configs[i].params.values().at(key); };
  EXPECT_EQ(value(0, "decode"), "cap");
  EXPECT_EQ(value(1, "mode"), "cumulative");  // H2O's own decoding eviction
  EXPECT_EQ(value(2, "compress"), "every_step");
  EXPECT_EQ(value(2, "question"), "compress");
  EXPECT_EQ(value(2, "budget_rounding"), "ceil");
  EXPECT_EQ(value(3, "text"), "prior");
  EXPECT_EQ(value(4, "hold"), "budget");
  EXPECT_EQ(configs[5].params.values().count("decode"), 0u);  // fastv sizes itself: unchanged
  EXPECT_EQ(configs[3].label, "lookm:released");
  // Without the switch nothing changes.
  const auto plain = resolve_policy_list({"snapkv", "lookm:released"}, {}, {.budget = "20%"});
  EXPECT_EQ(plain[0].params.values().at("decode"), "grow");
  EXPECT_EQ(plain[1].params.values().at("text"), "all");
  // A value the user chose that would hold more is an error naming it; hae needs a budget.
  EXPECT_THROW(resolve_policy_list({"snapkv"}, {"snapkv.decode=grow"},
                                   {.budget = "20%", .equal_memory = true}),
               std::invalid_argument);
  EXPECT_THROW(resolve_policy_list({"hae"}, {}, {.equal_memory = true}), std::invalid_argument);
  EXPECT_THROW(resolve_policy_list({"hae:table1"}, {}, {.budget = "20%", .equal_memory = true}),
               std::invalid_argument);
}

TEST(EqualMemory, WildcardSetReachesEveryPolicyWithTheKey) {
  const auto configs =
      resolve_policy_list({"snapkv", "knorm", "h2o"}, {"*.decode=cap", "knorm.decode=every:4"}, {});
  EXPECT_EQ(configs[0].params.values().at("decode"), "cap");
  EXPECT_EQ(configs[1].params.values().at("decode"), "every:4");  // the explicit one wins
  EXPECT_EQ(configs[2].params.values().count("decode"), 0u);
  EXPECT_THROW(resolve_policy_list({"h2o"}, {"*.decode=cap"}, {}), std::invalid_argument);
  // The CLI names the policies that lack the key.
  const std::string trace = small_synthetic_trace("wildcard.h5", 2);
  const CliRun r = kvsim("replay " + trace + " -p snapkv,h2o --budget 20% --set '*.decode=cap'");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("--set *.decode=cap leaves h2o as they are"), std::string::npos)
      << r.output;
}

TEST(EqualMemory, TheTableFlagsWhatIsNotAtTheBudgetAndSetsSelfSizingApart) {
  const std::string trace = small_synthetic_trace("held_flag.h5", 2);
  CliRun r = kvsim("replay " + trace + " -p full,h2o,snapkv,fastv --budget 20%");
  ASSERT_EQ(r.code, 0) << r.output;
  // P = 52: 20% keeps 11; snapkv appends its 12 generated tokens, 11 + 11 held when the last
  // step attends: 2.00 x the budget.
  EXPECT_NE(r.output.find("2.00!"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("sizing their caches themselves"), std::string::npos);
  EXPECT_LT(r.output.find("snapkv"), r.output.find("sizing their caches"));
  EXPECT_GT(r.output.find("fastv  "), r.output.find("sizing their caches"));
  r = kvsim("replay " + trace + " -p full,h2o,snapkv,fastv --budget 20% --equal-memory");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find("!"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--equal-memory: fastv size their caches themselves"), std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace kvsim::test

namespace kvsim::test {
namespace {

// The one builder of a run's policy list (replay, sweeps, Python): requests in order, a made
// configuration passed through in its place, seeds per drawing policy, labels made from the
// configuration, the user's grid values checked against equal memory as the configuration holds
// them, and the warnings in the order a run gives them.
TEST(PolicyList, OneBuilderForEveryFrontEnd) {
  PolicyConfig made;
  made.label = "mine";
  made.info = &PolicyRegistry::instance().get("full");
  std::vector<std::string> warnings;
  const auto configs =
      build_policy_list({{.name = "hae"},
                         {.name = "random"},
                         {.name = "mine", .made = made},
                         {.name = "snapkv",
                          .chosen = {{"window", "8"}},
                          .label =
                              [](const PolicyConfig& c) {
                                return "snapkv[window=" + c.params.get_string("window") + "]";
                              }},
                         {.name = "st3"}},
                        {.budget = "20%", .seeds = 2, .equal_memory = true},
                        [&](const std::string& w) { warnings.push_back(w); });
  std::vector<std::string> labels;
  for (const auto& c : configs) labels.push_back(c.label);
  EXPECT_EQ(labels, (std::vector<std::string>{"hae", "random@seed0", "random@seed1", "mine",
                                              "snapkv[window=8]", "st3"}));
  EXPECT_EQ(configs[1].params.get_int("seed"), 0);
  EXPECT_EQ(configs[2].params.get_int("seed"), 1);
  EXPECT_EQ(configs[3].info, made.info);
  EXPECT_EQ(configs[4].params.get_string("decode"), "cap");  // held to its budget
  EXPECT_EQ(configs[0].params.get_string("budget"), "20%");  // --budget replaced auto
  ASSERT_EQ(warnings.size(), 3u);
  EXPECT_EQ(warnings[0].rfind("warning: the budget 20% does not apply to st3", 0), 0u);
  EXPECT_EQ(warnings[1].rfind("warning: --budget 20% replaces the default budget = auto of hae", 0),
            0u);
  EXPECT_EQ(warnings[2].rfind("warning: --equal-memory: st3 size their caches themselves", 0), 0u);
  // A value the user chose that equal memory must change is refused, named by its label.
  try {
    build_policy_list({{.name = "snapkv",
                        .chosen = {{"decode", "grow"}},
                        .label = [](const PolicyConfig&) { return "snapkv[decode=grow]"; }}},
                      {.equal_memory = true}, {});
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("snapkv[decode=grow].decode=grow"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kvsim::test
