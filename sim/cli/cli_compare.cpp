#include <cstdio>

#include "analysis/comparison.hpp"
#include "analysis/csv_table.hpp"
#include "policies/policy_config.hpp"
#include "sim/cli/cli.hpp"
#include "sim/replay/results.hpp"
#include "sim/run/output_guard.hpp"

namespace kvsim::cli {

namespace {

struct CompareArgs {
  std::string results, metric, reference = "full", out;
  std::vector<std::string> policies;
  bool higher = false, lower = false, any_memory = false;
  double alpha = 0.05;
  int resamples = 2000;
  long seed = 0;
};

// The table's per-sample values: the policy from `label` (sweeps) or `policy`, the sample (with
// its trace, in a sweep), rows weighted by `rows` (replay summaries) or `steps` (sweeps).
SampleTable sample_values(const CsvTable& t, const std::string& metric) {
  const std::vector<std::string> policy = t.strings(t.column("label") >= 0 ? "label" : "policy");
  std::vector<std::string> sample = t.strings("sample");
  if (t.column("trace") >= 0) {
    const std::vector<std::string> trace = t.strings("trace");
    for (std::size_t i = 0; i < sample.size(); ++i)
      if (sample[i] != "all") sample[i] = trace[i] + "/" + sample[i];
  }
  const std::vector<double> weight = t.column("rows") >= 0    ? t.numbers("rows")
                                     : t.column("steps") >= 0 ? t.numbers("steps")
                                                              : std::vector<double>{};
  // The memory each row held: replay's and the sweep's budget in entries, live's budget as given
  // (one budget on one prompt set: the same entries).
  const std::vector<std::string> budget = t.column("budget_entries") >= 0
                                              ? t.strings("budget_entries")
                                          : t.column("budget") >= 0 ? t.strings("budget")
                                                                    : std::vector<std::string>{};
  return per_sample_values(policy, sample, t.numbers(metric), weight, true, budget);
}

}  // namespace

Runner add_compare(CLI::App& app) {
  app.description(
      "Paired comparison of every policy in a result table with a reference, sample by sample: "
      "the mean difference with its 95% bootstrap interval, win/tie/loss counts, the effect size "
      "d_z, McNemar's exact test for right/wrong answers or a sign-flip test otherwise, Holm's "
      "correction over the table's comparisons, and the smallest difference the samples can "
      "detect. A difference that is not shown is reported as such, never as an order. Reads "
      "`replay --summary` or `--out`, `live evaluate --summary` and sweep results.csv files; the "
      "runs of a policy over seeds are pooled (their mean per sample).");
  app.footer(
      "Examples:\n  kvsim compare live.csv --metric answer_contains --reference full\n"
      "  kvsim compare summary.csv --metric mean_output_rel_error --reference random "
      "-o compare.csv");
  auto a = std::make_shared<CompareArgs>();
  app.add_option("results", a->results, "Result CSV")->required()->check(CLI::ExistingFile);
  app.add_option("-m,--metric", a->metric, "The column compared (e.g. answer_contains)")
      ->required();
  app.add_option("-r,--reference", a->reference, "The policy every other is compared with")
      ->capture_default_str();
  app.add_option("-p,--policy", a->policies,
                 "Compare only these (repeatable, or comma-separated; default: every other of the "
                 "reference's memory)");
  app.add_flag("--any-memory", a->any_memory,
               "Also compare rows that held another memory than the reference (each memory "
               "class its own Holm family)");
  auto* hi = app.add_flag("--higher-is-better", a->higher,
                          "Direction of the metric (default: "
                          "known for kvsim's columns)");
  app.add_flag("--lower-is-better", a->lower, "The opposite")->excludes(hi);
  app.add_option("--alpha", a->alpha, "Family-wise error rate, after Holm")
      ->capture_default_str()
      ->check(CLI::Range(1e-6, 0.5));
  app.add_option("--resamples", a->resamples, "Bootstrap resamples")
      ->capture_default_str()
      ->check(CLI::Range(100, 1000000));
  app.add_option("--seed", a->seed, "Seed of the bootstrap and sign-flip draws")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("-o,--out", a->out, "CSV with one row per comparison (docs/outputs.md)");
  return [a] {
    check_outputs({{a->out, "--out"}}, {{a->results, "results"}});
    const SampleTable table = sample_values(read_csv_table(a->results), a->metric);
    PairedOptions o;
    o.alpha = a->alpha;
    o.bootstrap.resamples = a->resamples;
    o.bootstrap.seed = static_cast<std::uint64_t>(a->seed);
    if (a->higher || a->lower) {
      o.higher_is_better = a->higher;
    } else if (const auto known = higher_is_better(a->metric)) {
      o.higher_is_better = *known;
    } else {
      throw std::invalid_argument("compare: say whether a higher " + a->metric +
                                  " is better (--higher-is-better or --lower-is-better)");
    }
    if (table.samples.empty())
      throw std::invalid_argument(a->results + ": no per-sample value of '" + a->metric +
                                  "' (overall rows are not samples)");
    const ComparisonTable t = compare_to_reference(
        table, a->metric, a->reference, split_policy_list(a->policies), o,
        {.any_memory = a->any_memory, .keeps_everything = label_keeps_everything});
    if (!a->out.empty()) write_whole(a->out, comparison_csv(t));
    std::printf("%s: %zu sample(s)\n%s", a->results.c_str(), table.samples.size(),
                comparison_text(t, o).c_str());
    return 0;
  };
}

}  // namespace kvsim::cli
