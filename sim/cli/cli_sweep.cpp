#include <glob.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "policies/policy_config.hpp"
#include "sim/cli/cli.hpp"
#include "sim/replay/sweep.hpp"
#include "sim/run/mpi_world.hpp"
#include "sim/run/progress.hpp"

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

struct SweepArgs {
  std::string file, budget, out;
  std::vector<std::string> traces, samples, policies, grids, sets;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int seeds = kDefaultSeeds;
  bool equal_memory = false;
};

int run_sweep_command(SweepArgs a, int rank) {
  if (!a.file.empty()) {
    const SweepFile f = read_sweep_file(a.file);
    a.traces.insert(a.traces.begin(), f.traces.begin(), f.traces.end());
    a.samples.insert(a.samples.begin(), f.samples.begin(), f.samples.end());
    a.policies.insert(a.policies.begin(), f.policies.begin(), f.policies.end());
    a.grids.insert(a.grids.begin(), f.grids.begin(), f.grids.end());
    a.sets.insert(a.sets.begin(), f.sets.begin(), f.sets.end());
    if (a.budget.empty()) a.budget = f.budget;
  }
  if (a.traces.empty() || a.policies.empty())
    throw std::invalid_argument(
        "sweep: give at least one --trace and one --policy (or a --file with them)");
  a.policies = split_policy_list(a.policies);
  const auto configs = sweep_configs(a.policies, a.grids, a.sets, a.budget,
                                     {.seeds = a.seeds, .equal_memory = a.equal_memory});
  const auto files = expand_globs(a.traces);
  std::unique_ptr<Progress> progress;  // its total is known once done items are skipped
  const SweepReport r = run_sweep(files, configs,
                                  {a.out, a.threads, a.samples,
                                   [rank](const std::string& note) {
                                     if (rank == 0)
                                       std::fprintf(stderr, "kvsim: warning: %s\n", note.c_str());
                                   }},
                                  [&](long, long total) {
                                    if (!progress)
                                      progress = std::make_unique<Progress>(total, "sweep", 30.0);
                                    progress->advance();
                                  });
  if (progress) progress->finish();
  if (rank != 0) return 0;
  for (const std::string& note : r.notes)
    std::fprintf(stderr, "kvsim: warning: %s\n", note.c_str());
  std::printf("%s", r.table.c_str());
  std::printf("sweep: %zu configuration(s) x %zu trace(s); %ld item(s): %ld already done, %ld run",
              configs.size(), files.size(), r.items_total, r.items_done_before, r.items_run);
  if (r.items_resumed > 0)
    std::printf(" (%ld resumed where an interrupted run stopped, %ld of their %ld layers kept)",
                r.items_resumed, r.layers_resumed, r.layers_of_resumed);
  std::printf("; results in %s\n",
              (std::filesystem::path(a.out) / "results.csv").string().c_str());  // no "out//"
  return 0;
}

}  // namespace

Runner add_sweep(CLI::App& app) {
  app.description(
      "Sweep traces x samples x policy configurations (--grid, or a --file). All configurations "
      "of one (trace, sample) replay together and share the attention work. Each finished "
      "(trace, sample, configuration) is stored atomically in OUT/items under a key of the "
      "trace's content hash, the sample, the policy, its resolved parameters and the kvsim "
      "version: rerunning skips what is done, and resumes an interrupted (trace, sample) at the "
      "layer after the last it finished (the layer in flight is all an interrupt loses). "
      "OUT/results.csv holds every "
      "finished item, one row per (configuration, layer, KV "
      "head). Built with MPI, `mpirun -n N kvsim sweep ...` spreads the (trace, sample) items over "
      "ranks and writes the same results file.");
  app.footer(
      "Examples:\n  kvsim sweep -t demo.h5 -p h2o -p snapkv --grid h2o.budget=5%,10%,20%,40% -o "
      "sweep/\n  kvsim sweep --file experiments/recipes/hae_fig4_r.ini -o sweep/   (rerun to "
      "resume)");
  auto a = std::make_shared<SweepArgs>();
  app.add_option("-f,--config,--file", a->file,
                 "Sweep file (INI: [sweep] trace/sample/policy/budget, [grid], [set])");
  app.add_option("-t,--trace", a->traces, "Trace file or glob (repeatable)");
  app.add_option("-s,--sample", a->samples, "Sample name (repeatable; default: every sample)");
  app.add_option("-p,--policy", a->policies, "Policy or preset (repeatable, or comma-separated)");
  app.add_option("--grid", a->grids,
                 "Axis NAME.key=v1,v2,... or NAME.key=start:stop:step (repeatable; the product of "
                 "a policy's axes is swept)");
  app.add_option("--set", a->sets,
                 "Fixed override NAME.key=value, or *.key=value for every policy with the key "
                 "(repeatable)");
  add_seeds_option(app, a->seeds);
  add_equal_memory_flag(app, a->equal_memory);
  app.add_option("--budget", a->budget,
                 "Budget of every swept policy that has one and no grid or --set for it");
  app.add_option("-o,--out", a->out, "Results directory")->required();
  add_threads_option(app, a->threads, "Worker threads (results do not depend on it)");
  return [a]() -> int {
    const World world;  // the ranks of `mpirun -n N kvsim sweep ...`, or this process alone
    if (!world.distributed()) return run_sweep_command(*a, 0);
    try {
      return run_sweep_command(*a, world.rank());
    } catch (const std::exception& e) {
      // The other ranks wait in point-to-point calls that no error reaches: end them all.
      std::fprintf(stderr, "kvsim: error (rank %d): %s\n", world.rank(), e.what());
      world.abort();
    }
  };
}

}  // namespace kvsim::cli
