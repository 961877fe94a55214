#include <algorithm>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "core/layer_attention.hpp"
#include "policies/policy.hpp"
#include "sim/cli/cli.hpp"
#include "sim/run/compact_trace.hpp"
#include "sim/run/output_guard.hpp"
#include "sim/run/progress.hpp"
#include "traces/kvtrace.hpp"

namespace kvsim::cli {

namespace {

std::vector<int> parse_widths(const std::string& text) {
  if (text == "none") return {};
  std::vector<int> widths;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    std::size_t used = 0;
    int w = 0;
    try {
      w = std::stoi(item, &used);
    } catch (const std::exception&) {
    }
    if (used != item.size() || w < 1)
      throw std::invalid_argument("--window-sums: '" + item +
                                  "' is not a width of 1 or more rows (or 'none')");
    widths.push_back(w);
  }
  std::sort(widths.begin(), widths.end());
  widths.erase(std::unique(widths.begin(), widths.end()), widths.end());
  return widths;
}

}  // namespace

int default_compact_window() {
  const AttentionNeeds n = default_policy_needs();
  int window = std::max(64, n.prefill_window);
  for (int w : n.sample_window_sums) window = std::max(window, w);
  for (int w : n.window_group_sums) window = std::max(window, w);
  return window;
}

Runner add_compact(CLI::App& app) {
  app.description(
      "Write a compact copy of a kvtrace file: of each prompt's queries it keeps only the last "
      "rows that attention windows read, and stores instead the statistics replay computes from "
      "the others (column sums, their dtype-rounded twin, text-query sums and maxima, entropies, "
      "the window sums SnapKV, MadaKV and TOVA read; also for the context before the question). "
      "Keys, values and decode queries are kept. "
      "Replay of the compact trace gives the full trace's results byte for byte for every policy "
      "whose needs it holds, and names the policy and the statistic for any other. Format: "
      "traces/kvtrace-v1.md, \"Compact traces\".");
  app.footer(
      "Examples:\n  kvsim compact demo.h5 demo.compact.h5\n  kvsim compact video.h5 video.c.h5 "
      "--window 256   keep windows of up to 256 rows\n  kvsim compact video.h5 video.c.h5 "
      "--window-sums 16,32   store SnapKV's votes of 16 and 32 rows");
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
  auto window_sums = std::make_shared<std::string>();
  app.add_option("--window-sums", *window_sums,
                 "Widths (comma-separated, or 'none') of the window group sums to store with the "
                 "last prompt row's head mean: a replay whose policies read only these (SnapKV's "
                 "votes, MadaKV's proxy, TOVA's last row) computes no window rows (default: the "
                 "widths the policies and presets read at their defaults)");
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
    const std::vector<int> widths =
        window_sums->empty() ? default_window_widths(w) : parse_widths(*window_sums);
    Progress progress(static_cast<long>(reader.sample_names().size()) * reader.info().num_layers,
                      "compact");
    write_compact_trace(
        reader, *out,
        CompactOptions{
            .window = w, .entropies = !*no_entropies, .window_widths = widths, .threads = *threads},
        [&](long) { progress.advance(); });
    progress.finish();
    std::string sums;
    for (int width : widths) sums += (sums.empty() ? "" : ", ") + std::to_string(width);
    std::printf(
        "wrote %s: %zu sample(s), query rows kept for windows up to %d rows, window sums of %s\n",
        out->c_str(), reader.sample_names().size(), w,
        sums.empty() ? "none" : (sums + " rows").c_str());
    return 0;
  };
}

}  // namespace kvsim::cli
