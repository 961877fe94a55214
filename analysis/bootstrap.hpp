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
  std::uint64_t seed = 0;  // SplitMix64 stream (sim/core/splitmix.hpp)
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

// "0.7012-0.7688" (4 decimals), or "-" without an interval: the tables' interval column.
std::string interval_text(const Interval& i);

// Mean and sample standard deviation (n − 1); SD is NaN for fewer than 2 values.
struct MeanSd {
  double mean = NAN, sd = NAN;
};
MeanSd mean_sd(const std::vector<double>& values);

}  // namespace kvsim
