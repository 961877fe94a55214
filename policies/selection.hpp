// Selection: which entries to keep under a budget, given scores. Written once, shared by every
// scorer. In every selection equal scores keep the newer position and evict the older (pooling
// makes ties common, so the rule is part of each policy's definition).
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace kvsim {

// The score of an entry a policy did not rank (a forced window, a generated token): eviction
// scores (Policy::eviction_scores) hold it where a policy has no opinion.
inline constexpr double kUnscored = std::numeric_limits<double>::infinity();

// Keep mask over n entries (ordered by position): every `forced` entry is kept, and of the others
// the (keep - forced) highest scores, ties to the later entry. If keep >= n everything is kept.
std::vector<std::uint8_t> keep_top_scores(std::span<const double> scores, int keep,
                                          std::span<const std::uint8_t> forced = {});

// The entry, among the first `entries` of `positions`, whose score[position] is lowest, ties to the
// older: the one keep_top_scores would drop when exactly one must go (a decode step's eviction).
int lowest_score_entry(const std::vector<std::int32_t>& positions, const double* score,
                       int entries);

// The k highest-scoring of `positions` by score[position] (ties to the newer), sorted by position.
std::vector<int> top_positions(const std::vector<int>& positions, const std::vector<double>& score,
                               int k);

// Modality-aware selectors (LOOK-M, MEDA, MadaKV, A-VL). `is_text` has one flag per entry.
// Text-prior: forced entries, then every text entry before any vision entry, each modality by
// score (ties to the newer).
std::vector<std::uint8_t> keep_text_prior(std::span<const double> scores,
                                          std::span<const std::uint8_t> is_text, int keep,
                                          std::span<const std::uint8_t> forced = {});
// The order keep_text_prior keeps entries in, as one score per entry (Policy::eviction_scores of
// the text-prior policies): forced entries kUnscored, every text entry above every vision entry,
// each modality by its score.
std::vector<double> text_prior_priority(std::span<const double> scores,
                                        std::span<const std::uint8_t> is_text,
                                        std::span<const std::uint8_t> forced);
// Per-modality quotas: the top `text_quota` text entries and the top `vision_quota` vision
// entries, each by score (ties to the newer).
std::vector<std::uint8_t> keep_with_quotas(std::span<const double> scores,
                                           std::span<const std::uint8_t> is_text, int text_quota,
                                           int vision_quota);

// Head-adaptive selection over the KV heads of a layer (kvpress's AdaKVPress reading,
// kvpress/presses/adakv_press.py): every head keeps its `forced` entries and its own best
// int(alpha · keep) others (a safeguard), and the rest of heads · keep is filled jointly by score
// across heads (ties to the newer entry, then the lower head). scores[g] and forced[g] have one
// value per entry of head g; a head never keeps more than it holds.
std::vector<std::vector<std::uint8_t>> keep_head_adaptive(
    const std::vector<std::vector<double>>& scores, int keep, double alpha,
    const std::vector<std::vector<std::uint8_t>>& forced);

// A layer's selection by its KV heads' scores: alpha < 0, each head keeps its `keep` best
// (keep_top_scores); otherwise keep_head_adaptive. A scorer policy's selection (scorer_policy.hpp,
// and the Python ScorerPolicy's).
std::vector<std::vector<std::uint8_t>> keep_by_scores(
    const std::vector<std::vector<double>>& scores, int keep, double alpha,
    const std::vector<std::vector<std::uint8_t>>& forced);

// Forced mask for "the first `sinks` entries and the last `recent` entries".
std::vector<std::uint8_t> sink_and_recent_mask(int n, int sinks, int recent);

// 1-D pooling along positions, size `kernel` (odd), stride 1, same padding. Max pooling ignores
// the padding; average pooling counts it as zeros (PyTorch's count_include_pad default).
std::vector<double> pool_max(std::span<const double> x, int kernel);
std::vector<double> pool_avg(std::span<const double> x, int kernel);

// Splits `total` entries over layers in proportion to `weights`, at most `cap` per layer: the
// share a capped layer cannot take goes to the others, again in proportion to their weights
// (water-filling), and whole entries are handed out by largest remainder (ties to the lower
// layer), so the result sums to min(total, cap · layers) exactly. A layer whose share falls
// below `floor` is held there the same way, the others sharing the rest (floor 1: no layer is
// emptied); with no layer below it the result is the same as without.
std::vector<int> allocate_layer_budgets(const std::vector<double>& weights, long total, int cap,
                                        int floor = 0);

// Holds per-layer sizes to `total`: an excess (sizes raised to a floor) is taken from the layers
// holding more than `floor`, in proportion to what each holds above it, whole entries by largest
// remainder (ties to the lower layer); no layer goes below `floor` (itself lowered to total / L
// when the total cannot give every layer that much, and never below 1).
void hold_layer_total(std::vector<int>& sizes, long total, int floor);

}  // namespace kvsim
