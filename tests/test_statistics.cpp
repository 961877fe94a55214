// Intervals and paired comparisons (analysis/bootstrap.hpp, analysis/paired.hpp) against worked
// examples and re-statements of the documented methods.
#include <gtest/gtest.h>

#include <algorithm>

#include "analysis/bootstrap.hpp"
#include "analysis/paired.hpp"
#include "analysis/seed_comparison.hpp"
#include "core/splitmix.hpp"

namespace kvsim::test {
namespace {

TEST(Bootstrap, QuantileIsNumpysLinearInterpolation) {
  const std::vector<double> x = {1, 2, 3, 4};
  EXPECT_DOUBLE_EQ(quantile_sorted(x, 0.25), 1.75);  // position 0.75
  EXPECT_DOUBLE_EQ(quantile_sorted(x, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(quantile_sorted(x, 1.0), 4.0);
}

TEST(Bootstrap, TwoSamplesGiveTheWholeRange) {
  // Two samples 0 and 1: a resample's mean is 0, 1/2 or 1 with probabilities 1/4, 1/2, 1/4, so
  // the 2.5% and 97.5% quantiles of many resamples are 0 and 1.
  const Interval i = bootstrap_mean({0.0, 1.0}, {.resamples = 4000});
  EXPECT_EQ(i.low, 0.0);
  EXPECT_EQ(i.high, 1.0);
  // One sample: no interval.
  EXPECT_FALSE(bootstrap_mean({0.5}).valid());
}

TEST(Bootstrap, EqualsARestatementOfTheMethodAndRepeatsItsBytes) {
  // Samples with (sum, rows) = (3, 4), (1, 2), (5, 5), (0, 3), (2, 2): the pooled ratio.
  const std::vector<double> num = {3, 1, 5, 0, 2}, den = {4, 2, 5, 3, 2};
  const BootstrapOptions o{.resamples = 500, .level = 0.9, .seed = 7};
  // Re-statement: resample r takes 5 indices in turn from the SplitMix64 stream seeded 7, each
  // floor(next · 5 / 2^64); its statistic is Σ num / Σ den; the interval is the 5% and 95%
  // quantiles (type 7) of the 500 sorted statistics.
  SplitMix64 stream(7);
  std::vector<double> stats;
  for (int r = 0; r < 500; ++r) {
    double a = 0, b = 0;
    for (int i = 0; i < 5; ++i) {
      const auto k =
          static_cast<std::size_t>((static_cast<unsigned __int128>(stream.next()) * 5) >> 64);
      a += num[k];
      b += den[k];
    }
    stats.push_back(a / b);
  }
  std::sort(stats.begin(), stats.end());
  const auto q = [&](double p) {
    const double pos = p * 499;
    const int lo = static_cast<int>(pos);
    return stats[lo] + (pos - lo) * (stats[lo + 1] - stats[lo]);
  };
  const Interval got = bootstrap_ratio(num, den, o);
  EXPECT_DOUBLE_EQ(got.low, q(0.05));
  EXPECT_DOUBLE_EQ(got.high, q(0.95));
  EXPECT_LE(got.low, 11.0 / 16);  // around the pooled ratio 11/16
  EXPECT_GE(got.high, 11.0 / 16);
  const Interval again = bootstrap_ratio(num, den, o);
  EXPECT_EQ(got.low, again.low);
  EXPECT_EQ(got.high, again.high);
}

TEST(Bootstrap, MeanAndSd) {
  const MeanSd m = mean_sd({2, 4, 4, 4, 5, 5, 7, 9});
  EXPECT_DOUBLE_EQ(m.mean, 5.0);
  EXPECT_NEAR(m.sd, std::sqrt(32.0 / 7), 1e-12);
  EXPECT_TRUE(std::isnan(mean_sd({1}).sd));
}

// Two seeds by two items, d = [[1, -3], [2, 4]]: the 16 equally likely resamples (a seed pair,
// an item pair) average to, seeds (0,0): 1, -1, -1, -3; (1,1): 2, 3, 3, 4; (0,1) and (1,0):
// 1.5, 1, 1, 0.5 each. So P(mean <= 0) = 3/16, P(mean >= 0) = 13/16, p = 2 * 3/16 = 0.375, and
// every atom holds 1/16 > 2.5%: the 95% interval is the smallest and largest, [-3, 4].
TEST(CrossedBootstrap, TwoSeedsByTwoItemsByHand) {
  const std::vector<std::vector<double>> d = {{1, -3}, {2, 4}};
  const CrossedBootstrap b = crossed_bootstrap(d, {.resamples = 100000, .seed = 7});
  EXPECT_EQ(b.seeds, 2);
  EXPECT_EQ(b.items, 2);
  EXPECT_DOUBLE_EQ(b.mean, 1.0);
  EXPECT_DOUBLE_EQ(b.interval.low, -3.0);
  EXPECT_DOUBLE_EQ(b.interval.high, 4.0);
  EXPECT_NEAR(b.p_value, 0.375, 0.006);
  // The 16 atoms' SD about their mean 1: Σ (x − 1)² / 16 = (16 + 4 + 4 + 0 + 1 + 4 + 4 + 9 +
  // 2 · (0.25 + 0 + 0 + 0.25)) / 16 = 43 / 16.
  EXPECT_NEAR(b.standard_error, std::sqrt(43.0 / 16.0), 0.01);
  // The same bytes again; another stream, another draw of the same distribution.
  const CrossedBootstrap again = crossed_bootstrap(d, {.resamples = 100000, .seed = 7});
  EXPECT_EQ(again.p_value, b.p_value);
  EXPECT_NEAR(crossed_bootstrap(d, {.resamples = 100000, .seed = 8}).p_value, 0.375, 0.006);
}

// Models that differ and items that do not: every item agrees within a seed, seeds disagree in
// sign (means +0.3, -0.2, +0.25, -0.3, +0.1; overall +0.03). Resampling items alone (each item's
// value averaged over seeds: 0.03 for every item) gives the zero-width interval [0.03, 0.03],
// "shown"; resampling seeds as well covers 0.
TEST(CrossedBootstrap, ASeedEffectIsNotShownByItemsAlone) {
  const std::vector<double> by_seed = {0.3, -0.2, 0.25, -0.3, 0.1};
  std::vector<std::vector<double>> d;
  for (double c : by_seed) d.emplace_back(10, c);
  const Interval items_only = bootstrap_mean(std::vector<double>(10, 0.03));
  EXPECT_NEAR(items_only.low, 0.03, 1e-12);
  EXPECT_NEAR(items_only.high, 0.03, 1e-12);
  const CrossedBootstrap b = crossed_bootstrap(d);
  EXPECT_NEAR(b.mean, 0.03, 1e-12);
  EXPECT_LT(b.interval.low, 0.0);
  EXPECT_GT(b.interval.high, 0.0);
  EXPECT_GT(b.p_value, 0.05);
  // The resampled mean is a mean of seed means here: within the seeds' range.
  EXPECT_GE(b.interval.low, -0.3);
  EXPECT_LE(b.interval.high, 0.3);
}

TEST(CrossedBootstrap, ADifferenceInEveryCellIsShown) {
  std::vector<std::vector<double>> d(5, std::vector<double>(20));
  for (int s = 0; s < 5; ++s)
    for (int i = 0; i < 20; ++i) d[s][i] = 0.1 + 0.01 * ((s * 7 + i * 3) % 5);
  const CrossedBootstrap b = crossed_bootstrap(d);
  EXPECT_GT(b.interval.low, 0.0);
  EXPECT_DOUBLE_EQ(b.p_value, 2.0 / 2001.0);  // no resampled mean at or below 0
}

TEST(CrossedBootstrap, BadShapesAreRefusedAndOneSeedHasNoInterval) {
  EXPECT_THROW(crossed_bootstrap({}), std::invalid_argument);
  EXPECT_THROW(crossed_bootstrap({{1, 2}, {3}}), std::invalid_argument);
  EXPECT_THROW(crossed_bootstrap({{1, NAN}, {3, 4}}), std::invalid_argument);
  const CrossedBootstrap one = crossed_bootstrap({{1, 2, 3}});
  EXPECT_DOUBLE_EQ(one.mean, 2.0);
  EXPECT_FALSE(one.interval.valid());
  EXPECT_TRUE(std::isnan(one.p_value));
}

TEST(Paired, McNemarExact) {
  // 15 vs 6 discordant: P(X <= 6), X ~ Bin(21, 1/2) = (1 + 21 + 210 + 1330 + 5985 + 20349 +
  // 54264) / 2^21 = 82160 / 2097152; two-sided twice that.
  EXPECT_NEAR(mcnemar_exact_p(15, 6), 2 * 82160.0 / 2097152, 1e-12);
  EXPECT_NEAR(mcnemar_exact_p(6, 15), 2 * 82160.0 / 2097152, 1e-12);
  EXPECT_DOUBLE_EQ(mcnemar_exact_p(0, 0), 1.0);
  EXPECT_DOUBLE_EQ(mcnemar_exact_p(3, 3), 1.0);  // capped at 1
  EXPECT_NEAR(mcnemar_exact_p(5, 0), 2.0 / 32, 1e-15);
}

TEST(Paired, SignFlipExactAndDrawn) {
  // d = 1, 2, 3: the 8 sign patterns sum to ±6, ±4, ±2, 0, 0; |s| >= 6 in 2 of them.
  EXPECT_DOUBLE_EQ(sign_flip_p({1, 2, 3}, {}), 0.25);
  EXPECT_DOUBLE_EQ(sign_flip_p({0, 0}, {}), 1.0);
  // 40 differences of +1: only the two all-equal patterns reach 40, so p = 2^-39 exactly; drawn
  // from 20,000 patterns (none reaches it) p = 1 / 20,001.
  EXPECT_DOUBLE_EQ(sign_flip_p(std::vector<double>(40, 1.0), {}), 1.0 / 20001);
}

TEST(Paired, HolmStepDown) {
  // p = .01, .04, .03, .005 (m = 4): sorted .005 x 4 = .02, .01 x 3 = .03, .03 x 2 = .06,
  // .04 x 1 = .04 -> max with .06 = .06.
  std::vector<PairedComparison> family(4);
  const double p[] = {0.01, 0.04, 0.03, 0.005};
  for (int i = 0; i < 4; ++i) family[i].p_value = p[i], family[i].difference = 1;
  holm_adjust(family);
  EXPECT_NEAR(family[0].p_holm, 0.03, 1e-15);
  EXPECT_NEAR(family[1].p_holm, 0.06, 1e-15);
  EXPECT_NEAR(family[2].p_holm, 0.06, 1e-15);
  EXPECT_NEAR(family[3].p_holm, 0.02, 1e-15);
  EXPECT_EQ(family[0].verdict, "better");
  EXPECT_EQ(family[1].verdict, "no difference shown");
}

TEST(Paired, ADifferenceShownAndOneNot) {
  // 60 answers. Policy A: right on 20 the reference misses and wrong on 2 it gets (b = 20, c = 2,
  // p = 2 P(X <= 2 | 22) = 2 · 254 / 2^22); B: 6 against 4 (p = 2 · 386 / 1024 > .05).
  std::vector<double> ref(60, 0), a(60, 0), b(60, 0);
  for (int i = 0; i < 30; ++i) ref[i] = a[i] = b[i] = 1;  // 30 right by all
  for (int i = 30; i < 50; ++i) a[i] = 1;                 // 20 only A
  a[0] = a[1] = 0;                                        // 2 only the reference
  for (int i = 30; i < 36; ++i) b[i] = 1;
  for (int i = 0; i < 4; ++i) b[i] = 0;
  std::vector<PairedComparison> family = {compare_paired("A", a, "ref", ref),
                                          compare_paired("B", b, "ref", ref)};
  EXPECT_TRUE(family[0].binary);
  EXPECT_EQ(family[0].wins, 20);
  EXPECT_EQ(family[0].losses, 2);
  EXPECT_EQ(family[0].ties, 38);
  EXPECT_NEAR(family[0].difference, 18.0 / 60, 1e-15);
  EXPECT_NEAR(family[0].p_value, 2 * (1 + 22 + 231) / 4194304.0, 1e-12);
  EXPECT_NEAR(family[1].p_value, 2 * (1 + 10 + 45 + 120 + 210) / 1024.0, 1e-12);
  holm_adjust(family);
  EXPECT_EQ(family[0].verdict, "better");
  EXPECT_NEAR(family[0].p_holm, 2 * family[0].p_value, 1e-15);  // the smaller of two, x 2
  EXPECT_EQ(family[1].verdict, "no difference shown");
  EXPECT_GT(family[0].interval.low, 0);
  EXPECT_LT(family[1].interval.low, 0);
  // Differences −1 (×4), +1 (×6), 0 (×50): mean 2/60, SD of the 60 differences
  // sqrt((10 − 60 (1/30)^2) / 59); detectable (1.959964 + 0.841621) SD / sqrt(60).
  const double sd = std::sqrt((10 - 60.0 / 900) / 59);
  EXPECT_NEAR(family[1].effect_size, (2.0 / 60) / sd, 1e-12);
  EXPECT_NEAR(family[1].detectable, (1.959964 + 0.841621) * sd / std::sqrt(60.0), 1e-5);
  // Lower is better (an error): the same differences are losses.
  const PairedComparison err = compare_paired("A", a, "ref", ref, {.higher_is_better = false});
  EXPECT_EQ(err.wins, 2);
  EXPECT_EQ(err.losses, 20);
  // A pair with a missing value is dropped.
  std::vector<double> gap = a;
  gap[59] = NAN;
  EXPECT_EQ(compare_paired("A", gap, "ref", ref).n, 59);
}

TEST(Paired, NormalQuantile) {
  EXPECT_NEAR(normal_quantile(0.975), 1.959963984540054, 1e-12);
  EXPECT_NEAR(normal_quantile(0.8), 0.8416212335729143, 1e-12);
  EXPECT_NEAR(normal_quantile(0.5), 0.0, 1e-12);
}

// Two policies against a reference over 2 seeds x 3 items; the third item lacks the reference's
// value under seed 0, so every row uses items 0 and 1 only. Policy `a` differs by the 2 x 2 table
// worked above ([[1, -3], [2, 4]]: difference 1, p 0.375, standard error √(43/16)); `b` by 0.5 in
// every cell (no resample at or below 0: p = 2 / (R + 1)). Holm over the family of 2: b first,
// 2 · 2 / (R + 1); a second, max(that, 1 · 0.375). Item means of a's differences: 1.5 and 0.5
// (two wins), d_z = 1 / SD(1.5, 0.5) = 1 / √0.5. Detectable (a): (z_{1 − 0.05 / 4} + z_0.8) ·
// √(43/16) = (2.241403 + 0.841621) · 1.639360 = 5.054; b's differences do not vary: none.
TEST(CompareOverSeeds, TwoPoliciesOverTwoSeedsWorkedByHand) {
  const SeedItemValues ref{"ref", {{0, 1, NAN}, {1, 0, 2}}};
  const SeedItemValues a{"a", {{1, -2, 5}, {3, 4, 5}}};
  const SeedItemValues b{"b", {{0.5, 1.5, 0}, {1.5, 0.5, 0}}};
  PairedOptions o;
  o.bootstrap.resamples = 100000;
  const std::vector<PairedComparison> rows = compare_over_seeds({a, b}, ref, o);
  ASSERT_EQ(rows.size(), 2u);
  const PairedComparison &ca = rows[0], &cb = rows[1];
  EXPECT_EQ(ca.n, 2);
  EXPECT_EQ(ca.seeds, 2);
  EXPECT_DOUBLE_EQ(ca.reference_mean, 0.5);
  EXPECT_DOUBLE_EQ(ca.mean, 1.5);
  EXPECT_DOUBLE_EQ(ca.difference, 1.0);
  EXPECT_NEAR(ca.p_value, 0.375, 0.006);
  EXPECT_EQ(ca.wins, 2);
  EXPECT_EQ(ca.ties, 0);
  EXPECT_EQ(ca.losses, 0);
  EXPECT_NEAR(ca.effect_size, 1 / std::sqrt(0.5), 1e-12);
  EXPECT_NEAR(ca.detectable, 5.054, 0.03);
  EXPECT_EQ(ca.verdict, "no difference shown");
  const double smallest = 2.0 / 100001.0;
  EXPECT_DOUBLE_EQ(cb.p_value, smallest);
  EXPECT_DOUBLE_EQ(cb.p_holm, 2 * smallest);
  EXPECT_DOUBLE_EQ(ca.p_holm, ca.p_value);
  EXPECT_EQ(cb.verdict, "better");
  EXPECT_TRUE(std::isnan(cb.detectable));
  EXPECT_EQ(ca.family_size, 2);
  EXPECT_DOUBLE_EQ(ca.smallest_p, smallest);
  // Lower is better: b's shown excess is worse, a's wins are losses.
  o.higher_is_better = false;
  const std::vector<PairedComparison> lower = compare_over_seeds({a, b}, ref, o);
  EXPECT_EQ(lower[1].verdict, "worse");
  EXPECT_EQ(lower[0].losses, 2);
}

// The power statement follows Holm's first step: the same differences in a family of 1 need
// (z_{0.975} + z_0.8) · SE = 2.801585 · √(43/16) = 4.593 (a family of 2: 5.054 above).
TEST(CompareOverSeeds, DetectableIsAtHolmsFirstStep) {
  const SeedItemValues ref{"ref", {{0, 0}, {0, 0}}};
  const SeedItemValues a{"a", {{1, -3}, {2, 4}}};
  PairedOptions o;
  o.bootstrap.resamples = 100000;
  EXPECT_NEAR(compare_over_seeds({a}, ref, o)[0].detectable, 4.593, 0.03);
  // With 99 resamples the smallest p (0.02) cannot pass 0.05 / 4 in a family of 4: no figure.
  o.bootstrap.resamples = 99;
  const auto four = compare_over_seeds({a, a, a, a}, ref, o);
  EXPECT_TRUE(std::isnan(four[0].detectable));
}

TEST(CompareOverSeeds, OneSeedIsNotTestedAndShapesMustMatch) {
  const SeedItemValues ref{"ref", {{0, 1, 0}}};
  const SeedItemValues a{"a", {{1, 1, 1}}};
  const PairedComparison c = compare_over_seeds({a}, ref)[0];
  EXPECT_TRUE(std::isnan(c.p_value));
  EXPECT_EQ(c.verdict, "no difference shown");
  EXPECT_EQ(c.family_size, 0);
  EXPECT_TRUE(std::isnan(c.detectable));
  EXPECT_THROW(compare_over_seeds({{"b", {{1, 1}}}}, ref), std::invalid_argument);
  EXPECT_THROW(compare_over_seeds({{"b", {{1, 1, 1}, {1, 1, 1}}}}, ref), std::invalid_argument);
}

}  // namespace
}  // namespace kvsim::test
