#include <cstdio>
#include <thread>

#include "core/layer_attention.hpp"
#include "policies/policy.hpp"
#include "sim/cli/cli.hpp"
#include "sim/run/compact_trace.hpp"
#include "sim/run/output_guard.hpp"
#include "sim/run/progress.hpp"
#include "traces/kvtrace.hpp"

namespace kvsim::cli {

int default_compact_window() {
  int window = 64;
  auto widen = [&](const PolicyConfig& c) {
    const AttentionNeeds n = c.needs();
    window = std::max(window, n.prefill_window);
    for (int w : n.sample_window_sums) window = std::max(window, w);
  };
  for (const std::string& name : PolicyRegistry::instance().names())
    widen(make_policy_config(name, {}));
  for (const PolicyPreset& preset : policy_presets()) widen(make_policy_config(preset.name, {}));
  return window;
}

Runner add_compact(CLI::App& app) {
  app.description(
      "Write a compact copy of a kvtrace file: of each prompt's queries it keeps only the last "
      "rows that attention windows read, and stores instead the statistics replay computes from "
      "the others (column sums, their dtype-rounded twin, text-query sums and maxima, entropies; "
      "also for the context before the question). Keys, values and decode queries are kept. "
      "Replay of the compact trace gives the full trace's results byte for byte for every policy "
      "whose needs it holds, and names the policy and the statistic for any other. Format: "
      "traces/kvtrace-v1.md, \"Compact traces\".");
  app.footer(
      "Examples:\n  kvsim compact demo.h5 demo.compact.h5\n  kvsim compact video.h5 video.c.h5 "
      "--window 256   keep windows of up to 256 rows");
  auto in = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto window = std::make_shared<int>(0);
  auto threads =
      std::make_shared<int>(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  auto force = std::make_shared<bool>(false);
  app.add_option("trace", *in, "Full kvtrace file to read")->required();
  app.add_option("out", *out, "Compact kvtrace file to write")->required();
  app.add_option("--window", *window,
                 "Keep the query rows of windows up to N prompt rows (default: the longest "
                 "window any policy or preset reads at its defaults, at least 64)")
      ->check(CLI::PositiveNumber);
  auto no_entropies = std::make_shared<bool>(false);
  app.add_flag("--no-entropies", *no_entropies,
               "Do not store the prompt entropies (MEDA's layer budgets): they cost a pass over "
               "all P² logits of every head, several replays' worth on long prompts; MEDA is then "
               "refused on the compact trace");
  add_threads_option(app, *threads, "Worker threads (the file does not depend on it)");
  app.add_flag("--force", *force, "Replace an existing kvtrace file at OUT");
  return [=] {
    const TraceReader reader(*in);
    check_outputs({{*out, "OUT", OutputKind::trace}}, {{*in, "trace"}}, *force);
    const int w = *window > 0 ? *window : default_compact_window();
    Progress progress(static_cast<long>(reader.sample_names().size()) * reader.info().num_layers,
                      "compact");
    write_compact_trace(
        reader, *out, CompactOptions{.window = w, .entropies = !*no_entropies, .threads = *threads},
        [&](long) { progress.advance(); });
    progress.finish();
    std::printf("wrote %s: %zu sample(s), query rows kept for windows up to %d rows\n",
                out->c_str(), reader.sample_names().size(), w);
    return 0;
  };
}

}  // namespace kvsim::cli
