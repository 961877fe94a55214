#include <cstdio>
#include <sstream>
#include <thread>

#include "analysis/attention_stats.hpp"
#include "sim/cli/cli.hpp"
#include "sim/replay/results.hpp"
#include "sim/run/output_guard.hpp"
#include "sim/run/progress.hpp"

namespace kvsim::cli {

namespace {

std::vector<double> parse_list(const std::string& text, const char* option) {
  std::vector<double> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != '\0' || !(v > 0))
      throw std::invalid_argument(std::string(option) + " '" + text +
                                  "': expected positive numbers separated by commas");
    out.push_back(v);
  }
  return out;
}

}  // namespace

Runner add_stats(CLI::App& app) {
  app.description(
      "Observation metrics of attention itself, no policy involved, per sample, layer and head: "
      "epsilon-sparsity (causal and masked readings, by key modality), token concentration, "
      "cumulative-attention variance, per-head modality share, entropy and cross-modal entropy, "
      "layer cosine similarity, PPCI across layers and decode steps, attention share of "
      "system/image/user/generated tokens per decode step, HAE's layer-broadcast agreement, and "
      "key geometry (each key's cosine to its nearest other key, key/value similarity "
      "correlation). "
      "Written to an HDF5 file (--out); docs/outputs.md documents every dataset.");
  app.footer("Example:\n  kvsim stats demo.h5 -o stats.h5 && kvsim figures stats.h5 -o figs/");
  auto trace = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto samples = std::make_shared<std::vector<std::string>>();
  auto o = std::make_shared<StatsOptions>();
  auto conc = std::make_shared<std::string>("0.8,0.9");
  auto ppci = std::make_shared<std::string>("0.3,0.5");
  auto dap_r = std::make_shared<std::string>("0.001,0.0012,0.0015,0.002");
  auto key_q = std::make_shared<std::string>("0.1,0.25,0.5,0.75,0.9");
  o->threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  app.add_option("trace", *trace, "kvtrace v1 file")->required();
  app.add_option("-o,--out", *out, "Results file (HDF5)")->required();
  app.add_option("-s,--sample", *samples, "Sample name (repeatable; default: every sample)");
  app.add_option("--epsilon", o->epsilon, "Sparsity threshold ε (HAE Eq. 7)")
      ->capture_default_str();
  app.add_option("--concentration", *conc, "Attention-mass shares for token concentration")
      ->capture_default_str();
  app.add_option("--ppci", *ppci, "PPCI p values (A-VL Eq. 2)")->capture_default_str();
  app.add_option("--dap-r", *dap_r, "HAE r values for layer-broadcast agreement")
      ->capture_default_str();
  app.add_option("--dap-alpha", o->dap_alpha, "HAE α for layer-broadcast agreement")
      ->capture_default_str();
  app.add_option("--key-quantiles", *key_q, "Quantiles of the nearest-key cosine to report")
      ->capture_default_str();
  add_threads_option(app, o->threads, "Worker threads (results do not depend on it)");
  return [=] {
    o->concentration = parse_list(*conc, "--concentration");
    o->ppci = parse_list(*ppci, "--ppci");
    o->dap_r = parse_list(*dap_r, "--dap-r");
    o->key_quantiles = parse_list(*key_q, "--key-quantiles");
    for (double q : o->key_quantiles)
      if (q > 1)
        throw std::invalid_argument("--key-quantiles '" + *key_q +
                                    "': quantiles must be in (0, 1]");
    TraceReader reader(*trace);
    check_outputs({{*out, "--out"}}, {{*trace, "trace"}});  // before the work, not after it
    const auto names = samples->empty() ? reader.sample_names() : *samples;
    std::vector<std::pair<std::string, SampleAttentionStats>> results;
    Progress progress(static_cast<long>(names.size()) * reader.info().num_layers, "stats");
    for (const auto& name : names) {
      const SampleInfo s = reader.read_sample(name);
      results.emplace_back(name,
                           compute_attention_stats(reader, s, *o, [&] { progress.advance(); }));
    }
    progress.finish();
    write_attention_stats(*out, reader, *o, results);
    std::printf("wrote %s: %zu sample(s), %d layers\n%s", out->c_str(), names.size(),
                reader.info().num_layers, stats_digest(results, o->epsilon).c_str());
    return 0;
  };
}

}  // namespace kvsim::cli
