#include <glob.h>

#include <cstdio>
#include <thread>

#include "sim/cli.hpp"
#include "sim/config.hpp"
#include "sim/progress.hpp"
#include "sim/sweep.hpp"

namespace kvsim::cli {

namespace {

std::vector<std::string> expand_globs(const std::vector<std::string>& patterns) {
  std::vector<std::string> out;
  for (const auto& p : patterns) {
    glob_t g{};
    if (::glob(p.c_str(), 0, nullptr, &g) == 0) {
      for (std::size_t i = 0; i < g.gl_pathc; ++i) out.push_back(g.gl_pathv[i]);
    } else {
      out.push_back(p);  // not a pattern (or no match): the reader reports a missing file
    }
    ::globfree(&g);
  }
  return out;
}

}  // namespace

Runner add_sweep(CLI::App& app) {
  app.description(
      "Sweep traces x samples x policy configurations (--grid). All configurations of one (trace, "
      "sample) replay together and share the attention work. Each finished (trace, sample, "
      "configuration) is stored atomically in OUT/items under a key of the trace's content hash, "
      "the sample, the policy, its resolved parameters and the kvsim version: rerunning skips "
      "what is done, and an interrupted sweep loses only the item in flight. OUT/results.csv "
      "holds every finished item, one row per (configuration, layer, KV head).");
  auto traces = std::make_shared<std::vector<std::string>>();
  auto samples = std::make_shared<std::vector<std::string>>();
  auto policies = std::make_shared<std::vector<std::string>>();
  auto grids = std::make_shared<std::vector<std::string>>();
  auto sets = std::make_shared<std::vector<std::string>>();
  auto budget = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto threads =
      std::make_shared<int>(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  auto file = std::make_shared<std::string>();
  app.add_option("-f,--file", *file,
                 "Sweep file (INI: [sweep] trace/sample/policy/budget, [grid], [set])");
  app.add_option("-t,--trace", *traces, "Trace file or glob (repeatable)");
  app.add_option("-s,--sample", *samples, "Sample name (repeatable; default: every sample)");
  app.add_option("-p,--policy", *policies, "Policy or preset (repeatable)");
  app.add_option("--grid", *grids,
                 "Axis NAME.key=v1,v2,... or NAME.key=start:stop:step (repeatable; the product of "
                 "a policy's axes is swept)");
  app.add_option("--set", *sets, "Fixed override NAME.key=value (repeatable)");
  app.add_option("--budget", *budget,
                 "Budget of every swept policy that has one and no grid or --set for it");
  app.add_option("-o,--out", *out, "Results directory")->required();
  app.add_option("-j,--threads", *threads, "Worker threads (results do not depend on it)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  return [=] {
    if (!file->empty()) {
      const SweepFile f = read_sweep_file(*file);
      traces->insert(traces->begin(), f.traces.begin(), f.traces.end());
      samples->insert(samples->begin(), f.samples.begin(), f.samples.end());
      policies->insert(policies->begin(), f.policies.begin(), f.policies.end());
      grids->insert(grids->begin(), f.grids.begin(), f.grids.end());
      sets->insert(sets->begin(), f.sets.begin(), f.sets.end());
      if (budget->empty()) *budget = f.budget;
    }
    if (traces->empty() || policies->empty())
      throw std::invalid_argument(
          "sweep: give at least one --trace and one --policy (or a --file with them)");
    std::vector<GridAxis> axes;
    for (const auto& g : *grids) axes.push_back(parse_grid_axis(g));
    PolicyOverrides fixed;
    for (const auto& s : *sets) apply_set_option(s, fixed);
    if (!budget->empty())
      for (const auto& name : *policies) {
        const PolicyInfo& info = *make_policy_config(name, {}).info;
        const bool has_budget = std::any_of(info.params.begin(), info.params.end(),
                                            [](const ParamSpec& s) { return s.name == "budget"; });
        const bool swept = std::any_of(axes.begin(), axes.end(), [&](const GridAxis& a) {
          return a.policy == name && a.key == "budget";
        });
        if (has_budget && !swept && !fixed[name].count("budget")) fixed[name]["budget"] = *budget;
      }
    const auto configs = expand_grid(*policies, axes, fixed);
    const auto files = expand_globs(*traces);
    std::unique_ptr<Progress> progress;  // its total is known once done items are skipped
    const SweepReport r =
        run_sweep(files, configs, {*out, *threads, *samples}, [&](long, long total) {
          if (!progress) progress = std::make_unique<Progress>(total, "sweep");
          progress->advance();
        });
    if (progress) progress->finish();
    std::printf(
        "sweep: %zu configuration(s) x %zu trace(s); %ld item(s): %ld already done, %ld run; "
        "results in %s/results.csv\n",
        configs.size(), files.size(), r.items_total, r.items_done_before, r.items_run,
        out->c_str());
    return 0;
  };
}

}  // namespace kvsim::cli
