// The floors a comparison needs: random (a seeded uniform choice), downsample (a uniform grid of
// media tokens) and text_only (every media entry evicted), on hand-worked tiny traces.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "tests/replay_helpers.hpp"
#include "tests/tiny_trace.hpp"
#include "traces/synth.hpp"

namespace kvsim::test {
namespace {

using V = std::vector<int>;

// Positions a KV head still holds after the prefill, from its eviction log.
std::set<int> kept_after_prefill(const LayerResult& r, int g, int prompt_len) {
  std::set<int> kept;
  for (int j = 0; j < prompt_len; ++j) kept.insert(j);
  for (const auto& e : r.evicted[g])
    if (e.step == -1) kept.erase(e.position);
  return kept;
}

// P = 20 prompt positions and 6 generated, 4 layers, 2 KV heads (8 caches per replay).
std::string random_trace(const std::string& name) {
  TinyTrace t{.prompt_len = 20, .layers = 4};
  for (int i = 0; i < 26; ++i) {
    t.weights.push_back(1 + (i * 7) % 5);
    t.weights_kv1.push_back(1 + (i * 3) % 4);
  }
  return t.write(name);
}

TEST(RandomFloor, HoldsTheBudgetAndItsProtectedEntries) {
  const std::string trace = random_trace("random_budget.h5");
  // budget 5 = sink 0 + window 18, 19 + 2 drawn among positions 1..17; decode = cap holds 5.
  const auto r = run_policy(trace, "random",
                            {{"budget", "5"}, {"sinks", "1"}, {"window", "2"}, {"decode", "cap"}});
  ASSERT_EQ(r.size(), 4u);
  for (const auto& layer : r)
    for (int g = 0; g < 2; ++g) {
      const auto kept = kept_after_prefill(layer, g, 20);
      ASSERT_EQ(kept.size(), 5u);
      EXPECT_TRUE(kept.count(0) && kept.count(18) && kept.count(19));
      for (const auto& m : layer.steps[g]) EXPECT_EQ(m.cache_size, 6);  // 5 + the new token
      // A decode eviction never takes a sink or an entry of the window that ends at the step's
      // new token (positions P + t - 1 and P + t at step t).
      for (const auto& e : layer.evicted[g])
        if (e.step >= 0) {
          EXPECT_NE(e.position, 0);
          EXPECT_LT(e.position, 20 + e.step - 1) << "step " << e.step;
        }
    }
  // Without decode = cap the generated tokens are appended (the policy decides once).
  const auto grow = run_policy(trace, "random", {{"budget", "5"}});
  EXPECT_EQ(grow[0].steps[0].back().cache_size, 5 + 6);
  // A budget below the sinks is refused; one below sinks + window clamps the window to what the
  // sinks leave (here 1: the sink and the newest position, nothing drawn), at every step.
  EXPECT_THROW(run_policy(trace, "random", {{"budget", "2"}, {"sinks", "3"}}),
               std::invalid_argument);
  for (int seed = 0; seed < 3; ++seed) {
    const auto clamped = run_policy(trace, "random",
                                    {{"budget", "2"},
                                     {"sinks", "1"},
                                     {"window", "2"},
                                     {"decode", "cap"},
                                     {"seed", std::to_string(seed)}});
    for (const auto& layer : clamped)
      for (int g = 0; g < 2; ++g) {
        EXPECT_EQ(kept_after_prefill(layer, g, 20), (std::set<int>{0, 19}));
        // Decoding slides the one-entry window: step t evicts position P + t - 1.
        for (const auto& e : layer.evicted[g]) {
          if (e.step < 0) continue;
          EXPECT_EQ(e.position, 20 + e.step - 1) << "step " << e.step;
        }
      }
  }
}

TEST(RandomFloor, IsUniformOverTheEvictableEntriesAndIndependentPerCache) {
  // 250 seeds x 4 layers x 2 KV heads = 2,000 draws of 2 entries among the 17 evictable ones.
  // Each evictable position is kept with p = 2/17: its count is Binomial(2000, p), mean 235.3,
  // SD sqrt(2000 p (1 - p)) = 14.4; every count must lie within 5 SD of the mean (a fair draw
  // fails this for one of 17 positions with probability < 1e-5; a draw that favoured the newer or
  // the older entries, or repeated one set, would be far outside).
  const std::string trace = random_trace("random_uniform.h5");
  const int seeds = 250, evictable = 17;
  const double p = 2.0 / evictable, n = seeds * 8.0;
  std::vector<int> count(20, 0);
  int same_as_previous_layer = 0, same_as_other_head = 0, same_as_previous_seed = 0;
  std::set<int> previous_seed_first;
  for (int seed = 0; seed < seeds; ++seed) {
    const auto r = run_policy(
        trace, "random",
        {{"budget", "5"}, {"sinks", "1"}, {"window", "2"}, {"seed", std::to_string(seed)}});
    for (std::size_t l = 0; l < r.size(); ++l)
      for (int g = 0; g < 2; ++g) {
        const auto kept = kept_after_prefill(r[l], g, 20);
        for (int j : kept) ++count[j];
        if (l > 0) same_as_previous_layer += kept == kept_after_prefill(r[l - 1], g, 20);
        if (g == 1) same_as_other_head += kept == kept_after_prefill(r[l], 0, 20);
      }
    const auto first = kept_after_prefill(r[0], 0, 20);
    same_as_previous_seed += first == previous_seed_first;
    previous_seed_first = first;
  }
  EXPECT_EQ(count[0], n);
  EXPECT_EQ(count[18], n);
  EXPECT_EQ(count[19], n);
  const double sd = std::sqrt(n * p * (1 - p));
  for (int j = 1; j <= evictable; ++j) EXPECT_NEAR(count[j], n * p, 5 * sd) << "position " << j;
  // Two independent draws give the same pair with probability 1/136: of 750 (layer) and 1,000
  // (head) and 249 (seed) comparisons about 5.5, 7.4 and 1.8 are expected; 30 bounds them all
  // far above (P < 1e-10), where a draw shared by layers, heads or seeds would give every one.
  EXPECT_LT(same_as_previous_layer, 30);
  EXPECT_LT(same_as_other_head, 30);
  EXPECT_LT(same_as_previous_seed, 30);
}

TEST(RandomFloor, SameDrawWhateverTheThreadsAndDifferentPerSample) {
  const std::string path = small_synthetic_trace("random_threads.h5", 3);
  const auto one = run_policy(path, "random", {{"budget", "24"}, {"seed", "3"}}, 1);
  const auto four = run_policy(path, "random", {{"budget", "24"}, {"seed", "3"}}, 4);
  ASSERT_EQ(one.size(), four.size());
  for (std::size_t i = 0; i < one.size(); ++i)
    for (std::size_t g = 0; g < one[i].evicted.size(); ++g) {
      ASSERT_EQ(one[i].evicted[g].size(), four[i].evicted[g].size());
      for (std::size_t e = 0; e < one[i].evicted[g].size(); ++e)
        EXPECT_EQ(one[i].evicted[g][e].position, four[i].evicted[g][e].position);
    }
  // Two samples of one prompt length draw differently (the draw hashes the sample's name).
  SynthConfig c;
  c.samples = 2;
  c.layers = 1;
  c.gen_tokens = 2;
  const std::string two = temp_path("random_two_samples.h5");
  synth_write(c, two);
  std::map<std::string, std::vector<int>> by_sample;
  for (const auto& r : run_policy(two, "random", {{"budget", "24"}}))
    if (r.layer == 0)
      for (const auto& e : r.evicted[0]) by_sample[r.sample].push_back(e.position);
  ASSERT_GE(by_sample.size(), 2u);
  EXPECT_NE(by_sample.begin()->second, std::next(by_sample.begin())->second);
}

// modality: 2 text, a 4 x 4 image (positions 2..17), 2 text; P = 20, one generated token.
TinyTrace grid_trace() {
  TinyTrace t{.prompt_len = 20, .weights = std::vector<double>(21, 1.0)};
  t.modality.assign(21, 0);
  for (int j = 2; j < 18; ++j) t.modality[j] = 1;
  return t;
}

TEST(Downsample, KeepsTheTextThenAUniformGridOfTheImage) {
  const std::string trace = grid_trace().write("downsample_grid.h5");
  // budget 8: the 4 text entries, then 4 of 16 image tokens. The 4 x 4 grid keeps r =
  // round(sqrt(4)) = 2 rows, floor((i + 1/2) 4 / 2) = 1, 3, and 2 columns in each, 1, 3: image
  // indices 5, 7, 13, 15, positions 2 + those.
  auto r = run_policy(trace, "downsample", {{"budget", "8"}});
  EXPECT_EQ(kept_after_prefill(r[0], 0, 20), (std::set<int>{0, 1, 7, 9, 15, 17, 18, 19}));
  // budget 7: 3 image tokens. r = round(sqrt(3)) = 2 rows (1 and 3); the first row takes the
  // extra column: row 1 keeps columns floor((j + 1/2) 4 / 2) = 1, 3, row 3 keeps floor(2) = 2.
  // Image indices 5, 7, 14.
  r = run_policy(trace, "downsample", {{"budget", "7"}});
  EXPECT_EQ(kept_after_prefill(r[0], 0, 20), (std::set<int>{0, 1, 7, 9, 16, 18, 19}));
  // grid = none: every (16 / 4)-th token at the centre of its stretch: floor((j + 1/2) 4) =
  // 2, 6, 10, 14.
  r = run_policy(trace, "downsample", {{"budget", "8"}, {"grid", "none"}});
  EXPECT_EQ(kept_after_prefill(r[0], 0, 20), (std::set<int>{0, 1, 4, 8, 12, 16, 18, 19}));
  // grid = 2x8 (two rows of eight): 4 tokens in r = round(sqrt(4 * 2 / 8)) = 1 row, row
  // floor(1/2 * 2) = 1, columns floor((j + 1/2) 8 / 4) = 1, 3, 5, 7: image indices 9, 11, 13, 15.
  r = run_policy(trace, "downsample", {{"budget", "8"}, {"grid", "2x8"}});
  EXPECT_EQ(kept_after_prefill(r[0], 0, 20), (std::set<int>{0, 1, 11, 13, 15, 17, 18, 19}));
  EXPECT_THROW(run_policy(trace, "downsample", {{"grid", "4by4"}}), std::invalid_argument);
}

TEST(Downsample, SharesTheMediaBudgetByItemSizeAndCapsWithMediaFirst) {
  // Two images by media id: 12 tokens (positions 1..12, no square: 1-D) and 4 (13..16, 2 x 2);
  // text at 0 and 17. budget 6: 2 text + 4 media, shared 12 : 4 -> 3 and 1.
  TinyTrace t{.prompt_len = 18, .weights = std::vector<double>(20, 1.0)};
  t.modality.assign(20, 0);
  t.media_id.assign(20, -1);
  for (int j = 1; j < 17; ++j) t.modality[j] = 1, t.media_id[j] = j < 13 ? 0 : 1;
  const std::string trace = t.write("downsample_items.h5");
  // Image 0 keeps floor((j + 1/2) 12 / 3) = 2, 6, 10 -> positions 3, 7, 11. Image 1 (2 x 2) keeps
  // one token: r = 1 row, floor(1/2 * 2) = 1, column floor(1/2 * 2) = 1: index 3 -> position 16.
  auto r = run_policy(trace, "downsample", {{"budget", "6"}, {"decode", "cap"}});
  EXPECT_EQ(kept_after_prefill(r[0], 0, 18), (std::set<int>{0, 3, 7, 11, 16, 17}));
  // decode = cap: each generated token pushes out the oldest media entry (text outranks media).
  EXPECT_EQ(evicted_at(r[0], 0), (V{3}));
  EXPECT_EQ(evicted_at(r[0], 1), (V{7}));
  // A budget below the text keeps the newest text and says so.
  TraceReader reader(trace);
  Replayer replayer(reader, {make_policy_config("downsample", {{"budget", "1"}})}, {});
  const auto notes = replayer.validate(reader.sample_names());
  ASSERT_EQ(notes.at("downsample").size(), 1u);
  EXPECT_NE(notes.at("downsample")[0].find("exceed the budget of 1"), std::string::npos);
  r = run_policy(trace, "downsample", {{"budget", "1"}});
  EXPECT_EQ(kept_after_prefill(r[0], 0, 18), (std::set<int>{17}));
}

TEST(TextOnly, EvictsEveryMediaEntryAfterThePrefillAndNothingElse) {
  const auto r = run_policy(grid_trace().write("text_only.h5"), "text_only", {});
  EXPECT_EQ(kept_after_prefill(r[0], 0, 20), (std::set<int>{0, 1, 18, 19}));
  EXPECT_EQ(r[0].evicted[0].size(), 16u);
  EXPECT_EQ(r[0].steps[0][0].cache_size, 5);
}

}  // namespace
}  // namespace kvsim::test
