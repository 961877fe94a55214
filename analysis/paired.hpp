// Paired comparisons of policies on the same samples: is a difference shown, and how large could
// one be without being shown? Each policy is compared with a reference (the full cache, the random
// floor, or any policy) sample by sample; a table's comparisons form one family, corrected by
// Holm's step-down method (Holm 1979) so that the chance of any false "better" or "worse" in the
// table stays at alpha. Where the corrected test does not reject, the verdict is "no difference
// shown": never an order.
#pragma once

#include <string>
#include <vector>

#include "analysis/bootstrap.hpp"

namespace kvsim {

struct PairedOptions {
  BootstrapOptions bootstrap;  // the interval of the mean difference
  double alpha = 0.05;         // family-wise, after Holm
  double power = 0.8;          // for the detectable difference
  bool higher_is_better = true;
  // The sign-flip test enumerates all 2^n sign patterns up to this n, else draws `permutations`.
  int exact_up_to = 16;
  int permutations = 20000;
};

struct PairedComparison {
  std::string label, reference;
  long n = 0;           // samples with a value for both
  long seeds = 0;       // trained models resampled too (analysis/seed_comparison.hpp); 0: none
  bool binary = false;  // every value 0 or 1 (right/wrong answers): McNemar's exact test
  double mean = NAN, reference_mean = NAN;
  double difference = NAN;              // mean over samples of (value − reference)
  Interval interval;                    // percentile bootstrap of `difference`, resampling samples
  long wins = 0, ties = 0, losses = 0;  // samples where the policy is better, equal, worse
  double effect_size = NAN;  // Cohen's d_z: difference / SD of the differences (NaN if SD = 0)
  double p_value = NAN;      // two-sided: McNemar exact (binary) or the paired sign-flip test
  double p_holm = NAN;       // Holm-adjusted over the family (holm_adjust)
  // Smallest |difference| this n detects with `power` at the per-comparison alpha, under the
  // normal approximation: (z_{1−α/2} + z_power) · SD / √n (McNemar's too: its variance is that of
  // the −1/0/1 differences); compare_to_reference restates it at Holm's first step, α / m for a
  // family of m: (z_{1−α/(2m)} + z_power) · SD / √n. NaN when the differences do not vary.
  double detectable = NAN;
  double standard_error = NAN;  // of `difference`, where a bootstrap estimated it
  // The smallest p the test can give with these n pairs, and the size of the Holm family the
  // comparison was adjusted in (compare_to_reference): when smallest_p >= alpha / family_size no
  // difference can be shown, and `detectable` is NaN.
  double smallest_p = NAN;
  long family_size = 0;
  std::string verdict;  // "better", "worse" (than the reference) or "no difference shown"
};

// McNemar's exact test: b and c are the discordant pairs (right only with the policy, right only
// with the reference); p = min(1, 2 · P(X <= min(b, c))), X ~ Binomial(b + c, 1/2); 1 when b + c =
// 0.
double mcnemar_exact_p(long b, long c);

// Two-sided paired sign-flip (randomisation) test of the mean difference: the share of sign
// patterns whose |Σ ± d_i| reaches the observed |Σ d_i|; exact up to options.exact_up_to samples,
// else (1 + hits) / (1 + draws) over seeded random patterns.
double sign_flip_p(const std::vector<double>& differences, const PairedOptions& options);

// Standard normal quantile (inverse CDF), for the detectable difference.
double normal_quantile(double p);

// One comparison; values and reference are paired by index (NaN in either drops the pair).
PairedComparison compare_paired(const std::string& label, const std::vector<double>& values,
                                const std::string& reference_label,
                                const std::vector<double>& reference,
                                const PairedOptions& options = {});

// Holm's step-down adjustment over the comparisons with a p-value, then the verdicts.
void holm_adjust(std::vector<PairedComparison>& family, const PairedOptions& options = {});

}  // namespace kvsim
