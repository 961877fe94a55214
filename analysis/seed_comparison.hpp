// Comparisons that treat the trained models as drawn, not fixed: each policy's value per (seed,
// item) against a reference's on the same cells, where a seed is a model trained with that seed
// and every seed answers the same items. The paired differences' crossed bootstrap (seeds and
// items resampled independently: analysis/bootstrap.hpp) gives the interval and p; Holm's
// step-down over the family (analysis/paired.hpp) gives the verdicts; the power statement is made
// at Holm's strictest level, the one the first comparison must pass.
#pragma once

#include <string>
#include <vector>

#include "analysis/paired.hpp"

namespace kvsim {

struct SeedItemValues {
  std::string label;
  std::vector<std::vector<double>> cells;  // [seed][item]; NaN where missing
};

// Every policy against `reference` (the same seeds and items, in the same order), one Holm family.
// An item is used only where every seed has a value for both (n counts them). Per row: mean and
// reference_mean over the used cells; difference, interval and p_value from the crossed bootstrap
// of the differences (options.bootstrap; p NaN, and no verdict, with under two seeds or items);
// wins / ties / losses and effect_size (d_z) over the items' differences averaged over seeds;
// p_holm and verdict from holm_adjust; smallest_p = 2 / (resamples + 1), the smallest bootstrap p;
// detectable = (z_{1−α/(2m)} + z_power) · the bootstrap's standard error, m the family's size:
// the difference that has `power` to pass Holm's first step (α/m). Smaller differences have less
// power there; NaN when the differences do not vary or smallest_p cannot pass α/m. Throws
// std::invalid_argument for cells whose shape differs from the reference's.
std::vector<PairedComparison> compare_over_seeds(const std::vector<SeedItemValues>& policies,
                                                 const SeedItemValues& reference,
                                                 const PairedOptions& options = {});

}  // namespace kvsim
