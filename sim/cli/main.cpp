// kvsim: a trace replayer and simulator for KV-cache eviction policies of multimodal LLMs.
#include <malloc.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <sstream>

#include "core/partial_files.hpp"
#include "core/suggest.hpp"
#include "sim/cli/cli.hpp"
#include "sim/run/mpi_world.hpp"

namespace {

// The exit code of every command line the parser refuses (0: done, 1: the run failed).
constexpr int kUsageError = 2;

// `kvsim --help` lists each subcommand by its one line; the paragraph a subcommand sets as its
// description stays in its own --help.
class ListingFormatter : public CLI::Formatter {
 public:
  std::map<const CLI::App*, std::string> one_line;
  std::string make_subcommand(const CLI::App* sub) const override {
    const auto it = one_line.find(sub);
    if (it == one_line.end()) return CLI::Formatter::make_subcommand(sub);
    std::stringstream out;
    CLI::detail::format_help(out, sub->get_display_name(true), it->second, get_column_width());
    return out.str();
  }
};

// For arguments the parser did not expect: the nearest long option of the subcommand that was
// being parsed (or of the commands above it) to each unknown --name.
void suggest_options(const CLI::App& app, int argc, char** argv) {
  std::vector<std::string> known;
  for (const CLI::App* at = &app; at;) {
    for (const CLI::Option* opt : at->get_options())
      for (const auto& name : opt->get_lnames()) known.push_back("--" + name);
    const CLI::App* next = nullptr;
    for (const CLI::App* sub : at->get_subcommands({}))
      if (sub->parsed()) next = sub;
    at = next;
  }
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--", 2) != 0 || !argv[i][2]) continue;
    std::string given = argv[i];
    given = given.substr(0, given.find('='));
    if (std::find(known.begin(), known.end(), given) != known.end()) continue;
    const std::string nearest = kvsim::nearest_name(given, known);
    if (!nearest.empty())
      std::fprintf(stderr, "kvsim: unknown option '%s': did you mean '%s'?\n", given.c_str(),
                   nearest.c_str());
  }
}

// A command line that does not parse: in kvsim's own words, with one exit code for every usage
// error (as argparse's 2), and where to read the options; --help and --version exit 0.
int usage_error(CLI::App& app, const CLI::ParseError& e, int argc, char** argv) {
  if (e.get_exit_code() == 0) return app.exit(e);
  std::fprintf(stderr, "kvsim: error: %s\n", e.what());
  if (dynamic_cast<const CLI::ExtrasError*>(&e)) suggest_options(app, argc, argv);
  std::string command = "kvsim";
  for (const CLI::App* at = &app; at;) {
    const CLI::App* next = nullptr;
    for (const CLI::App* sub : at->get_subcommands({}))
      if (sub->parsed()) next = sub, command += " " + sub->get_name();
    at = next;
  }
  std::fprintf(stderr, "kvsim: '%s --help' lists the options, with examples\n", command.c_str());
  return kUsageError;
}

}  // namespace

int main(int argc, char** argv) {
  // Layers are read and freed one after another in blocks of tens of MiB; keeping them in the
  // heap instead of fresh mmaps avoids re-faulting every page of every layer (~1 s of system
  // time on the demo trace).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc maximum on 64-bit
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  CLI::App app{"kvsim " KVSIM_VERSION
               " - replay attention traces (kvtrace v1) through KV-cache eviction policies"};
  app.require_subcommand(1);
  app.set_version_flag("--version", KVSIM_VERSION);
  auto listing = std::make_shared<ListingFormatter>();
  app.formatter(listing);
  std::map<CLI::App*, kvsim::cli::Runner> runners;
  auto add = [&](const char* name, const char* about, auto adder) {
    CLI::App* sub = app.add_subcommand(name, about);
    listing->one_line[sub] = about;
    runners[sub] = adder(*sub);
  };
  add("synth", "Write a synthetic multimodal kvtrace v1 file", kvsim::cli::add_synth);
  add("inspect", "Summarise and validate a kvtrace v1 file", kvsim::cli::add_inspect);
  add("compact", "Write a compact trace: prompt statistics in place of prompt queries",
      kvsim::cli::add_compact);
  add("replay", "Replay a trace through eviction policies and measure what they lose",
      kvsim::cli::add_replay);
  add("sweep", "Sweep traces x samples x policy configurations, resumable", kvsim::cli::add_sweep);
  add("compare", "Paired comparisons with a reference: intervals, tests, Holm, no order unshown",
      kvsim::cli::add_compare);
  add("stats", "Observation metrics of attention (sparsity, PPCI, entropy, ...) to a file",
      kvsim::cli::add_stats);
  add("figures", "Regenerate the papers' figures (PNG and PDF) from result files",
      kvsim::cli::add_figures);
  add("live", "Run a real decoder with policies in the loop: capture traces, evaluate end to end",
      kvsim::cli::add_live);
  add("policies", "List every policy with its parameters, defaults and provenance",
      kvsim::cli::add_policies);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return usage_error(app, e, argc, argv);
  }
  kvsim::remove_partials_on_interrupt();
  try {
    for (auto& [sub, run] : runners)
      if (sub->parsed()) return run();
  } catch (const kvsim::ReportedError&) {
    kvsim::remove_tracked_partials();
    return 1;  // printed by every rank already
  } catch (const std::exception& e) {
    kvsim::remove_tracked_partials();  // a failed run leaves no half-written file
    std::fprintf(stderr, "kvsim: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
