#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <thread>

#include "analysis/prediction_card.hpp"
#include "policies/policy_config.hpp"
#include "sim/cli/cli.hpp"
#include "sim/replay/bounds.hpp"
#include "sim/replay/engine.hpp"
#include "sim/replay/replay_run.hpp"
#include "sim/replay/results.hpp"
#include "sim/replay/step_metric.hpp"
#include "sim/run/output_guard.hpp"
#include "sim/run/progress.hpp"

namespace kvsim::cli {

namespace {

struct ReplayArgs {
  std::string trace;
  std::vector<std::string> samples, policies, sets;
  std::string config, out, summary, decisions, budget, compression_ratio, checkpoint;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int seeds = kDefaultSeeds;
  bool equal_memory = false;
  bool diagnostics = false;
  std::vector<std::string> metrics;
  std::string bounds, card;
  double bounds_epsilon = 0.01;
  std::string prompt_tail;
};

// --card: the outcome a prediction card's map gives each replayed policy, with the range of the
// map's out-of-sample residuals.
std::string card_predictions(const PredictionCard& card,
                             const std::vector<Summary::SampleMeans>& rows) {
  const bool accuracy = card.outcome == "contains";
  std::string out = "predicted live " + std::string(accuracy ? "accuracy" : "dNLL") + " of " +
                    card.model + " (" + card.path + ": an isotonic map from " + card.metric +
                    (card.has_residuals ? "; 95% range of its family-left-out errors" : "") +
                    "); a prediction for this trace only if it is that model's\n";
  char line[256];
  std::snprintf(line, sizeof line, "%-24s %12s %10s %18s\n", "policy", "replay", "predicted",
                "95% range");
  out += line;
  for (const auto& r : rows) {
    const double x = card.metric == "replay_output_rel_error" ? r.output_rel_error : r.mass_recall;
    if (std::isnan(x)) continue;
    const double y = card.predict(x);
    char range[64] = "-";
    if (card.has_residuals) {  // measured = predicted - residual; an accuracy lies in [0, 1]
      double lo = y - card.residual_high, hi = y - card.residual_low;
      if (accuracy) lo = std::clamp(lo, 0.0, 1.0), hi = std::clamp(hi, 0.0, 1.0);
      std::snprintf(range, sizeof range, "%.3f to %.3f", lo, hi);
    }
    std::snprintf(line, sizeof line, "%-24s %12.4f %10.3f %18s\n", r.label.c_str(), x, y, range);
    out += line;
  }
  return out;
}

std::vector<PolicyConfig> resolve_policies(const ReplayArgs& a) {
  std::string budget = a.budget;
  if (!a.compression_ratio.empty()) {
    if (!budget.empty())
      throw std::invalid_argument("give --budget or --compression-ratio, not both");
    budget = kCompressionRatioPrefix + a.compression_ratio;
  }
  return resolve_policy_list(split_policy_list(a.policies), a.sets,
                             {.config = a.config,
                              .budget = budget,
                              .verb = "replayed",
                              .seeds = a.seeds,
                              .equal_memory = a.equal_memory});
}

ReplayOptions replay_options(const ReplayArgs& a) {
  ReplayOptions o{.threads = a.threads,
                  .metrics = split_policy_list(a.metrics),
                  .prompt_tail = a.prompt_tail.empty() ? 0 : parse_prompt_tail(a.prompt_tail)};
  if (a.diagnostics &&
      std::find(o.metrics.begin(), o.metrics.end(), "diagnostics") == o.metrics.end())
    o.metrics.push_back("diagnostics");
  if (!a.bounds.empty()) o.checks.push_back(bounds_check(a.bounds_epsilon));
  return o;
}

// kvsim replay: every policy validated on every sample before any output exists, the replay
// (resumable), then the console report.
int run_replay_command(const ReplayArgs& a) {
  TraceReader reader(a.trace);
  std::vector<PolicyConfig> policies = resolve_policies(a);
  const std::optional<PredictionCard> card =
      a.card.empty() ? std::nullopt : std::optional(read_prediction_card(a.card));
  std::vector<std::string> samples = a.samples.empty() ? reader.sample_names() : a.samples;
  const Replayer replayer(reader, policies, replay_options(a));
  // Every policy on every sample before any output exists: all offenders at once, and what a
  // policy adjusted (a window clamped to a small budget) as warnings kept with the results.
  const auto notes = replayer.validate(samples);
  for (const auto& [label, list] : notes)
    for (const std::string& n : list) std::fprintf(stderr, "kvsim: warning: %s\n", n.c_str());
  check_outputs({{a.out, "--out"},
                 {a.out.empty() ? "" : policies_sidecar_path(a.out), "--out's sidecar"},
                 {a.summary, "--summary"},
                 {a.decisions, "--dump-decisions"},
                 {a.bounds, "--bounds"}},
                {{a.trace, "trace"}, {a.config, "config"}, {a.card, "card"}});
  const ReplayOutputs outputs{.steps_csv = a.out,
                              .summary_csv = a.summary,
                              .decisions_h5 = a.decisions,
                              .bounds_csv = a.bounds,
                              .bounds_epsilon = a.bounds_epsilon,
                              .checkpoint = a.checkpoint};
  Progress progress(static_cast<long>(samples.size()) * reader.info().num_layers, "replay");
  const ReplayRunReport report = run_replay(a.trace, reader, policies, replay_options(a), samples,
                                            outputs, notes, [&] { progress.advance(); });
  progress.finish();
  for (const std::string& n : report.notes) std::fprintf(stderr, "kvsim: warning: %s\n", n.c_str());
  if (report.samples_resumed > 0)
    std::fprintf(stderr, "kvsim: resumed: %d of %zu sample(s) were finished in %s\n",
                 report.samples_resumed, samples.size(), report.checkpoint_dir.c_str());
  if (!a.bounds.empty())
    std::printf(
        "bounds (%s): Theorem 2.1 checked on %ld layer-head(s), claim failed with its "
        "premise met in %ld; Corollary 2.1 checked at %ld removal(s), failed in %ld\n",
        a.bounds.c_str(), report.theorem_rows, report.theorem_failures, report.flushes,
        report.corollary_failures);
  std::printf(
      "%s: %zu sample(s), %d layers x %d KV heads; recall = attention mass kept, "
      "out_rel_err = |o - o_hat| / |o|, out_v_err = |o - o_hat| / sum_j p_j |v_j|, means over "
      "layers, heads and decode steps%s\n%s",
      a.trace.c_str(), samples.size(), reader.info().num_layers, reader.info().num_kv_heads,
      prompt_tail_note(a.prompt_tail).c_str(), report.table.c_str());
  if (card) std::printf("%s", card_predictions(*card, report.sample_means).c_str());
  return 0;
}

}  // namespace

Runner add_replay(CLI::App& app) {
  app.description(
      "Teacher-forced replay of trace samples through eviction policies. Per layer and KV head: "
      "prefill, then every decode step appends its token, attends over the retained entries, "
      "lets the policy update and evict. Several --policy share one attention computation per "
      "(sample, layer). Prints a comparison table; --out writes one CSV row per (policy, sample, "
      "layer, KV head, decode step).");
  app.footer(
      "Examples:\n  kvsim replay demo.h5 -p h2o,snapkv:kvpress,hae --budget 20%\n  kvsim replay "
      "demo.h5 -p h2o --set h2o.recent=25% -o results.csv --summary summary.csv\n"
      "  # interrupted? the same command again resumes after the last finished sample");
  auto a = std::make_shared<ReplayArgs>();
  app.add_option("trace,-t,--trace", a->trace, "kvtrace v1 file (positional, or -t)")->required();
  app.add_option("-s,--sample", a->samples, "Sample name (repeatable; default: every sample)");
  app.add_option(
         "-p,--policy", a->policies,
         "Policy name (repeatable, or comma-separated: -p h2o,snapkv; see `kvsim policies`)")
      ->required();
  app.add_option("--set", a->sets,
                 "Parameter override NAME.key=value, or *.key=value for every policy with the key "
                 "(repeatable)");
  app.add_option("--config", a->config, "INI file with one [NAME] section per policy");
  add_seeds_option(app, a->seeds);
  add_equal_memory_flag(app, a->equal_memory);
  app.add_option("--budget", a->budget,
                 "Budget for every replayed policy that has one and no explicit budget "
                 "(count or percentage of the prompt)");
  app.add_option("--compression-ratio", a->compression_ratio,
                 "kvpress's convention instead of --budget: the fraction of the prompt removed; "
                 "keeps int(P * (1 - R)) entries (--set NAME.compression_ratio=R per policy)");
  add_prompt_tail_option(app, a->prompt_tail);
  app.add_option("-o,--out", a->out, "Per-step results CSV (and NAME.policies.csv beside it)");
  app.add_option("--summary", a->summary, "Per-layer and overall summary CSV");
  app.add_option("--dump-decisions", a->decisions, "HDF5 file of every eviction and merge");
  app.add_flag("--diagnostics", a->diagnostics,
               "Also compute hit rates (top 10% keys, keys holding 90% of the mass), "
               "irrecoverable misses and evicted attention mass per step (CSV columns; the same "
               "as --metrics diagnostics)");
  app.add_option("--metrics", a->metrics,
                 "Optional per-step metrics to compute, comma-separated or repeated (their "
                 "columns are empty otherwise): " +
                     optional_metric_names());
  app.add_option("--bounds", a->bounds,
                 "CSV checking HAE Theorem 2.1 per layer and KV head and Corollary 2.1 at every "
                 "decode step where a scored policy (hae, h2o) removes entries");
  app.add_option("--bounds-epsilon", a->bounds_epsilon, "Allowed loss ε of Theorem 2.1")
      ->capture_default_str();
  app.add_option("--card", a->card,
                 "Prediction card (kvsim.report.prediction_card's card.json): also print the live "
                 "outcome its map predicts for each policy")
      ->check(CLI::ExistingFile);
  app.add_option("--checkpoint", a->checkpoint,
                 "Directory keeping finished samples until the outputs are written, so that "
                 "rerunning an interrupted replay resumes (default: OUTPUT.checkpoint beside the "
                 "first output; removed when done)");
  add_threads_option(app, a->threads, "Worker threads (results do not depend on it)");
  return [a] { return run_replay_command(*a); };
}

}  // namespace kvsim::cli
