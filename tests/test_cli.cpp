// The kvsim binary end to end: help texts, exit codes, output files, byte-identical results.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>

#include "core/partial_files.hpp"
#include "sim/replay/results.hpp"
#include "tests/cli_helpers.hpp"
#include "tests/tiny_trace.hpp"

namespace kvsim::test {
namespace {

// Result files print numbers with to_chars; they must keep the bytes of printf's "%.9g".
TEST(Cli, NumbersInResultFilesAreThoseOfPrintf) {
  std::vector<double> values = {0.0,
                                -0.0,
                                1.0,
                                0.1,
                                1e-300,
                                5e-324,
                                1e300,
                                123456789,
                                1234567891,
                                9.9999999995e-5,
                                0.5,
                                2.5e-10,
                                -3.75,
                                1.0 / 3.0,
                                99999999.95,
                                std::numeric_limits<double>::infinity(),
                                -std::numeric_limits<double>::infinity()};
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200000; ++i) {
    const std::uint64_t bits = rng();
    double x;
    std::memcpy(&x, &bits, sizeof x);
    if (!std::isnan(x)) values.push_back(x);
    values.push_back(static_cast<float>(std::ldexp(static_cast<double>(rng() % 1000000), -20)));
  }
  for (double x : values) {
    char want[64];
    std::snprintf(want, sizeof want, "%.9g", x);
    std::string got;
    append_float(got, x);
    ASSERT_EQ(got, want) << "bits of " << x;
  }
  std::string nan_field;
  append_float(nan_field, NAN);
  EXPECT_EQ(nan_field, "");
}

TEST(Cli, HelpEverywhere) {
  const CliRun top = kvsim("--help");
  EXPECT_EQ(top.code, 0);
  for (const char* sub :
       {"synth", "inspect", "replay", "policies", "stats", "figures", "sweep", "live"}) {
    EXPECT_NE(top.output.find(sub), std::string::npos) << sub;
    const CliRun r = kvsim(std::string(sub) + " --help");
    EXPECT_EQ(r.code, 0) << sub;
    EXPECT_GT(r.output.size(), 300u) << sub;
    EXPECT_NE(r.output.find("Example"), std::string::npos) << sub << " --help has no example";
  }
  for (const char* sub : {"make-model", "make-prompt", "capture", "evaluate"})
    EXPECT_NE(kvsim(std::string("live ") + sub + " --help").output.find("Example:\n  kvsim live"),
              std::string::npos)
        << sub;
  EXPECT_NE(kvsim("").code, 0);  // a subcommand is required
}

TEST(Cli, ListingIsOneLineEachAndUnknownNamesSuggest) {
  // `kvsim --help` lists a line per subcommand; the paragraph is in the subcommand's own help.
  const CliRun top = kvsim("--help");
  EXPECT_NE(
      top.output.find("Replay a trace through eviction policies and measure what they lose\n"),
      std::string::npos)
      << top.output;
  EXPECT_EQ(top.output.find("Teacher-forced"), std::string::npos) << top.output;
  EXPECT_NE(kvsim("replay --help").output.find("Teacher-forced"), std::string::npos);
  const std::string trace =
      TinyTrace{.prompt_len = 4, .weights = {1, 1, 1, 1, 1, 1}}.write("suggest.h5");
  CliRun r = kvsim("replay " + trace + " -p h2o --samplez s0");
  EXPECT_EQ(r.code, 2);  // every refused command line: one usage exit code, kvsim's own words
  EXPECT_NE(r.output.find("kvsim: error: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("kvsim: unknown option '--samplez': did you mean '--sample'?"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("kvsim: 'kvsim replay --help' lists the options, with examples"),
            std::string::npos)
      << r.output;
  for (const std::string& line : std::vector<std::string>{
           "replay", "replay " + trace + " -p h2o -j x", "nosuchcommand", "live capture -o x.h5"}) {
    r = kvsim(line);
    EXPECT_EQ(r.code, 2) << line << "\n" << r.output;
    EXPECT_EQ(r.output.rfind("kvsim: error: ", 0), 0u) << line << "\n" << r.output;
  }
  EXPECT_EQ(kvsim("replay --help").code, 0);
  r = kvsim("replay " + trace + " -p h2oo");
  EXPECT_NE(r.output.find("unknown policy 'h2oo' (did you mean 'h2o'?)"), std::string::npos)
      << r.output;
  r = kvsim("replay " + trace + " -p h2o --set h2o.recnt=3");
  EXPECT_NE(r.output.find("h2o: unknown parameter 'recnt' (did you mean 'recent'?)"),
            std::string::npos)
      << r.output;
  r = kvsim("policies snapkv:kvpres");
  EXPECT_NE(r.output.find("no policy or preset 'snapkv:kvpres' (did you mean 'snapkv:kvpress'?)"),
            std::string::npos)
      << r.output;
}

TEST(Cli, PoliciesBrief) {
  // A line per policy, then a line per preset; the parameters are left to the full listing.
  const CliRun r = kvsim("policies --brief h2o");
  ASSERT_EQ(r.code, 0) << r.output;
  std::istringstream lines(r.output);
  std::vector<std::string> got;
  for (std::string line; std::getline(lines, line);) got.push_back(line);
  ASSERT_EQ(got.size(), 6u) << r.output;
  EXPECT_EQ(got[0].rfind("h2o  Heavy hitters", 0), 0u) << got[0];
  EXPECT_EQ(got[2], "Presets:");
  for (int i = 3; i < 6; ++i) EXPECT_EQ(got[i].rfind("h2o:", 0), 0u) << got[i];
  EXPECT_EQ(r.output.find("budget_rounding"), std::string::npos);
  EXPECT_NE(kvsim("policies --brief --json").code, 0);  // one form at a time
  // The full listing starts every parameter's meaning in one column, whatever its type's length.
  const CliRun full = kvsim("policies h2o");
  std::size_t column = std::string::npos;
  std::istringstream rows(full.output);
  for (std::string line; std::getline(rows, line);) {
    if (line.rfind("    ", 0) != 0) continue;
    const std::size_t at = line.find("  ", line.find("default ") + 8 + 1);
    const std::size_t meaning = line.find_first_not_of(' ', at);
    if (column == std::string::npos) column = meaning;
    EXPECT_EQ(meaning, column) << line;
  }
  EXPECT_NE(column, std::string::npos) << full.output;
}

TEST(Cli, SweepToAnUnwritablePlaceNamesTheOption) {
  const std::string trace =
      TinyTrace{.prompt_len = 4, .weights = {1, 1, 1, 1, 1, 1}}.write("sweep_unwritable.h5");
  const std::string blocker = temp_path("sweep_blocker");
  std::ofstream(blocker) << "a file, not a directory\n";
  const CliRun r = kvsim("sweep --trace " + trace + " --policy h2o --out " + blocker + "/sub");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("kvsim: error: --out " + blocker + "/sub: cannot write there: "),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("filesystem error"), std::string::npos) << r.output;
}

TEST(Cli, PoliciesByNameAndAsJson) {
  // A policy name brings its presets; a preset name only itself; unknown names list the known.
  CliRun r = kvsim("policies snapkv hae:table1");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* shown : {"\nsnapkv\n", "\nsnapkv:kvpress\n", "\nhae:table1\n"})
    EXPECT_NE(("\n" + r.output).find(shown), std::string::npos) << shown;
  for (const char* hidden : {"\nh2o\n", "\nhae:table2\n", "\nhae\n"})
    EXPECT_EQ(("\n" + r.output).find(hidden), std::string::npos) << hidden;
  r = kvsim("policies nosuch");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("no policy or preset 'nosuch' (known: adakv,"), std::string::npos)
      << r.output;
  r = kvsim("policies knorm --json");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("\"name\": \"knorm\""), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"name\": \"knorm:kvpress\""), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"choices\": ["), std::string::npos) << r.output;
}

TEST(Cli, PoliciesListsParametersAndProvenance) {
  const CliRun r = kvsim("policies");
  EXPECT_EQ(r.code, 0);
  for (const char* s :
       {"full",
        "streamingllm",
        "h2o",
        "snapkv",
        "oracle",
        "lookahead",
        "hae",
        "madakv",
        "avl",
        "st3",
        "meda",
        "fastv",
        "vtw",
        "pyramidkv",
        "adakv",
        "tova",
        "lookm",
        "snapkv:kvpress",
        "resolved: "
        "budget=20%,budget_rounding=kvpress,caches=kv_head,decode=grow,group_reduce=mean,kernel=5,"
        "merge=none,pooling=avg",
        "Zhang et al. 2023",
        "window",
        "kernel",
        "pooling",
        "recent",
        "sinks"})
    EXPECT_NE(r.output.find(s), std::string::npos) << s;
}

TEST(Cli, SynthInspectReplay) {
  const std::string trace = temp_path("cli.h5");
  CliRun r =
      kvsim("synth --out " + trace +
            " --layers 2 --heads 4 --kv-heads 2 --head-dim 16 --media-tokens 30 --gen-tokens 6");
  ASSERT_EQ(r.code, 0) << r.output;
  r = kvsim("inspect " + trace);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("image=30"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("valid"), std::string::npos);

  const std::string csv1 = temp_path("r1.csv"), csv2 = temp_path("r2.csv");
  const std::string base = "replay --trace " + trace +
                           " --policy full --policy h2o --policy snapkv --policy streamingllm"
                           " --policy oracle --budget 40% --set snapkv.window=4 ";
  r = kvsim(base + "-j 1 --out " + csv1 + " --summary " + temp_path("s.csv"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("oracle"), std::string::npos);
  EXPECT_NE(r.output.find("(lookahead)"), std::string::npos);
  ASSERT_EQ(kvsim(base + "-j 2 --out " + csv2).code, 0);
  const std::string a = slurp(csv1);
  EXPECT_EQ(a, slurp(csv2));  // byte-identical whatever the thread count
  EXPECT_EQ(a.substr(0, a.find('\n')),
            "policy,sample,layer,kv_head,step,position,cache_size,attended_size,mass_recall,"
            "output_rel_error,output_value_error,kv_bytes,hit_rate_top10,hit_rate_mass90,misses_"
            "top10,evicted_mass,"
            "cumulative_evicted_mass,regret");
  // 5 policies x 2 layers x 2 KV heads x 6 steps + header.
  EXPECT_EQ(std::count(a.begin(), a.end(), '\n'), 5 * 2 * 2 * 6 + 1);
  const std::string sidecar = slurp(temp_path("r1.policies.csv"));
  EXPECT_NE(sidecar.find("snapkv,snapkv,false,\"budget=40%,budget_rounding=ceil,caches=kv_head,"
                         "decode=grow,group_reduce=mean,kernel=7,merge=none,pooling=max,question="
                         "compress,window=4\""),
            std::string::npos)
      << sidecar;
  EXPECT_NE(slurp(temp_path("s.csv")).find("h2o,all,all,"), std::string::npos);
  // An optional metric by name: --metrics diagnostics is --diagnostics; an unknown one is
  // refused before any work, naming the metrics there are.
  const std::string d1 = temp_path("d1.csv"), d2 = temp_path("d2.csv");
  ASSERT_EQ(kvsim(base + "--diagnostics --out " + d1).code, 0);
  ASSERT_EQ(kvsim(base + "--metrics diagnostics --out " + d2).code, 0);
  EXPECT_EQ(slurp(d1), slurp(d2));
  EXPECT_NE(slurp(d1), a);
  r = kvsim(base + "--metrics hit_rate --out " + temp_path("d3.csv"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("unknown metric 'hit_rate' (metrics that run when asked for: "
                          "diagnostics)"),
            std::string::npos)
      << r.output;
}

TEST(Cli, StatsWritesItsResultsFile) {
  const std::string trace = temp_path("cli_stats.h5");
  ASSERT_EQ(
      kvsim("synth --out " + trace +
            " --layers 2 --heads 4 --kv-heads 2 --head-dim 16 --media-tokens 30 --gen-tokens 4")
          .code,
      0);
  const std::string out = temp_path("cli_stats_out.h5");
  const CliRun r = kvsim("stats " + trace + " --out " + out + " --ppci 0.5 -j 2");
  ASSERT_EQ(r.code, 0) << r.output;
  TraceReader check(trace);  // the input is untouched; the output is an HDF5 file
  H5Handle f(H5Fopen(out.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  ASSERT_TRUE(f.valid());
  for (const char* d :
       {"sparsity_causal", "sparsity_masked", "concentration", "cumulative_variance",
        "modality_share", "entropy", "cross_modal_entropy", "layer_cosine", "ppci_layers",
        "ppci_steps", "segment_share", "dap_agreement", "entropy_mean_of_heads",
        "cross_modal_entropy_mean_of_heads", "key_nearest_cosine", "key_value_correlation"})
    EXPECT_TRUE(h5_path_exists(f.get(), std::string("samples/000000/") + d)) << d;
  EXPECT_NE(kvsim("stats " + trace + " --out " + out + " --ppci 0.5,x").code, 0);
  EXPECT_NE(kvsim("stats " + trace + " --out " + out + " --key-quantiles 0.5,2").code, 0);
}

TEST(Cli, FiguresRenderFromResultFiles) {
  // A small trace's stats and two replays at different budgets give every figure.
  const std::string trace = temp_path("cli_fig.h5"), dir = temp_path("fig_results");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  ASSERT_EQ(kvsim("synth --out " + trace + " --layers 3 --heads 4 --kv-heads 2 --head-dim 16 " +
                  "--media-tokens 30 --gen-tokens 6")
                .code,
            0);
  ASSERT_EQ(kvsim("stats " + trace + " --out " + dir + "/stats.h5").code, 0);
  for (const char* b : {"20%", "40%"})
    ASSERT_EQ(
        kvsim("replay --trace " + trace + " --policy h2o --policy oracle --diagnostics --budget " +
              b + " --out " + dir + "/replay" + std::string(b, 2) + ".csv")
            .code,
        0);
  const std::string sweep = temp_path("fig_sweep");
  std::filesystem::remove_all(sweep);
  const CliRun swept =
      kvsim("sweep --trace " + trace + " --policy h2o --grid h2o.budget=20%,40% --out " + sweep +
            "/");  // a trailing slash: the path printed has no "//"
  ASSERT_EQ(swept.code, 0) << swept.output;
  EXPECT_NE(swept.output.find("results in " + sweep + "/results.csv\n"), std::string::npos)
      << swept.output;
  const std::string out = temp_path("fig_out");
  std::filesystem::remove_all(out);
  const CliRun r = kvsim("figures " + dir + " " + sweep + "/results.csv --out " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* stem :
       {"stats_000000_sparsity", "stats_000000_cumulative_variance", "stats_000000_ppci",
        "stats_000000_layer_similarity", "stats_000000_entropy", "stats_000000_head_preference",
        "stats_000000_key_similarity", "stats_000000_vision_share", "replay20_recall_by_layer",
        "budget_vs_error"}) {
    const std::string png = slurp(out + "/" + stem + ".png"),
                      pdf = slurp(out + "/" + stem + ".pdf");
    EXPECT_GT(png.size(), 1000u) << stem;
    EXPECT_EQ(png.substr(0, 4), "\x89PNG") << stem;
    EXPECT_EQ(pdf.substr(0, 4), "%PDF") << stem;
  }
  EXPECT_GT(slurp(out + "/fig_sweep/pareto.png").size(), 1000u);  // the sweep's report
  EXPECT_NE(slurp(out + "/fig_sweep/table.md").find("h2o[budget=40%]"), std::string::npos);
  // A missing input is an error naming it, not a traceback.
  CliRun missing = kvsim("figures " + temp_path("nosuch.csv") + " --out " + out);
  EXPECT_NE(missing.code, 0);
  EXPECT_NE(missing.output.find("no such file or directory: " + temp_path("nosuch.csv")),
            std::string::npos)
      << missing.output;
  EXPECT_EQ(missing.output.find("Traceback"), std::string::npos) << missing.output;
  // Two configurations that differ in more than their budget, one budget each: no curve joins
  // them (a budget figure needs one configuration at two budgets or more).
  const std::string single = temp_path("fig_single"), single_out = temp_path("fig_single_out");
  std::filesystem::remove_all(single);
  std::filesystem::remove_all(single_out);
  std::filesystem::create_directories(single);
  ASSERT_EQ(kvsim("replay " + trace + " -p h2o -p h2o@r --set h2o@r.recent=1 --set " +
                  "h2o@r.budget=40% --budget 20% --out " + single + "/r.csv")
                .code,
            0);
  ASSERT_EQ(kvsim("figures " + single + " --out " + single_out).code, 0);
  EXPECT_FALSE(std::filesystem::exists(single_out + "/budget_vs_error.png"));
}

TEST(Cli, BadInputExitsNonZeroWithAMessage) {
  const std::string text = temp_path("garbage.h5");
  std::ofstream(text) << "garbage";
  CliRun r = kvsim("inspect " + text);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("not an HDF5 file"), std::string::npos) << r.output;

  TinyTrace t{.prompt_len = 4, .weights = {1, 2, 3, 4, 5}};
  const std::string trace = t.write("cli_tiny.h5");
  r = kvsim("replay --trace " + trace + " --policy h2o --set h2o.bugdet=3");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("unknown parameter 'bugdet' (did you mean 'budget'?) (valid: budget, "
                          "budget_rounding, merge, recent, mode, normalize, caches, question)"),
            std::string::npos)
      << r.output;
  r = kvsim("replay --trace " + trace + " --policy h2o --set snapkv.window=3");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("not replayed"), std::string::npos) << r.output;
  r = kvsim("replay --trace " + trace + " --policy nope");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("unknown policy 'nope'"), std::string::npos) << r.output;
  r = kvsim("replay --trace " + trace + " --policy h2o --sample missing");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("sample 'missing'"), std::string::npos) << r.output;
}

TEST(Cli, ConfigFile) {
  TinyTrace t{.prompt_len = 4, .weights = {4, 1, 2, 1, 1, 1}};
  const std::string trace = t.write("cli_cfg.h5");
  const std::string ini = temp_path("cfg.ini");
  std::ofstream(ini) << "[h2o]\nbudget = 2\n";
  const std::string dump = temp_path("cfg_decisions.h5");
  const CliRun r = kvsim("replay --trace " + trace + " --policy h2o --config " + ini +
                         " --dump-decisions " + dump);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("h2o            2  "), std::string::npos) << r.output;
}

// P = 10 (4 images), two generated tokens, uniform attention.
std::string ten_token_trace(const std::string& name, int layers) {
  return TinyTrace{.prompt_len = 10,
                   .weights = std::vector<double>(12, 1.0),
                   .modality = {0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0},
                   .layers = layers}
      .write(name);
}

TEST(Cli, BudgetsShowWhatTheyResolvedToAndWhoIgnoredThem) {
  // P = 10: 25% keeps ceil(2.5) = 3 entries; kvpress's compression ratio 0.75 keeps
  // int(10 * 0.25) = 2; fastv has no budget and is named in a warning.
  const std::string trace = ten_token_trace("cli_budgets.h5", 3);
  const std::string summary = temp_path("budgets_summary.csv");
  CliRun r = kvsim("replay --trace " + trace + " -p full -p h2o -p fastv --budget 25% --summary " +
                   summary);
  ASSERT_EQ(r.code, 0) << r.output;
  // `full` evicts nothing: the warning does not name it.
  EXPECT_NE(r.output.find("warning: the budget 25% does not apply to fastv:"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("h2o            25% = 3               1 "), std::string::npos)
      << r.output;
  const std::string csv = slurp(summary);
  EXPECT_NE(csv.find(",mean_kv_bytes,budget_entries,samples,"), std::string::npos) << csv;
  auto budget_of = [&](const std::string& start) {  // field 12; "?" when there is no such row
    const auto at = csv.find(start);
    if (at == std::string::npos) return std::string("?");
    std::string line = csv.substr(at, csv.find('\n', at) - at);
    for (int i = 0; i < 11; ++i) line = line.substr(line.find(',') + 1);
    return line.substr(0, line.find(','));
  };
  EXPECT_EQ(budget_of("h2o,all,all,"), "3") << csv;
  EXPECT_EQ(budget_of("h2o,s0,2,"), "3") << csv;
  EXPECT_EQ(budget_of("fastv,all,all,"), "") << csv;  // no budget

  // A preset that fixes its budget keeps it, and the warning says so.
  r = kvsim("replay --trace " + trace + " -p hae:table3 -p h2o --budget 25%");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("does not apply to hae:table3: their presets fix the budget"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("hae:table3     956 "), std::string::npos) << r.output;
  // Table 3's 956 entries exceed this 10-token prompt: the prefill cuts nothing, and it says so.
  EXPECT_NE(r.output.find("hae: budget = 956 entries is not below the 10-token prompt: only DAP "
                          "cuts the prefill, and the decoding eviction starts once a cache holds "
                          "budget + rc_size = 1012 entries, at the earliest 1002 generated"),
            std::string::npos)
      << r.output;

  // --budget replaces HAE's own reading (budget = auto, the cache DAP leaves), and says so;
  // --set hae.budget=auto keeps it, silently.
  r = kvsim("replay --trace " + trace + " -p hae -p h2o --budget 25%");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("warning: --budget 25% replaces the default budget = auto of hae "),
            std::string::npos)
      << r.output;
  r = kvsim("replay --trace " + trace + " -p hae -p h2o --budget 25% --set hae.budget=auto");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find("replaces the default budget"), std::string::npos) << r.output;

  r = kvsim("replay --trace " + trace + " -p h2o --compression-ratio 0.75");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("h2o            compression_ratio:0.75 = 2 "), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("warning"), std::string::npos) << r.output;
  r = kvsim("replay --trace " + trace + " -p h2o --compression-ratio 0.75 --budget 3");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("--budget or --compression-ratio, not both"), std::string::npos)
      << r.output;
}

TEST(Cli, SmallBudgetsClampTheWindowAndEveryOffenderIsListedBeforeAnyOutput) {
  const std::string trace = ten_token_trace("cli_small_budget.h5", 2);
  // A budget of 3 under SnapKV's window of 32: a warning, recorded in the policies file, and the
  // run goes on (kvpress keeps the newest entries then).
  const std::string out = temp_path("small_budget.csv");
  CliRun r = kvsim("replay --trace " + trace + " -p snapkv -p h2o --budget 3 -o " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string note =
      "snapkv: budget (3 entries) does not exceed parameter 'window' = 32: window clamped to 3";
  EXPECT_NE(r.output.find("warning: " + note), std::string::npos) << r.output;
  EXPECT_NE(slurp(temp_path("small_budget.policies.csv")).find(note), std::string::npos);
  // Two configurations that cannot run: both named, with their samples, and no output written.
  const std::string bad = temp_path("bad_budget.csv");
  r = kvsim("replay --trace " + trace +
            " -p streamingllm -p pyramidkv -p h2o --budget 3 --set streamingllm.sinks=5"
            " --set pyramidkv.kernel=4 -o " +
            bad);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("2 configuration(s) cannot run"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("streamingllm: budget (3 entries) must exceed parameter 'sinks' = 5 "
                          "(sample 's0')"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("pyramidkv: parameter 'kernel' = 4 must be odd"), std::string::npos)
      << r.output;
  for (const std::string& f : {bad, bad + ".partial", temp_path("bad_budget.policies.csv")})
    EXPECT_FALSE(std::filesystem::exists(f)) << f;
}

TEST(Cli, TracePositionalCommaPoliciesAllCoresAndSampleNames) {
  const std::string trace = ten_token_trace("cli_conveniences.h5", 1);
  // The trace as a positional argument, two policies in one -p, -j 0 for every core: the same
  // table as the long form.
  CliRun a = kvsim("replay " + trace + " -p h2o,streamingllm -j 0 --budget 5");
  CliRun b = kvsim("replay --trace " + trace + " -p h2o -p streamingllm -j 1 --budget 5");
  ASSERT_EQ(a.code, 0) << a.output;
  ASSERT_EQ(b.code, 0) << b.output;
  EXPECT_EQ(a.output, b.output);
  // A wrong sample name is answered with the valid ones.
  CliRun r = kvsim("replay " + trace + " -p h2o -s s9");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("sample 's9': no such sample; the file has 's0'"), std::string::npos)
      << r.output;
  EXPECT_NE(kvsim("replay " + trace + " -p h2o -j -1").code, 0);
}

TEST(Cli, OneNamingScheme) {
  // --gen counts generated tokens everywhere, --config names an INI file everywhere, and element
  // types are spelled float16 / float32 / bfloat16 everywhere (the short forms still work).
  const std::string trace = temp_path("cli_naming.h5");
  CliRun r = kvsim("synth --out " + trace +
                   " --layers 1 --heads 2 --kv-heads 2 --head-dim 16 --media-tokens 8 --gen 5");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("G = 5"), std::string::npos) << r.output;
  const std::string ini = temp_path("naming_sweep.ini"), out = temp_path("naming_sweep");
  std::ofstream(ini) << "[sweep]\ntrace = " << trace << "\npolicy = h2o\nbudget = 10\n";
  std::filesystem::remove_all(out);
  r = kvsim("sweep --config " + ini + " -o " + out);
  EXPECT_EQ(r.code, 0) << r.output;
  r = kvsim("live make-model -o " + temp_path("naming_model") + " --dtype float16");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("float16"), std::string::npos) << r.output;
}

TEST(Cli, UnwritableOutputsFailBeforeAnyWork) {
  // Every output is checked before the replay or the statistics start; the error names the
  // option, the user's path (not a hidden .partial) and the operating system's reason.
  const std::string trace = ten_token_trace("cli_unwritable.h5", 1);
  const std::string nowhere = temp_path("no_such_dir") + "/x";
  for (const std::string option : {"--summary", "--out", "--dump-decisions", "--bounds"}) {
    const CliRun r = kvsim("replay " + trace + " -p h2o " + option + " " + nowhere + ".csv");
    EXPECT_NE(r.code, 0) << option;
    EXPECT_NE(r.output.find(option + " " + nowhere + ".csv: cannot write there: No such file"),
              std::string::npos)
        << r.output;
  }
  const CliRun r = kvsim("stats " + trace + " -o " + nowhere + ".h5");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("--out " + nowhere + ".h5: cannot write there: No such file"),
            std::string::npos)
      << r.output;
}

// Every output is checked against every input before any work: each refusal exits 1, names
// both, and leaves the input byte for byte as it was.
TEST(Cli, NoCommandWritesOverItsInput) {
  const std::string trace = ten_token_trace("cli_keep.h5", 1);
  const std::string bytes = slurp(trace);
  auto refused = [&](const std::string& args, const std::string& message) {
    const CliRun r = kvsim(args);
    EXPECT_EQ(r.code, 1) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
    EXPECT_EQ(slurp(trace), bytes) << args;
  };
  const std::string input = ": is the input trace " + trace;
  for (const std::string option : {"--summary", "--out", "--dump-decisions", "--bounds"})
    refused("replay " + trace + " -p h2o --budget 50% " + option + " " + trace,
            option + " " + trace + input);
  const std::string link = temp_path("cli_keep_link.h5");
  std::filesystem::remove(link);
  std::filesystem::create_symlink(trace, link);  // the same file by another name
  refused("replay " + trace + " -p h2o --budget 50% --summary " + link,
          "--summary " + link + input);
  refused("stats " + trace + " -o " + trace, "--out " + trace + input);
  refused("compact " + trace + " " + trace, "OUT " + trace + input);
  refused("sweep -t " + trace + " -p h2o -o " + trace, trace);
  // A trace is replaced only by a trace, and then only when told to.
  const std::string other = ten_token_trace("cli_keep_other.h5", 1);
  const std::string other_bytes = slurp(other);
  refused("replay " + trace + " -p h2o --summary " + other,
          "--summary " + other + ": an existing kvtrace file is there and this output is not one");
  refused("synth --out " + other + " --layers 1 --heads 2 --kv-heads 2 --head-dim 16",
          "--out " + other +
              ": an existing kvtrace file is there; kvsim replaces it only when "
              "told to (--force");
  refused("compact " + trace + " " + other, "replaces it only when told to (--force");
  refused("live make-prompt -o " + other, "this output is not one");
  EXPECT_EQ(slurp(other), other_bytes);
  const CliRun forced = kvsim("compact " + trace + " " + other + " --force");
  EXPECT_EQ(forced.code, 0) << forced.output;
  EXPECT_EQ(TraceReader(other).info().compact(), true);
  // Live runs: neither the prompt file nor the model may be an output.
  const std::string model = temp_path("cli_keep_model"), prompts = temp_path("cli_keep_p.h5");
  ASSERT_EQ(kvsim("live make-model -o " + model +
                  " --layers 1 --hidden 32 --heads 2 "
                  "--kv-heads 2 --vocab 64")
                .code,
            0);
  ASSERT_EQ(kvsim("live make-prompt --force -o " + prompts +
                  " --samples 1 --prompt-len 12 "
                  "--image-tokens 4 --vocab 64")
                .code,
            0);
  const std::string prompt_bytes = slurp(prompts);
  for (const auto& [run, output] :
       {std::pair{"capture", "-o"}, {"evaluate -p h2o", "--summary"}, {"evaluate -p h2o", "-o"}}) {
    const CliRun r = kvsim(std::string("live ") + run + " -m " + model + " --prompts " + prompts +
                           " --gen 2 " + output + " " + prompts);
    EXPECT_EQ(r.code, 1) << r.output;
    EXPECT_NE(r.output.find(": is the input prompt file " + prompts), std::string::npos)
        << r.output;
  }
  EXPECT_EQ(slurp(prompts), prompt_bytes);
}

// A budget the prompt fits in is said to be one: the run is the full cache's prompt.
TEST(Cli, ABudgetAboveThePromptSaysItKeepsEverything) {
  const std::string trace = ten_token_trace("cli_budget_above.h5", 1);
  const CliRun r = kvsim("replay " + trace + " -p h2o,snapkv --budget 5000");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("h2o: budget 5000 is not below the prompt's length: the prompt is kept "
                          "whole"),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace kvsim::test

namespace kvsim::test {
namespace {

TEST(InterruptDeathTest, RemovesTheFilesBeingWrittenAndSaysSo) {
  // A file being written (tracked) disappears when the run is interrupted; the process says
  // "interrupted" and exits with 128 + SIGINT.
  const std::string path = temp_path("interrupted.csv.partial");
  EXPECT_EXIT(
      {
        std::FILE* f = std::fopen(path.c_str(), "wb");
        std::fputs("half a result", f);
        std::fclose(f);
        track_partial(path);
        remove_partials_on_interrupt();
        std::raise(SIGINT);
      },
      ::testing::ExitedWithCode(128 + SIGINT), "kvsim: interrupted");
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace kvsim::test
