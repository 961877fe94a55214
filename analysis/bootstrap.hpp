// Intervals over samples: the percentile bootstrap (Efron and Tibshirani, "An Introduction to the
// Bootstrap", 1993, ch. 13). Every mean kvsim reports over samples carries one. Samples are the
// unit resampled, never the steps, heads or layers of one sample (those are not independent), and
// the draws are seeded so that the same inputs give the same bytes.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace kvsim {

struct Interval {
  double low = NAN, high = NAN;
  bool valid() const { return !std::isnan(low) && !std::isnan(high); }
};

struct BootstrapOptions {
  int resamples = 2000;
  double level = 0.95;     // two-sided coverage
  std::uint64_t seed = 0;  // SplitMix64 stream (core/splitmix.hpp)
};

// The q-quantile of sorted values by linear interpolation between order statistics at position
// q (n − 1) (Hyndman and Fan's type 7: numpy's default).
double quantile_sorted(const std::vector<double>& sorted, double q);

// Interval of the ratio Σ num / Σ den when samples are drawn n times with replacement from the n
// given (each sample contributes its numerator and denominator: a sum and a count of rows, so the
// statistic is the pooled mean the tables print). Resample r draws indices from the stream seeded
// by `seed`, in order; the interval is the (1 − level)/2 and (1 + level)/2 quantiles of the
// resampled ratios. Invalid (NaN) with fewer than 2 samples. den must be positive.
Interval bootstrap_ratio(const std::vector<double>& num, const std::vector<double>& den,
                         const BootstrapOptions& options = {});
// The same for a plain mean of one value per sample.
Interval bootstrap_mean(const std::vector<double>& values, const BootstrapOptions& options = {});

// Inference over trained models as well as items: a crossed design, value d[s][i] of seed s (a
// model trained with that seed) on item i (every seed asked the same items), e.g. the paired
// difference of two policies. The bootstrap resamples seeds and items independently (each resample
// draws S seed indices and n item indices with replacement and averages the S x n cells they
// select: Owen, "The pigeonhole bootstrap", Ann. Appl. Stat. 2007, for crossed random effects),
// so the interval covers which models were trained as well as which items were asked; it is
// mildly conservative, as Owen shows. Resamples draw the S seed indices, then the n item indices,
// from one SplitMix64 stream seeded by options.seed.
struct CrossedBootstrap {
  int seeds = 0, items = 0;
  double mean = NAN;  // of all S x n cells
  Interval interval;  // percentile interval of the resampled means (NaN with S < 2 or n < 2)
  // Standard deviation of the resampled means (n − 1): the bootstrap's standard error of `mean`,
  // for a power statement (analysis/seed_comparison.hpp). NaN with S < 2 or n < 2.
  double standard_error = NAN;
  // Two-sided bootstrap p of "mean 0": twice the smaller of the counts of resampled means <= 0
  // and >= 0, plus one, over resamples + 1, at most 1; below 1 - level exactly when the interval
  // (up to the quantiles' interpolation) excludes 0. NaN with S < 2 or n < 2.
  double p_value = NAN;
};
// invalid_argument when the rows differ in length, a cell is not finite, or d is empty.
CrossedBootstrap crossed_bootstrap(const std::vector<std::vector<double>>& d,
                                   const BootstrapOptions& options = {});

// "0.7012-0.7688" (4 decimals), or "-" without an interval: the tables' interval column.
std::string interval_text(const Interval& i);

// Mean and sample standard deviation (n − 1); SD is NaN for fewer than 2 values.
struct MeanSd {
  double mean = NAN, sd = NAN;
};
MeanSd mean_sd(const std::vector<double>& values);

}  // namespace kvsim
