// `kvsim compare` and kvsim.compare: paired comparisons of every policy of a result table with a
// reference, sample by sample (analysis/paired.hpp), from the table's own rows.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "analysis/paired.hpp"

namespace kvsim {

// One metric per (policy, sample): the rows of a policy on a sample (its layers, heads or steps)
// averaged, weighted by `weight` (a row count: replay's summary has one per layer) where given;
// the runs of one policy over seeds (core/run_labels.hpp) pooled into one policy, each seed
// counting equally. Rows whose sample is "all" (overall rows) and empty values are left out.
struct SampleTable {
  std::vector<std::string> samples;         // sorted
  std::vector<std::string> policies;        // in order of first appearance (a seed group: its name)
  std::vector<std::vector<double>> values;  // [policy][sample]; NaN where missing
  std::vector<int> seeds;                   // [policy]: runs pooled (1 for a plain policy)
  std::vector<std::vector<double>> run_means;  // [policy][run]: each run's mean over its samples
  // [policy]: the memory it held, its budget on each of `samples` in order ("40;40;;41;", empty
  // where it has none); "" for a policy without a budget (it sizes its cache itself, or keeps
  // everything). Equal strings: equal memory on every sample.
  std::vector<std::string> memory;
  int index(const std::string& policy) const;  // -1 when absent
};
// With pool_seeds false every run label stays a policy of its own. `budget`: each row's budget
// (entries, or the budget as given; "" for none), one per row or empty.
SampleTable per_sample_values(const std::vector<std::string>& policy,
                              const std::vector<std::string>& sample,
                              const std::vector<double>& value,
                              const std::vector<double>& weight = {}, bool pool_seeds = true,
                              const std::vector<std::string>& budget = {});

// One policy's mean over the samples that have a value, their number and the 95% bootstrap
// interval of the mean; for a seed group, the SD over seeds of each run's mean. A policy index
// below 0 (absent from the table) gives n = 0 and NaN.
struct MeanSummary {
  long n = 0;
  double mean = NAN;
  Interval interval;
  double seed_sd = NAN;
};
MeanSummary summarize(const SampleTable& table, int policy, const BootstrapOptions& options = {});

// Whether a higher value of a kvsim result column is better: recall, accuracy, agreement, match
// and hit rates are; errors, divergences, NLL, perplexity, misses, evicted mass, regret and memory
// are not; std::nullopt for a name it does not know.
std::optional<bool> higher_is_better(const std::string& metric);

// Which rows a comparison may pair with its reference. Memory classes: a budget (policies with
// the same budget on every sample held equal memory under --equal-memory), "sizes itself" (no
// budget) and "keeps everything" (the full cache).
struct CompareScope {
  // Compare rows of any memory with the reference (each class still its own Holm family).
  bool any_memory = false;
  // Whether a policy label keeps everything (the full cache): the ceiling every row may be
  // compared with. Default: the label "full" or "full@...".
  std::function<bool(const std::string&)> keeps_everything;
};

struct ComparisonTable {
  std::string metric, reference;
  bool higher_is_better = true;
  // One per compared policy, in table order; Holm-adjusted within its family (the rows of one
  // memory class: `memory` below).
  std::vector<PairedComparison> rows;
  std::vector<std::string> memory;   // [row]: its class, e.g. "budget 40", "sizes itself"
  std::vector<std::string> skipped;  // "LABEL (why)": rows of another memory, not compared
};
// Each policy in `policies` (empty: all but the reference) against `reference`. A budgeted
// reference is compared with the rows of its budget only (the others listed in `skipped`; named
// ones refused), one that keeps everything with every row, one that sizes itself with none
// (refused) unless scope.any_memory; a Holm family per memory class. Throws
// std::invalid_argument naming what is missing or refused.
ComparisonTable compare_to_reference(const SampleTable& table, const std::string& metric,
                                     const std::string& reference,
                                     const std::vector<std::string>& policies,
                                     const PairedOptions& options, const CompareScope& scope = {});

// The CSV (one row per comparison; docs/outputs.md) and the console table.
std::string comparison_csv(const ComparisonTable& t);
std::string comparison_text(const ComparisonTable& t, const PairedOptions& options);

}  // namespace kvsim
