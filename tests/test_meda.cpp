// meda and the sample entropies it allocates layer budgets with, on hand-worked traces
// (tiny_trace.hpp: d = 1, k_j = ln w_j, q = 1, so p_ij = w_j / Σ_{m<=i} w_m and the cosine of two
// keys is the product of their signs).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/sample_stats.hpp"
#include "policies/selection.hpp"
#include "tests/replay_helpers.hpp"
#include "tests/tiny_trace.hpp"
#include "traces/synth.hpp"

namespace kvsim::test {
namespace {

TEST(SampleStats, CrossModalAndFullEntropyByHand) {
  // modality [text, image, image, text], w = 1: text query 3 sees the two images uniformly
  // (entropy ln 2), text query 0 sees none (skipped); image queries 1 and 2 see one text key each
  // (entropy 0). E_CM = ln 2 + 0. Full rows: 0, ln 2, ln 3, ln 4, mean (ln 24) / 4.
  TinyTrace t{.prompt_len = 4, .weights = {1, 1, 1, 1, 1}, .modality = {0, 1, 1, 0, 0}};
  TraceReader reader(t.write("entropy.h5"));
  const SampleInfo s = reader.read_sample("s0");
  for (bool naive : {false, true}) {
    const SampleStats st = compute_sample_stats(reader, s, 2, naive);
    for (double e : {st.layers[0].cross_modal_of_mean, st.layers[0].cross_modal_mean_of_heads})
      EXPECT_NEAR(e, std::log(2.0), 1e-6);
    for (double e : {st.layers[0].full_of_mean, st.layers[0].full_mean_of_heads})
      EXPECT_NEAR(e, std::log(24.0) / 4, 1e-6);
    // Eq. 4 unmasked: both text queries see both images (ln 2 each), both image queries see both
    // text keys 0 and 3 (ln 2 each): E_CM = ln 2 + ln 2.
    for (double e : {st.layers[0].cross_modal_unmasked_of_mean,
                     st.layers[0].cross_modal_unmasked_mean_of_heads})
      EXPECT_NEAR(e, 2 * std::log(2.0), 1e-6);
  }
}

double entropy(std::vector<double> p) {
  double h = 0;
  for (double x : p) h -= x * std::log(x);
  return h;
}

TEST(SampleStats, EntropyOfTheHeadAveragedAttention) {
  // Two query heads on one KV head: head 0 has c = 1 (p ∝ w), head 1 c = 0 (uniform); modality
  // [T I I T], w = [1, 1, 3, 1]. Cross-modal rows: text row 3 over images 1, 2 — head 0
  // (1/4, 3/4), head 1 (1/2, 1/2), their mean (3/8, 5/8); image rows over text key 0: 0.
  // MEDA's E_CM is the entropy of the mean; the other reading averages the heads' entropies.
  // Full rows: row 1 (1/2, 1/2) in both heads; row 2 head 0 (1, 1, 3) / 5, head 1 uniform over 3;
  // row 3 head 0 (1, 1, 3, 1) / 6, head 1 uniform over 4.
  TinyTrace t{.prompt_len = 4,
              .weights = {1, 1, 3, 1, 1},
              .modality = {0, 1, 1, 0, 0},
              .heads = 2,
              .head_power = {1, 0}};
  TraceReader reader(t.write("entropy_heads.h5"));
  const SampleInfo s = reader.read_sample("s0");
  const double third = 1.0 / 3;
  const std::vector<double> r2h0{.2, .2, .6}, r2h1{third, third, third};
  const std::vector<double> r3h0{1. / 6, 1. / 6, .5, 1. / 6}, r3h1{.25, .25, .25, .25};
  auto mean = [](const std::vector<double>& a, const std::vector<double>& b) {
    std::vector<double> m;
    for (std::size_t i = 0; i < a.size(); ++i) m.push_back((a[i] + b[i]) / 2);
    return m;
  };
  const double full_of_mean =
      (std::log(2.0) + entropy(mean(r2h0, r2h1)) + entropy(mean(r3h0, r3h1))) / 4;
  const double full_mean_of_heads =
      (std::log(2.0) + (entropy(r2h0) + entropy(r2h1) + entropy(r3h0) + entropy(r3h1)) / 2) / 4;
  for (bool naive : {false, true}) {
    const LayerEntropies e = compute_sample_stats(reader, s, 2, naive).layers[0];
    EXPECT_NEAR(e.cross_modal_of_mean, entropy({3. / 8, 5. / 8}), 1e-6);
    EXPECT_NEAR(e.cross_modal_mean_of_heads, (entropy({.25, .75}) + std::log(2.0)) / 2, 1e-6);
    EXPECT_NEAR(e.full_of_mean, full_of_mean, 1e-6);
    EXPECT_NEAR(e.full_mean_of_heads, full_mean_of_heads, 1e-6);
    EXPECT_GT(e.cross_modal_of_mean, e.cross_modal_mean_of_heads);
    // Unmasked (Eq. 4): text rows 0 and 3 both see images 1, 2 as row 3 does; image rows 1 and 2
    // see text keys 0 and 3 (w = 1, 1) uniformly in both heads.
    EXPECT_NEAR(e.cross_modal_unmasked_of_mean, entropy({3. / 8, 5. / 8}) + std::log(2.0), 1e-6);
    EXPECT_NEAR(e.cross_modal_unmasked_mean_of_heads,
                (entropy({.25, .75}) + std::log(2.0)) / 2 + std::log(2.0), 1e-6);
  }
}

TEST(SampleStats, GroupedProductsAgreeWithTheReferenceAtAnyThreadCount) {
  // GQA (8 query heads on 2 KV heads), two images and a question: 64-row blocks and a last one of
  // another size, each KV group's heads one product. The thread count changes no byte; the plain
  // reference (double dot products, one row and head at a time) agrees to float rounding.
  SynthConfig c;
  c.layers = 2;
  c.heads = 8;
  c.kv_heads = 2;
  c.head_dim = 16;
  c.media_count = 2;
  c.media_tokens = 80;
  c.user_tokens = 12;
  c.gen_tokens = 4;
  const std::string path = temp_path("entropy_gqa.h5");
  synth_write(c, path);
  TraceReader reader(path);
  const SampleInfo s = reader.read_sample(reader.sample_names().front());
  ASSERT_GT(s.prompt_len % entropy_block_rows(c.heads, s.prompt_len), 0);
  const SampleStats one = compute_sample_stats(reader, s, 1);
  const SampleStats two = compute_sample_stats(reader, s, 2);
  const SampleStats naive = compute_sample_stats(reader, s, 1, true);
  for (int l = 0; l < c.layers; ++l) {
    const auto a = entropy_array(one.layers[l]), b = entropy_array(two.layers[l]),
               r = entropy_array(naive.layers[l]);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), sizeof(a)), 0) << "layer " << l;
    for (int e = 0; e < 6; ++e) {
      EXPECT_GT(a[e], 0) << "layer " << l << ", entropy " << e;
      EXPECT_NEAR(a[e], r[e], 1e-5) << "layer " << l << ", entropy " << e;
    }
  }
}

// P = 6, modality [T I I I I T | T], w = [2, 3, .5, 4, .25, 2 | 2], v = [1 .. 6, 8], budget 4 on
// one layer (S_l = 4), M = floor(.75 * 4) = 3, N = 1.
// A_s (prompt column sums) = [2.349, 2.024, .237, 1.172, .047, .170]; text entries 0 and 5 get
// + 2.349. Recent {3, 4, 5}; the top 1 of {0, 1, 2} is 0. Conserved {0, 3, 4, 5}, less {1, 2}.
// Merging by key sign: k1 = ln 3 > 0 matches 0, 3 and 5 equally -> the newest, 5;
// k2 = ln .5 < 0 matches only k4 = ln .25. So k5 = (ln 2 + ln 3) / 2 = ln sqrt(6), v5 = 4;
// k4 = ln sqrt(1/8), v4 = 4.
// Step 0 (w = 2) attends 0, 3, 4', 5', 6 with weights 2, 4, .3536, 2.4495, 2 (sum 10.803):
// ô = (2 + 16 + 4 * 2.8031 + 16) / 10.803 = 4.1851; full o = 54.75 / 13.75 = 3.9818, error .0511.
// Recall counts positions 0, 3, 4, 5, 6: 10.25 / 13.75.
TinyTrace meda_trace() {
  return TinyTrace{.prompt_len = 6,
                   .weights = {2, 3, 0.5, 4, 0.25, 2, 2},
                   .values = {1, 2, 3, 4, 5, 6, 8},
                   .modality = {0, 1, 1, 1, 1, 0, 0}};
}

TEST(Meda, TextPriorSelectionAndAverageMerging) {
  const auto r = run_policy(meda_trace().write("meda.h5"), "meda", {{"budget", "4"}});
  ASSERT_EQ(r[0].merged[0].size(), 2u);
  EXPECT_EQ(r[0].merged[0][0].step, -1);
  EXPECT_EQ(r[0].merged[0][0].position, 1);
  EXPECT_EQ(r[0].merged[0][0].into_position, 5);
  EXPECT_EQ(r[0].merged[0][1].position, 2);
  EXPECT_EQ(r[0].merged[0][1].into_position, 4);
  EXPECT_TRUE(r[0].evicted[0].empty());  // merged, not evicted
  const auto& m = r[0].steps[0][0];
  EXPECT_EQ(m.cache_size, 5);
  EXPECT_NEAR(m.mass_recall, 10.25 / 13.75, 1e-6);
  EXPECT_NEAR(m.output_rel_error, std::abs(3.981818 - 4.185117) / 3.981818, 1e-4);
}

TEST(Meda, WithoutMergingUnselectedEntriesAreEvicted) {
  const auto r = run_policy(meda_trace().write("meda_nomerge.h5"), "meda",
                            {{"budget", "4"}, {"merge", "false"}});
  EXPECT_EQ(evicted_at(r[0], -1), (std::vector<int>{1, 2}));
  EXPECT_TRUE(r[0].merged[0].empty());
}

TEST(Meda, FirstDecodeReading) {
  // Step 0 attends the full cache; then the recent window {4, 5, 6} includes the new token and
  // the top 1 of {0 .. 3} is 0 (text-boosted): 1, 2, 3 merge. k3 = ln 4 > 0 joins the newest
  // positive kept key, 6 (k6 = ln 2).
  const auto r = run_policy(meda_trace().write("meda_first.h5"), "meda",
                            {{"budget", "4"}, {"compress_at", "first_decode"}});
  EXPECT_FLOAT_EQ(r[0].steps[0][0].mass_recall, 1.0f);
  ASSERT_EQ(r[0].merged[0].size(), 3u);
  EXPECT_EQ(r[0].merged[0][0].step, 0);
  EXPECT_EQ(r[0].merged[0][2].position, 3);
  EXPECT_EQ(r[0].merged[0][2].into_position, 6);
}

TEST(Meda, CappedLayerSurplusIsRedistributed) {
  // Weights ∝ softmax(E) = (6, 1, 1), 3 layers of budget 4 (12 entries), at most P = 7 per layer:
  // 12 · (.75, .125, .125) = (9, 1.5, 1.5); layer 0 is capped at 7 and its 2 extra entries go to
  // layers 1 and 2 by their weights: 2.5 each, then by largest remainder (ties to the lower layer)
  // 3 and 2. Sum 12 (dropping the surplus would allocate 7 + 2 + 2 = 11).
  EXPECT_EQ(allocate_layer_budgets({6, 1, 1}, 12, 7), (std::vector<int>{7, 3, 2}));
  // Cascading caps: (10, 10, 1) of 15 with cap 6: 7.14 -> 6 twice, the last layer gets 3.
  EXPECT_EQ(allocate_layer_budgets({10, 10, 1}, 15, 6), (std::vector<int>{6, 6, 3}));
  // More than the layers can hold: every layer full.
  EXPECT_EQ(allocate_layer_budgets({1, 2}, 50, 7), (std::vector<int>{7, 7}));
  // Uncapped: (2.4, 1.2, 2.4) of 6 by largest remainder -> 2, 1, 2 and one more to layer 0 (.4,
  // ties to the lower layer).
  EXPECT_EQ(allocate_layer_budgets({2, 1, 2}, 6, 10), (std::vector<int>{3, 1, 2}));
  // A floor of one entry: (10, 1, 0) of 12, cap 10 gives layer 0 10.9 -> 10 and (2, 0) to the
  // others without it, emptying layer 2; with it layer 2 is held at 1 and layers 0 and 1 share
  // 11 as (10, 1) -> 10 (capped), 1.
  EXPECT_EQ(allocate_layer_budgets({10, 1, 0}, 12, 10), (std::vector<int>{10, 2, 0}));
  EXPECT_EQ(allocate_layer_budgets({10, 1, 0}, 12, 10, 1), (std::vector<int>{10, 1, 1}));
  // No layer below the floor: the same as without it.
  EXPECT_EQ(allocate_layer_budgets({2, 1, 2}, 6, 10, 1), (std::vector<int>{3, 1, 2}));
}

TEST(Meda, TheFloorNeverLiftsTheLayersAboveTheBudget) {
  // (20, 6, 6, 6) against 4 layers of 8 = 32 with a floor of 6: the excess 6 comes out of layer
  // 0, the only one above the floor.
  std::vector<int> sizes = {20, 6, 6, 6};
  hold_layer_total(sizes, 32, 6);
  EXPECT_EQ(sizes, (std::vector<int>{14, 6, 6, 6}));
  // (10, 10, 2, 2) against 20, floor 2: 4 too many, taken 2 and 2 (8 above the floor each).
  sizes = {10, 10, 2, 2};
  hold_layer_total(sizes, 20, 2);
  EXPECT_EQ(sizes, (std::vector<int>{8, 8, 2, 2}));
  // A floor the total cannot give every layer (3 x 5 > 6) is lowered to 6 / 3 = 2.
  sizes = {5, 5, 5};
  hold_layer_total(sizes, 6, 5);
  EXPECT_EQ(sizes, (std::vector<int>{2, 2, 2}));
  // Within the total: unchanged.
  sizes = {3, 1};
  hold_layer_total(sizes, 10, 1);
  EXPECT_EQ(sizes, (std::vector<int>{3, 1}));
}

TEST(Meda, RedistributedLayerBudgetsFollowTheEntropySoftmaxAndSumToTheTotal) {
  const std::string path = small_synthetic_trace("meda_layers.h5", 3);
  TraceReader reader(path);
  const SampleInfo s = reader.read_sample("000000");
  const SampleStats st = compute_sample_stats(reader, s, 1);
  for (const std::string reading : {"attention", "entropy"})
    for (int B : {8, 20, 40}) {
      const auto r = run_policy(path, "meda",
                                {{"budget", std::to_string(B)},
                                 {"merge", "false"},
                                 {"head_average", reading},
                                 {"cross_modal_mask", "causal"},
                                 {"surplus", "redistribute"}});
      std::vector<double> w;
      for (const auto& e : st.layers)
        w.push_back(
            std::exp(reading == "attention" ? e.cross_modal_of_mean : e.cross_modal_mean_of_heads));
      // every layer keeps at least one entry
      const auto want = allocate_layer_budgets(w, 3L * B, s.prompt_len, 1);
      int total = 0;
      for (int l = 0; l < 3; ++l) {
        EXPECT_EQ(r[l].prefill_kept_min, want[l]) << reading << " B " << B << " layer " << l;
        EXPECT_GE(r[l].prefill_kept_min, 1) << reading << " B " << B << " layer " << l;
        total += r[l].prefill_kept_min;
      }
      EXPECT_EQ(total, 3 * B) << reading << " B " << B;
    }
}

TEST(Meda, ReleasedCodeClampsEachLayerAndDropsTheSurplus) {
  // Defaults: Eq. 4 unmasked, each layer's α_l = softmax_l(E_CM) · L · ρ clamped to [.01, 1] and
  // S_l = ⌊α_l · P⌋ (at least 1), re-stated here from the sample's entropies.
  const std::string path = small_synthetic_trace("meda_clamp.h5", 3);
  TraceReader reader(path);
  const SampleInfo s = reader.read_sample("000000");
  const SampleStats st = compute_sample_stats(reader, s, 1);
  const int P = s.prompt_len;
  std::vector<double> w;
  double sum = 0;
  for (const auto& e : st.layers) sum += w.emplace_back(std::exp(e.cross_modal_unmasked_of_mean));
  int clamped = 0, held = 0;
  const int floor = std::max(1, static_cast<int>(0.01 * P));
  for (int B : {1, 8, 40, P - 1}) {
    const auto r = run_policy(path, "meda", {{"budget", std::to_string(B)}, {"merge", "false"}});
    std::vector<int> want(3);
    for (int l = 0; l < 3; ++l) {
      const double raw = w[l] / sum * 3 * B / P;
      clamped += raw < 0.01 || raw > 1;
      const double ratio = std::clamp(raw, 0.01, 1.0);
      want[l] = std::max(floor, static_cast<int>(std::floor(ratio * P + 1e-9)));
    }
    // The budget holds: an excess over 3 B (the floor lifting layers) leaves the layers above the
    // floor in proportion to what they hold above it, whole entries by largest remainder.
    const int excess = want[0] + want[1] + want[2] - 3 * B;
    if (excess > 0) {
      ++held;
      const int f = std::max(1, std::min(floor, B));
      double room = 0;
      for (int x : want) room += std::max(0, x - f);
      const double keep = std::max(0.0, room - excess);
      std::vector<double> part(3);
      int given = 0;
      for (int l = 0; l < 3; ++l) {
        part[l] = std::max(0, want[l] - f) * keep / room;
        given += static_cast<int>(part[l]);
      }
      std::vector<int> order = {0, 1, 2};
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
        return part[a] - std::floor(part[a]) > part[b] - std::floor(part[b]);
      });
      std::vector<int> extra(3, 0);
      for (int l : order)
        if (given < keep) ++extra[l], ++given;
      for (int l = 0; l < 3; ++l)
        want[l] = std::min(want[l], f + static_cast<int>(part[l]) + extra[l]);
    }
    for (int l = 0; l < 3; ++l)
      EXPECT_EQ(r[l].prefill_kept_min, want[l]) << "B " << B << " layer " << l;
  }
  EXPECT_GT(held, 0);     // B = 1: every layer lifted to one entry exceeds 3 entries
  EXPECT_GT(clamped, 0);  // the clamp was exercised (B = 1 falls below 1%, B = P - 1 above 100%)
}

}  // namespace
}  // namespace kvsim::test

namespace kvsim::test {
namespace {

TEST(Meda, MergedEntriesAreTheAverageOfTheirMembers) {
  // The hand-worked case above, inspected in the cache itself: position 5 absorbed 1 and
  // position 4 absorbed 2 (keys ln w, values v).
  TraceReader reader(meda_trace().write("meda_cache.h5"));
  const SampleInfo s = reader.read_sample("s0");
  const PolicyConfig cfg = make_policy_config("meda", {{"budget", "4"}});
  const SampleStats stats = compute_sample_stats(reader, s, 1);
  const LayerAttention att(reader.info(), s, reader.read_layer(s, 0), cfg.needs(), 1);
  KvCache cache(1, 1);
  cache.fill_prompt(s.prompt_len);
  cache.set_step(-1);
  auto policy = cfg.info->create(cfg.params, s);
  policy->on_prefill(LayerView(att, false, &stats), cache);
  ASSERT_EQ(cache.positions(0), (std::vector<std::int32_t>{0, 3, 4, 5}));
  EXPECT_EQ(cache.merged_key(0, 0), nullptr);
  EXPECT_NEAR(cache.merged_key(0, 3)[0], (std::log(2.0) + std::log(3.0)) / 2, 1e-6);
  EXPECT_NEAR(cache.merged_value(0, 3)[0], (6 + 2) / 2.0, 1e-6);
  EXPECT_NEAR(cache.merged_key(0, 2)[0], (std::log(0.25) + std::log(0.5)) / 2, 1e-6);
  EXPECT_NEAR(cache.merged_value(0, 2)[0], (5 + 3) / 2.0, 1e-6);
}

}  // namespace
}  // namespace kvsim::test
