// --prompt-tail: every policy compresses the prompt less its last N tokens (or its question), and
// those tokens are fed as ordinary decode steps against the compressed cache, so that no answer
// token is computed from the full prompt. Restated here as the trace itself split before its
// last N prompt tokens (they written as its first generated tokens) and replayed as usual.
#include <gtest/gtest.h>

#include <functional>

#include "policies/policy_config.hpp"
#include "tests/cli_helpers.hpp"
#include "tests/replay_helpers.hpp"
#include "tests/tiny_trace.hpp"
#include "traces/synth.hpp"

namespace kvsim::test {
namespace {

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    return;
  }
  ADD_FAILURE() << "no error; expected one containing: " << needle;
}

// A GQA trace with image tokens and a 10-token question after them.
std::string tail_trace() {
  static const std::string path = [] {
    SynthConfig c;
    c.samples = 1;
    c.layers = 2;
    c.heads = 4;
    c.kv_heads = 2;
    c.head_dim = 16;
    c.media_tokens = 48;
    c.user_tokens = 10;
    c.gen_tokens = 10;
    const std::string p = temp_path("prompt_tail.h5");
    synth_write(c, p);
    return p;
  }();
  return path;
}

// The trace with each sample's last `n` prompt positions (n < 0: its question) moved into its
// generated tokens, written as a trace of its own: what a prompt tail replays, restated.
std::string split_before_tail(const std::string& trace, int n, const std::string& name) {
  TraceReader reader(trace);
  const std::string path = temp_path(name);
  TraceWriter w(path, reader.info(), WriteOptions{});
  for (const std::string& sample : reader.sample_names()) {
    const SampleInfo s = reader.read_sample(sample);
    SampleInfo split = s;
    const int fed = n < 0 ? question_length(s) : n;
    split.prompt_len -= fed;
    split.gen_len += fed;
    split.question_len = -1;
    for (int i = split.prompt_len; i < s.prompt_len; ++i)
      split.segment[i] = static_cast<std::uint8_t>(Segment::kGenerated);
    w.write_sample(split);
    for (int l = 0; l < reader.info().num_layers; ++l)
      w.write_layer(split, reader.read_layer(s, l));
  }
  return path;
}

std::vector<LayerResult> replay_all(const std::string& trace, const PolicyConfig& p, int tail) {
  TraceReader reader(trace);
  Replayer replayer(reader, {p}, ReplayOptions{.threads = 2, .prompt_tail = tail});
  std::vector<LayerResult> out;
  for (const auto& s : reader.sample_names())
    replayer.replay_sample(s, [&](const LayerResult& r) { out.push_back(r); });
  return out;
}

// Every registered policy and every preset that does not append the question itself, at 30%
// where it has a budget (its own size otherwise).
std::vector<PolicyConfig> every_policy() {
  std::vector<PolicyConfig> out;
  std::vector<std::string> names = PolicyRegistry::instance().names();
  for (const auto& p : policy_presets()) names.push_back(p.name);
  for (const std::string& name : names) {
    std::map<std::string, std::string> overrides;
    apply_default_budget(name, "30%", overrides);
    PolicyConfig p = make_policy_config(name, overrides);
    if (!p.appends_question()) out.push_back(std::move(p));
  }
  return out;
}

// `p` with a budget given as a share of the prompt replaced by the entries that share keeps of
// the whole prompt: what a prompt tail compresses its part to (the orders at equal memory).
PolicyConfig on_whole_prompt(const PolicyConfig& p, TraceReader& reader) {
  const int P = reader.read_sample(reader.sample_names()[0]).prompt_len;
  if (budget_entries(p, P) < 0) return p;  // no budget, or one it sizes itself
  std::map<std::string, std::string> overrides = p.params.values();
  overrides["budget"] = std::to_string(budget_entries(p, P));
  PolicyConfig out = p;
  out.params = ParamSet(p.params.owner(), overrides);
  return out;
}

void expect_same_results(const std::vector<LayerResult>& tail,
                         const std::vector<LayerResult>& split, const std::string& what) {
  ASSERT_EQ(tail.size(), split.size()) << what;
  for (std::size_t i = 0; i < tail.size(); ++i) {
    const LayerResult &a = tail[i], &b = split[i];
    EXPECT_EQ(a.budget_entries, b.budget_entries) << what;
    ASSERT_EQ(a.steps.size(), b.steps.size()) << what;
    for (std::size_t g = 0; g < a.steps.size(); ++g) {
      ASSERT_EQ(a.steps[g].size(), b.steps[g].size()) << what;
      for (std::size_t t = 0; t < a.steps[g].size(); ++t) {
        const StepMetrics &x = a.steps[g][t], &y = b.steps[g][t];
        EXPECT_EQ(x.position, y.position) << what << " step " << t;
        EXPECT_EQ(x.cache_size, y.cache_size) << what << " step " << t;
        EXPECT_EQ(x.mass_recall, y.mass_recall) << what << " step " << t;
        EXPECT_EQ(x.output_rel_error, y.output_rel_error) << what << " step " << t;
      }
      ASSERT_EQ(a.evicted[g].size(), b.evicted[g].size()) << what << " head " << g;
      for (std::size_t e = 0; e < a.evicted[g].size(); ++e) {
        EXPECT_EQ(a.evicted[g][e].step, b.evicted[g][e].step) << what;
        EXPECT_EQ(a.evicted[g][e].position, b.evicted[g][e].position) << what;
      }
      EXPECT_EQ(a.merged[g].size(), b.merged[g].size()) << what;
    }
  }
}

TEST(PromptTail, IsTheTraceSplitBeforeItsLastTokensForEveryPolicy) {
  const std::string trace = tail_trace();
  TraceReader reader(trace);
  const int question = question_length(reader.read_sample(reader.sample_names()[0]));
  ASSERT_EQ(question, 10);
  const std::vector<PolicyConfig> policies = every_policy();
  ASSERT_GE(policies.size(), 30u);
  for (const int tail : {1, kQuestionTail}) {
    const std::string split =
        split_before_tail(trace, tail, "prompt_tail_split_" + prompt_tail_text(tail) + ".h5");
    for (const PolicyConfig& p : policies) {
      const auto with_tail = replay_all(trace, p, tail);
      const auto restated = replay_all(split, on_whole_prompt(p, reader), 0);
      expect_same_results(with_tail, restated, p.label + " tail " + prompt_tail_text(tail));
      // The fed tokens are decode steps: the first answer token's step (the tail's last) is
      // measured over the compressed cache.
      const int fed = tail == kQuestionTail ? question : tail;
      EXPECT_EQ(with_tail[0].steps[0].size(), static_cast<std::size_t>(10 + fed)) << p.label;
    }
  }
}

TEST(PromptTail, HoldsWhatTheWholePromptsCompressionHoldsAtEveryStep) {
  // Under --equal-memory a 30% budget keeps ceil(0.3 P) entries per KV head whether the whole
  // prompt is compressed or the prompt less its last token or its question: the tail's tokens
  // and the answer's are held within it, so every answer step attends as many entries in each
  // order, and the budget is stated as the same entry count. MEDA sizes its layers (their sum at
  // most L x the budget); the others hold the budget in every layer.
  const std::string trace = tail_trace();
  TraceReader reader(trace);
  const SampleInfo sample = reader.read_sample(reader.sample_names()[0]);
  const int P = sample.prompt_len, G = sample.gen_len;
  const int budget = (3 * P + 9) / 10;  // ceil(0.3 P)
  for (const char* name : {"random", "h2o", "snapkv", "tova", "streamingllm", "lookm", "meda"}) {
    std::map<std::string, std::string> overrides{{"budget", "30%"}};
    PolicyConfig p = make_policy_config(name, overrides);
    const auto equal = equal_memory_overrides(p);
    ASSERT_TRUE(equal.has_value()) << name;
    for (const auto& [key, value] : *equal) overrides[key] = value;
    p = make_policy_config(name, overrides);
    const auto whole = replay_all(trace, p, 0);
    const bool uniform = std::string(name) != "meda";
    // Every layer and KV head together: at most L x Hkv x the budget at each answer step.
    for (int t = 0; t < G; ++t) {
      int held = 0, heads = 0;
      for (const LayerResult& r : whole)
        for (const auto& head : r.steps) held += head[t].cache_size - 1, ++heads;
      EXPECT_LE(held, heads * budget) << name << " step " << t;
    }
    for (const int tail : {1, kQuestionTail}) {
      const auto with_tail = replay_all(trace, p, tail);
      ASSERT_EQ(with_tail.size(), whole.size()) << name;
      for (std::size_t i = 0; i < whole.size(); ++i) {
        EXPECT_EQ(with_tail[i].budget_entries, budget) << name;
        EXPECT_EQ(whole[i].budget_entries, budget) << name;
        for (std::size_t g = 0; g < whole[i].steps.size(); ++g) {
          const auto& a = whole[i].steps[g];
          const auto& b = with_tail[i].steps[g];
          ASSERT_EQ(a.size(), static_cast<std::size_t>(G)) << name;
          const std::size_t fed = b.size() - a.size();
          for (std::size_t t = 0; t < a.size(); ++t) {
            // cache_size counts the step's own token beside the entries held.
            EXPECT_EQ(b[fed + t].cache_size, a[t].cache_size) << name << " step " << t;
            if (uniform) {
              EXPECT_EQ(a[t].cache_size, budget + 1) << name << " step " << t;
            }
          }
          for (std::size_t t = 0; uniform && t < fed; ++t)
            EXPECT_LE(b[t].cache_size, budget + 1) << name;
        }
      }
    }
  }
}

TEST(PromptTail, FirstStepsAttendTheCompressedPrompt) {
  // h2o at a budget of 12: the fed token's step (the prompt's last position) attends the 12 kept
  // entries and itself, and loses attention mass; with the whole prompt compressed that position
  // is never a step.
  const std::string trace = tail_trace();
  TraceReader reader(trace);
  const int P = reader.read_sample(reader.sample_names()[0]).prompt_len;
  const PolicyConfig h2o = make_policy_config("h2o", {{"budget", "12"}});
  const auto r = replay_all(trace, h2o, 1);
  const StepMetrics& first = r[0].steps[0][0];
  EXPECT_EQ(first.position, P - 1);
  EXPECT_EQ(first.cache_size, 13);
  EXPECT_LT(first.mass_recall, 1.0f);
  const auto whole = replay_all(trace, h2o, 0);
  EXPECT_EQ(whole[0].steps[0][0].position, P);
  EXPECT_EQ(whole[0].steps[0].size() + 1, r[0].steps[0].size());
}

TEST(PromptTail, NoOptionChangesNothing) {
  // Without a tail the replay is today's: a tail of 0 is no tail.
  const std::string trace = tail_trace();
  for (const char* name : {"h2o", "snapkv:kvpress", "meda", "madakv"}) {
    std::map<std::string, std::string> overrides;
    apply_default_budget(name, "30%", overrides);
    const PolicyConfig p = make_policy_config(name, overrides);
    TraceReader reader(trace);
    Replayer plain(reader, {p}, ReplayOptions{.threads = 2});
    std::vector<LayerResult> expected;
    for (const auto& s : reader.sample_names())
      plain.replay_sample(s, [&](const LayerResult& r) { expected.push_back(r); });
    expect_same_results(replay_all(trace, p, 0), expected, name);
  }
}

TEST(PromptTail, RefusalsNameWhatIsWrong) {
  const std::string trace = tail_trace();
  TraceReader reader(trace);
  const PolicyConfig h2o = make_policy_config("h2o", {{"budget", "12"}});
  auto validate = [&](const PolicyConfig& p, int tail) {
    Replayer(reader, {p}, ReplayOptions{.prompt_tail = tail}).validate(reader.sample_names());
  };
  const int P = reader.read_sample(reader.sample_names()[0]).prompt_len;
  expect_error([&] { validate(h2o, P); },
               "a prompt tail of " + std::to_string(P) + " tokens leaves nothing of its");
  // A policy that appends the question itself is its own order.
  const PolicyConfig appended = make_policy_config("snapkv:kvpress", {{"budget", "12"}});
  ASSERT_TRUE(appended.appends_question());
  expect_error([&] { validate(appended, 1); }, "snapkv:kvpress: question = append is an order");
  EXPECT_NO_THROW(validate(h2o, kQuestionTail));
  // A text-only sample without a question attribute has no question to feed.
  TinyTrace t;
  t.prompt_len = 6;
  t.weights = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::string text = t.write("prompt_tail_text_only.h5");
  TraceReader text_reader(text);
  expect_error(
      [&] {
        Replayer(text_reader, {h2o}, ReplayOptions{.prompt_tail = kQuestionTail})
            .validate(text_reader.sample_names());
      },
      "has no question to feed after compression");
  // What the option takes.
  EXPECT_EQ(parse_prompt_tail("question"), kQuestionTail);
  EXPECT_EQ(parse_prompt_tail("3"), 3);
  EXPECT_EQ(parse_prompt_tail("0"), 0);
  expect_error([] { parse_prompt_tail("-1"); }, "give 'question' or a whole number");
  expect_error([] { parse_prompt_tail("two"); }, "give 'question' or a whole number");
}

TEST(PromptTail, TheCommandLineSaysItAndRefusesACompactTrace) {
  const std::string trace = tail_trace();
  const CliRun r =
      kvsim("replay " + trace + " -p h2o,snapkv --budget 20% --prompt-tail question -j 1");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("the prompt's last question fed after compression"), std::string::npos)
      << r.output;
  const CliRun bad = kvsim("replay " + trace + " -p h2o --prompt-tail some");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.output.find("give 'question' or a whole number"), std::string::npos) << bad.output;
  const std::string compact = temp_path("prompt_tail_compact.h5");
  ASSERT_EQ(kvsim("compact " + trace + " " + compact).code, 0);
  const CliRun refused = kvsim("replay " + compact + " -p h2o --budget 20% --prompt-tail 1");
  EXPECT_NE(refused.code, 0);
  EXPECT_NE(refused.output.find("needs the full trace it was compacted from"), std::string::npos)
      << refused.output;
}

}  // namespace
}  // namespace kvsim::test
