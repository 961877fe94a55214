// kvsim sweep: grid expansion, shared replay, resumability after SIGKILL, thread independence.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "analysis/csv_table.hpp"
#include "policies/policy_config.hpp"
#include "sim/replay/sweep.hpp"
#include "tests/cli_helpers.hpp"
#include "tests/tiny_trace.hpp"
#include "traces/synth.hpp"

namespace kvsim::test {
namespace {

namespace fs = std::filesystem;

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(Sweep, GridAxesAndRanges) {
  EXPECT_EQ(parse_grid_axis("h2o.budget=10%,20%").values, (std::vector<std::string>{"10%", "20%"}));
  EXPECT_EQ(parse_grid_axis("st3.tau=10:30:10").values,
            (std::vector<std::string>{"10", "20", "30"}));
  EXPECT_EQ(parse_grid_axis("hae.r=0.001:0.002:0.0005").values.size(), 3u);
  EXPECT_THROW(parse_grid_axis("h2o.budget"), std::invalid_argument);
  EXPECT_THROW(parse_grid_axis("h2o.budget=5:1:1"), std::invalid_argument);
  const auto configs = expand_grid(
      {"h2o", "full"}, {parse_grid_axis("h2o.budget=2,3"), parse_grid_axis("h2o.recent=0,1")},
      {{"h2o", {{"mode", "oneshot"}}}});
  ASSERT_EQ(configs.size(), 5u);  // 2 x 2 h2o + full
  EXPECT_EQ(configs[0].label, "h2o[budget=2,recent=0]");
  EXPECT_EQ(configs[3].label, "h2o[budget=3,recent=1]");
  EXPECT_EQ(configs[3].params.str(),
            "budget=3,budget_rounding=ceil,caches=kv_head,merge=none,mode=oneshot,normalize=none,"
            "question=compress,recent=1");
  EXPECT_EQ(configs[4].label, "full");
  // A coupled axis moves its parameters together.
  const auto pairs = expand_grid({"st3"}, {parse_grid_axis("st3.S+R=1/1.75,7/12.25")}, {});
  ASSERT_EQ(pairs.size(), 2u);
  EXPECT_EQ(pairs[1].label, "st3[S+R=7/12.25]");
  EXPECT_EQ(pairs[1].params.get_int("S"), 7);
  EXPECT_DOUBLE_EQ(pairs[1].params.get_float("R"), 12.25);
  EXPECT_THROW(parse_grid_axis("st3.S+R=1/2,3"), std::invalid_argument);
  EXPECT_THROW(expand_grid({"h2o"}, {parse_grid_axis("snapkv.window=8")}, {}),
               std::invalid_argument);
  EXPECT_THROW(expand_grid({"h2o"}, {parse_grid_axis("h2o.budget=-1")}, {}), std::invalid_argument);
  // Percentage ranges, and an axis shared by every swept policy that has the parameter.
  EXPECT_EQ(parse_grid_axis("*.budget=5%:15%:5%").values,
            (std::vector<std::string>{"5%", "10%", "15%"}));
  EXPECT_THROW(parse_grid_axis("h2o.budget=5%:15:5"), std::invalid_argument);
  const auto shared = expand_grid({"h2o", "full", "snapkv"}, {parse_grid_axis("*.budget=4,8")}, {});
  std::vector<std::string> labels;
  for (const auto& c : shared) labels.push_back(c.label);
  EXPECT_EQ(labels, (std::vector<std::string>{"h2o[budget=4]", "h2o[budget=8]", "full",
                                              "snapkv[budget=4]", "snapkv[budget=8]"}));
  EXPECT_THROW(expand_grid({"full"}, {parse_grid_axis("*.budget=4")}, {}), std::invalid_argument);
}

TEST(Sweep, ResultsHaveAColumnPerParameterAndNumericBudgets) {
  SynthConfig c;
  c.layers = 1, c.heads = 2, c.kv_heads = 2, c.head_dim = 16;
  c.system_tokens = 4, c.media_tokens = 12, c.user_tokens = 4, c.gen_tokens = 3;  // P = 20
  const std::string trace = temp_path("sweep_columns.h5"), out = temp_path("sweep_columns");
  synth_write(c, trace);
  fs::remove_all(out);
  const SweepReport r =
      run_sweep({trace}, sweep_configs({"h2o", "full"}, {"h2o.budget=10%,50%"}, {}, ""), {out, 1});
  std::ifstream in(fs::path(out) / "results.csv");
  std::string header, row;
  std::getline(in, header);
  EXPECT_EQ(header.substr(0, header.find(",layer,")),
            "trace,trace_hash,sample,label,policy,params,budget_entries,budget_fraction,budget,"
            "budget_rounding,caches,merge,mode,normalize,question,recent");
  std::getline(in, row);  // h2o[budget=10%], layer 0, KV head 0: ceil(2.0) = 2 entries of 20
  EXPECT_NE(row.find("\",2,0.1,10%,ceil,kv_head,none,cumulative,none,compress,50%,0,0,"),
            std::string::npos)
      << row;
  // The table printed at the end: one line per configuration.
  EXPECT_NE(r.table.find("h2o[budget=50%]"), std::string::npos) << r.table;
  EXPECT_NE(r.table.find("\nfull "), std::string::npos) << r.table;
}

TEST(Sweep, ASampleThatGeneratesNothingCountsButAddsToNoMean) {
  // Two traces, one whose sample generates no token: its item rows have no decode steps (empty
  // means). The table printed at the end counts both samples, as replay's does, and takes its
  // means from the other alone: the full cache recalls all the mass, and stores P + 1, P + 2 and
  // P + 3 = 21, 22, 23 entries at the three steps (P = 20). Read as zeros, the empty rows halved
  // both.
  SynthConfig c;
  c.layers = 2, c.heads = 2, c.kv_heads = 2, c.head_dim = 16;
  c.system_tokens = 4, c.media_tokens = 12, c.user_tokens = 4, c.gen_tokens = 3;
  const std::string answers = temp_path("sweep_gen3.h5"), silent = temp_path("sweep_gen0.h5");
  synth_write(c, answers);
  c.gen_tokens = 0;
  synth_write(c, silent);
  const std::string out = temp_path("sweep_gen0");
  fs::remove_all(out);
  const SweepReport r = run_sweep({answers, silent}, sweep_configs({"full"}, {}, {}, ""), {out, 1});
  const std::size_t at = r.table.find("\nfull ");
  ASSERT_NE(at, std::string::npos) << r.table;
  std::istringstream row(r.table.substr(at + 1));  // config, n, mean_cache, held/B, recall
  std::string name, held;
  int n = 0;
  double cache = 0, recall = 0;
  row >> name >> n >> cache >> held >> recall;
  EXPECT_EQ(n, 2) << r.table;
  EXPECT_DOUBLE_EQ(cache, 22.0) << r.table;
  EXPECT_DOUBLE_EQ(recall, 1.0) << r.table;
}

void expect_invalid(const std::function<void()>& f, const std::string& fragment) {
  try {
    f();
    FAIL() << "no error, expected '" << fragment << "'";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(Sweep, GridsAreBoundedAndIniErrorsTerminate) {
  // 100,000 values per axis and 100,000 configurations per sweep: a typo fails at once.
  EXPECT_EQ(parse_grid_axis("h2o.budget=1:100000:1").values.size(), 100000u);
  expect_invalid([] { parse_grid_axis("h2o.budget=1:1e9:1"); },
                 "the range '1:1e9:1' has 1e+09 values; an axis may have at most 100000");
  expect_invalid([] { parse_grid_axis("h2o.budget=0:1e300:1e-300"); }, "values; an axis");
  expect_invalid(
      [] {
        expand_grid(
            {"h2o"},
            {parse_grid_axis("h2o.budget=1:1000:1"), parse_grid_axis("h2o.recent=0:1000:1")}, {});
      },
      "the axes make 1e+06 configurations");
  // Boost's own message for this line would substitute %canonical_option% forever.
  std::istringstream ini("[h2o]\nbudget = 2\n%canonical_option%\n");
  expect_invalid([&] { read_policy_config(ini, "cfg.ini"); },
                 "cfg.ini: line '%canonical_option%': not a [section], a key = value or a comment");
}

TEST(Sweep, AKeyGivenTwiceIsOneAxisAndRangesMixWithValues) {
  EXPECT_EQ(parse_grid_axis("h2o.budget=5%:15%:5%,60%").values,
            (std::vector<std::string>{"5%", "10%", "15%", "60%"}));
  EXPECT_EQ(parse_grid_axis("h2o.budget=2,4:8:2,12").values,
            (std::vector<std::string>{"2", "4", "6", "8", "12"}));
  expect_invalid([] { parse_grid_axis("h2o.budget=5%,10%,5%"); },
                 "value '5%' of h2o.budget is given twice");
  expect_invalid([] { parse_grid_axis("h2o.budget=5%:15%:5%,10%"); }, "'10%'");
  expect_invalid([] { parse_grid_axis("h2o.budget=5%,"); }, "an empty value");
  // Two --grid on one key: their values joined, in order, each once.
  const auto merged = expand_grid(
      {"h2o"}, {parse_grid_axis("h2o.budget=5%,10%,20%"), parse_grid_axis("h2o.budget=60%")}, {});
  std::vector<std::string> labels;
  for (const auto& c : merged) labels.push_back(c.label + " " + c.params.values().at("budget"));
  EXPECT_EQ(labels, (std::vector<std::string>{"h2o[budget=5%] 5%", "h2o[budget=10%] 10%",
                                              "h2o[budget=20%] 20%", "h2o[budget=60%] 60%"}));
  expect_invalid(
      [] {
        expand_grid({"h2o"}, {parse_grid_axis("h2o.budget=5%"), parse_grid_axis("h2o.budget=5%")},
                    {});
      },
      "value '5%' of h2o.budget is given twice");
  // A wildcard axis joins a policy's own axis on the same key.
  const auto wild = expand_grid(
      {"h2o", "tova"}, {parse_grid_axis("*.budget=25%"), parse_grid_axis("tova.budget=60%")}, {});
  ASSERT_EQ(wild.size(), 3u);
  EXPECT_EQ(wild[2].label, "tova[budget=60%]");
  // A key moved by two different axes would be set by whichever came last: refused.
  expect_invalid(
      [] {
        expand_grid({"st3"}, {parse_grid_axis("st3.S=1,7"), parse_grid_axis("st3.S+R=1/1.75")}, {});
      },
      "both move 'S'");
}

// Every row's label, read back, gives the budget the row ran with and held (at equal memory):
// lists, ranges, both mixed, a key given twice, a wildcard joined with a policy's own axis,
// kvpress's compression ratio and a seeded floor.
TEST(Sweep, LabelsNameWhatEachRowHeldForEveryAxisKind) {
  SynthConfig c;
  c.layers = 1, c.heads = 2, c.kv_heads = 2, c.head_dim = 16;
  c.system_tokens = 4, c.media_tokens = 32, c.user_tokens = 4, c.gen_tokens = 3;  // P = 40
  const int prompt_len = 40;
  const std::string trace = temp_path("sweep_labels.h5");
  synth_write(c, trace);
  std::vector<PolicyConfig> configs =
      sweep_configs({"h2o", "snapkv", "tova"},
                    {"h2o.budget=10%,20%", "h2o.budget=40%", "snapkv.budget=10%:20%:5%,50%",
                     "*.budget=25%", "tova.budget=60%"},
                    {}, "", {.equal_memory = true});
  for (PolicyConfig& k :
       sweep_configs({"knorm", "random"}, {"knorm.compression_ratio=0.5,0.75", "random.budget=30%"},
                     {}, "", {.seeds = 2, .equal_memory = true}))
    configs.push_back(std::move(k));
  ASSERT_EQ(configs.size(), 4u + 5u + 2u + 2u + 2u);
  // A grid on compression_ratio is the budget of its points: --budget does not reach them.
  const auto ratios = sweep_configs({"knorm"}, {"knorm.compression_ratio=0.5"}, {}, "20%");
  ASSERT_EQ(ratios.size(), 1u);
  EXPECT_EQ(ratios[0].budget_text(), "compression_ratio:0.5");
  const std::string out = temp_path("sweep_labels");
  fs::remove_all(out);
  run_sweep({trace}, configs, {out, 2});
  const CsvTable t = read_csv_table((fs::path(out) / "results.csv").string());
  const auto label = t.strings("label"), policy = t.strings("policy");
  const auto entries = t.numbers("budget_entries"), peak = t.numbers("peak_cache_size");
  std::set<std::string> seen;
  for (std::size_t i = 0; i < label.size(); ++i) {
    seen.insert(label[i]);
    // The label's own words, resolved afresh on this prompt.
    std::map<std::string, std::string> said;
    const std::string inside = label[i].substr(label[i].find('[') + 1);
    std::stringstream parts(inside.substr(0, inside.size() - 1));
    for (std::string kv; std::getline(parts, kv, ',');)
      said[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
    said.erase("seed");
    const int expected = budget_entries(make_policy_config(policy[i], said), prompt_len);
    EXPECT_EQ(entries[i], expected) << label[i];
    EXPECT_EQ(peak[i] - 1, expected) << label[i] << ": held, besides the step's own token";
  }
  EXPECT_EQ(seen.size(), configs.size());
  EXPECT_TRUE(seen.count("h2o[budget=25%]") && seen.count("snapkv[budget=15%]") &&
              seen.count("knorm[compression_ratio=0.75]") &&
              seen.count("random[budget=30%,seed=1]"))
      << "labels";
}

std::string sweep_trace(const std::string& name, int samples = 6, int media_tokens = 120) {
  SynthConfig c;
  c.layers = 6;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 16;
  c.samples = samples;
  c.media_tokens = media_tokens;
  c.gen_tokens = 12;
  c.write.dtype = DType::kFloat32;
  const std::string path = temp_path(name);
  synth_write(c, path);
  return path;
}

std::string sweep_options(const std::string& trace, const std::string& out, int threads) {
  return "sweep --trace " + trace +
         " --policy h2o --grid h2o.budget=8,16,24,32 --policy snapkv --set snapkv.window=4"
         " --grid snapkv.budget=10:40:10 --policy tova --budget 20% -j " +
         std::to_string(threads) + " --out " + out + " > /dev/null 2>&1";
}

std::string sweep_args(const std::string& trace, const std::string& out, int threads) {
  return std::string(KVSIM_BINARY) + " " + sweep_options(trace, out, threads);
}

TEST(Sweep, EveryConfigurationIsCheckedBeforeAnyWork) {
  // A configuration that cannot run stops the sweep before anything is written, naming the
  // trace, the policy and the samples; a window clamped to a small budget is a note.
  const std::string trace = sweep_trace("sweep_check.h5"), out = temp_path("sweep_check");
  fs::remove_all(out);
  const auto bad = sweep_configs({"snapkv", "streamingllm"}, {}, {"streamingllm.sinks=50"}, "5");
  try {
    run_sweep({trace}, bad, {out, 1});
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(trace + ": 1 configuration(s) cannot run"), std::string::npos) << what;
    EXPECT_NE(what.find("streamingllm: budget (5 entries) must exceed parameter 'sinks' = 50 "
                        "(samples '000000', '000001', '000002' and 3 more)"),
              std::string::npos)
        << what;
  }
  EXPECT_FALSE(fs::exists(out));
  std::vector<std::string> notes;
  run_sweep({trace}, sweep_configs({"snapkv"}, {}, {}, "5"),
            {out, 1, {}, [&](const std::string& n) { notes.push_back(n); }});
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("snapkv: budget (5 entries) does not exceed parameter 'window' = 32: "
                          "window clamped to 5"),
            std::string::npos)
      << notes[0];
  EXPECT_NE(notes[0].find("(6 of 6 sample(s))"), std::string::npos) << notes[0];
}

// The content hash keys resumed work: equal bytes give equal hashes, and any single flipped bit
// (in a word's low or high half, in the 1 MiB buffer's second fill, in the tail) or an appended
// zero byte changes it.
TEST(Sweep, ContentHashSeesEveryByte) {
  std::string bytes(3 * (1 << 20) / 2 + 13, '\0');
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 131) >> 3);
  auto hash_of = [](const std::string& content) {
    const std::string path = temp_path("hash_me.bin");
    std::ofstream(path, std::ios::binary) << content;
    return file_content_hash(path);
  };
  const std::string reference = hash_of(bytes);
  EXPECT_EQ(reference.size(), 16u);
  EXPECT_EQ(hash_of(bytes), reference);
  for (std::size_t at : {std::size_t{0}, std::size_t{7}, std::size_t{40}, std::size_t{1 << 20},
                         bytes.size() - 20, bytes.size() - 1})
    for (int bit : {0, 7}) {
      std::string flipped = bytes;
      flipped[at] = static_cast<char>(flipped[at] ^ (1 << bit));
      EXPECT_NE(hash_of(flipped), reference) << "byte " << at << " bit " << bit;
    }
  EXPECT_NE(hash_of(bytes + '\0'), reference);
  EXPECT_NE(hash_of(""), hash_of(std::string(1, '\0')));
  EXPECT_THROW(file_content_hash(temp_path("no_such_file")), std::runtime_error);
}

TEST(Sweep, PolicyNotesReachTheConsoleAndNotesCsv) {
  // MadaKV's conserve reading runs dry at layer 1 of this trace (test_madakv.cpp works it out):
  // the sweep says so in replay's words, prefixed by the configuration, and lists it per
  // (trace, sample) in OUT/notes.csv; also when the items are read back by a resumed sweep.
  const std::string trace = TinyTrace{
      .prompt_len = 7,
      .weights = {3, 4, 1, 1, 2, 2.5, 1, 1},
      .modality = {0, 1, 1, 1, 1, 0, 0, 0},
      .layers = 2,
      .layer_power = {1, 0}}.write("sweep_notes.h5");
  const std::string replayed =
      kvsim("replay " + trace +
            " -p madakv --set madakv.budget=4 --set madakv.proxy=1 --set madakv.theta=0.8 "
            "--set madakv.hcc_reading=conserve")
          .output;
  const std::size_t at = replayed.find("kvsim: warning: madakv: with hcc_reading = conserve");
  ASSERT_NE(at, std::string::npos) << replayed;
  const std::string warning = replayed.substr(at, replayed.find('\n', at) - at);
  const std::string note = warning.substr(std::string("kvsim: warning: ").size());
  const std::string out = temp_path("sweep_notes");
  fs::remove_all(out);
  const std::string args = "sweep --trace " + trace +
                           " --policy madakv --set madakv.proxy=1 --set madakv.theta=0.8 "
                           "--set madakv.hcc_reading=conserve --grid madakv.budget=4,40 --out " +
                           out;
  for (int run = 0; run < 2; ++run) {  // the second run finds every item done
    const CliRun r = kvsim(args);
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("kvsim: warning: madakv[budget=4]: " + note + "\n"), std::string::npos)
        << r.output;
    EXPECT_EQ(r.output.find("madakv[budget=40]: madakv"), std::string::npos) << r.output;
  }
  const std::string bare = note.substr(0, note.rfind(" (1 of 1"));
  ASSERT_EQ(bare.find(','), std::string::npos);  // so the CSV field is not quoted
  EXPECT_EQ(read_all(fs::path(out) / "notes.csv"),
            "trace,sample,label,note\n" + trace + ",s0,madakv[budget=4]," + bare + "\n");
}

TEST(Sweep, ResultsDoNotDependOnThreadsAndSurviveSigkill) {
  const std::string trace = sweep_trace("sweep.h5");
  const std::string a = temp_path("sweep_a"), b = temp_path("sweep_b"),
                    killed = temp_path("sweep_killed");
  for (const auto& d : {a, b, killed}) fs::remove_all(d);
  ASSERT_EQ(std::system(sweep_args(trace, a, 1).c_str()), 0);
  ASSERT_EQ(std::system(sweep_args(trace, b, 2).c_str()), 0);
  const std::string reference = read_all(fs::path(a) / "results.csv");
  EXPECT_EQ(reference, read_all(fs::path(b) / "results.csv"));
  // Four items side by side, one thread each, finishing in any order.
  const std::string c = temp_path("sweep_c");
  fs::remove_all(c);
  ASSERT_EQ(std::system(sweep_args(trace, c, 4).c_str()), 0);
  EXPECT_EQ(reference, read_all(fs::path(c) / "results.csv"));
  // 9 configurations x 6 samples x 6 layers x 2 KV heads rows + header.
  EXPECT_EQ(std::count(reference.begin(), reference.end(), '\n'), 9 * 6 * 6 * 2 + 1);

  // Kill a sweep with SIGKILL once some items are stored, then resume it.
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", ("exec " + sweep_args(trace, killed, 1)).c_str(), nullptr);
    _exit(127);
  }
  const fs::path items = fs::path(killed) / "items";
  for (int i = 0; i < 4000; ++i) {
    if (fs::exists(items) &&
        std::distance(fs::directory_iterator(items), fs::directory_iterator{}) >= 9)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  for (const auto& e : fs::directory_iterator(items)) {  // no half-written item under a final name
    if (e.path().extension() == ".csv") {
      EXPECT_EQ(read_all(e.path()).substr(0, 6), "layer,") << e.path();
    }
  }
  ASSERT_EQ(std::system(sweep_args(trace, killed, 2).c_str()), 0);
  EXPECT_EQ(reference, read_all(fs::path(killed) / "results.csv"));
}

TEST(Sweep, InterruptSaysWhatIsKeptAndHowToResume) {
  // Ctrl-C (SIGINT) once some items are stored: the message says how many are kept, where, and
  // how to resume, and the count is the items on disk; the resumed sweep writes the same file
  // as an uninterrupted one. 24 samples, so that the sweep is still running when it is stopped.
  const std::string trace = sweep_trace("sweep_sigint.h5", 24, 240);
  const std::string whole = temp_path("sweep_sigint_whole");
  fs::remove_all(whole);
  ASSERT_EQ(std::system(sweep_args(trace, whole, 2).c_str()), 0);
  const std::string reference = read_all(fs::path(whole) / "results.csv");
  const std::string interrupted = temp_path("sweep_sigint"), log = temp_path("sweep_sigint.log");
  fs::remove_all(interrupted);
  const pid_t child = fork();
  if (child == 0) {
    execl("/bin/sh", "sh", "-c",
          ("exec " + sweep_args(trace, interrupted, 1) + " 2> " + log).c_str(), nullptr);
    _exit(127);
  }
  const fs::path stored = fs::path(interrupted) / "items";
  auto count_items = [&] {
    long n = 0;
    if (fs::exists(stored))
      for (const auto& e : fs::directory_iterator(stored)) n += e.path().extension() == ".csv";
    return n;
  };
  for (int i = 0; i < 4000 && count_items() < 9; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  kill(child, SIGINT);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  ASSERT_EQ(WEXITSTATUS(status), 128 + SIGINT) << "the sweep ended before it was interrupted";
  const long kept_items = count_items();
  EXPECT_GE(kept_items, 9);
  EXPECT_LT(kept_items, 9 * 24);
  // The count is updated as each file is stored: a signal between a file's rename and its count
  // (instructions apart) finds the count one behind.
  const std::string said = read_all(log);
  const std::string kept = " of 216 items (trace, sample, configuration) are kept in " +
                           stored.string() +
                           ", and the finished layers of the (trace, sample)s being replayed; " +
                           "rerun the same command to resume\n";
  const bool exact = said.find("kvsim: interrupted\nkvsim: " + std::to_string(kept_items) + kept) !=
                     std::string::npos;
  const bool one_behind = said.find("kvsim: interrupted\nkvsim: " + std::to_string(kept_items - 1) +
                                    kept) != std::string::npos;
  EXPECT_TRUE(exact || one_behind) << said;
  ASSERT_EQ(std::system(sweep_args(trace, interrupted, 2).c_str()), 0);
  EXPECT_EQ(reference, read_all(fs::path(interrupted) / "results.csv"));
}

struct Stop {};

// A sweep stopped (by its progress callback) after `stop_after` replayed layers.
void stopped_sweep(const std::string& trace, const std::vector<PolicyConfig>& configs,
                   const std::string& out, long stop_after, int threads) {
  long layers = 0;
  EXPECT_THROW(run_sweep({trace}, configs, {.out_dir = out, .threads = threads},
                         [&](long, long) {
                           if (++layers == stop_after) throw Stop{};
                         }),
               Stop);
}

std::string uninterrupted_results(const std::string& trace,
                                  const std::vector<PolicyConfig>& configs,
                                  const std::string& out) {
  fs::remove_all(out);
  run_sweep({trace}, configs, {.out_dir = out, .threads = 1});
  return read_all(fs::path(out) / "results.csv");
}

// Every registered policy and preset (lookahead ones or not), at its defaults and 20% where it
// takes a budget.
std::vector<PolicyConfig> every_configuration(bool with_lookahead) {
  std::vector<std::string> names;
  for (const std::string& n : PolicyRegistry::instance().names())
    if (n.rfind("test_", 0) != 0) names.push_back(n);  // policies the tests register themselves
  for (const auto& p : policy_presets()) names.push_back(p.name);
  std::vector<PolicyConfig> configs;
  for (PolicyConfig& c : sweep_configs(names, {}, {}, "20%"))
    if (with_lookahead || !c.info->lookahead) configs.push_back(std::move(c));
  return configs;
}

// Every policy and preset is stopped part-way through an item, after the layer count given, and
// resumed: the rerun starts each configuration at its next layer (its instance first sees the
// lower layers' prefills) and writes the file an uninterrupted sweep writes, byte for byte.
TEST(Sweep, AnInterruptedItemResumesAtItsNextLayer) {
  // 6 layers per sample; one sample for two threads (items side by side would interleave).
  const std::string trace = sweep_trace("sweep_layers.h5", 2, 120),
                    single = sweep_trace("sweep_layers1.h5", 1, 120);
  const std::vector<PolicyConfig> configs = every_configuration(true);
  const long n = static_cast<long>(configs.size());
  const std::string reference =
                        uninterrupted_results(trace, configs, temp_path("sweep_layers_whole")),
                    single_reference =
                        uninterrupted_results(single, configs, temp_path("sweep_layers1_whole"));
  struct Case {
    long stop_after;  // layers replayed before the interrupt (the first item has 6)
    int threads;
    long done_before, resumed, layers_resumed;
  };
  // Stopped after an item's last layer, the item lost that layer only (it was not yet stored).
  for (const Case& c : {Case{4, 1, 0, n, 4 * n}, Case{6, 1, 0, n, 5 * n}, Case{9, 1, n, n, 3 * n},
                        Case{4, 2, 0, n, 4 * n}}) {
    SCOPED_TRACE("stopped after " + std::to_string(c.stop_after) + " layers, " +
                 std::to_string(c.threads) + " thread(s)");
    const std::string& t = c.threads == 1 ? trace : single;
    const std::string out =
        temp_path("sweep_layers_" + std::to_string(c.stop_after) + "_" + std::to_string(c.threads));
    fs::remove_all(out);
    stopped_sweep(t, configs, out, c.stop_after, c.threads);
    const SweepReport resumed = run_sweep({t}, configs, {.out_dir = out, .threads = c.threads});
    EXPECT_EQ(resumed.items_done_before, c.done_before);
    EXPECT_EQ(resumed.items_resumed, c.resumed);
    EXPECT_EQ(resumed.layers_resumed, c.layers_resumed);
    EXPECT_EQ(read_all(fs::path(out) / "results.csv"),
              c.threads == 1 ? reference : single_reference);
    for (const auto& e : fs::directory_iterator(fs::path(out) / "items"))
      EXPECT_NE(e.path().extension(), ".progress") << "left behind: " << e.path();
  }
  // A progress file that is not one this format wrote is ignored: its item is replayed whole.
  const std::string damaged = temp_path("sweep_layers_damaged");
  fs::remove_all(damaged);
  stopped_sweep(trace, configs, damaged, 3, 1);
  long progress_files = 0;
  for (const auto& e : fs::directory_iterator(fs::path(damaged) / "items"))
    if (e.path().extension() == ".progress" && ++progress_files)
      std::ofstream(e.path()) << "kvsim sweep progress of a (trace, sample)\nlayer,kv_head\n";
  ASSERT_EQ(progress_files, 1);
  const SweepReport resumed = run_sweep({trace}, configs, {.out_dir = damaged, .threads = 1});
  EXPECT_EQ(resumed.items_resumed, 0);
  EXPECT_EQ(read_all(fs::path(damaged) / "results.csv"), reference);
}

// Without a lookahead policy, the layers a resumed item catches up on are computed with the
// prompt's statistics alone (LayerAttention::PromptOnly): the same results.
TEST(Sweep, ResumingWithoutLookaheadCatchesUpOnPromptStatistics) {
  const std::string trace = sweep_trace("sweep_layers_causal.h5", 1, 120);
  const std::vector<PolicyConfig> configs = every_configuration(false);
  ASSERT_LT(configs.size(), every_configuration(true).size());
  const std::string reference =
      uninterrupted_results(trace, configs, temp_path("sweep_causal_whole"));
  const std::string out = temp_path("sweep_causal_stopped");
  fs::remove_all(out);
  stopped_sweep(trace, configs, out, 5, 1);
  const SweepReport resumed = run_sweep({trace}, configs, {.out_dir = out, .threads = 1});
  EXPECT_EQ(resumed.layers_resumed, 5 * static_cast<long>(configs.size()));
  EXPECT_EQ(read_all(fs::path(out) / "results.csv"), reference);
}

}  // namespace
}  // namespace kvsim::test

namespace kvsim::test {
namespace {

const std::string kRoot = std::string(KVSIM_TEST_DATA) + "/../..";

TEST(Sweep, EveryRecipeResolves) {
  int recipes = 0;
  for (const auto& e : fs::directory_iterator(kRoot + "/experiments/recipes")) {
    const SweepFile f = read_sweep_file(e.path().string());
    std::vector<GridAxis> axes;
    for (const auto& g : f.grids) axes.push_back(parse_grid_axis(g));
    PolicyOverrides fixed;
    for (const auto& s : f.sets) apply_set_option(s, fixed);
    EXPECT_FALSE(expand_grid(f.policies, axes, fixed).empty()) << e.path();
    ++recipes;
  }
  EXPECT_GE(recipes, 7);
}

// A trace of 6 prompt positions (4 of them image) and 2 decode steps for the report's sweeps.
std::string report_trace(const std::string& name, std::vector<double> weights,
                         std::vector<double> values) {
  return TinyTrace{.prompt_len = 6,
                   .weights = std::move(weights),
                   .values = std::move(values),
                   .modality = {0, 1, 1, 1, 1, 0, 0, 0}}
      .write(name);
}

TEST(Sweep, ReportWritesTableAndFigures) {
  const std::string trace =
      report_trace("sweep_report.h5", {1, 4, 3, 1, 2, 1, 1, 1}, {1, 2, 3, 4, 5, 6, 7, 8});
  const std::string other =
      report_trace("sweep_report_other.h5", {4, 1, 1, 3, 1, 2, 1, 1}, {8, 7, 6, 5, 4, 3, 2, 1});
  const std::string out = temp_path("sweep_report_out");
  fs::remove_all(out);
  ASSERT_EQ(
      std::system((std::string(KVSIM_BINARY) + " sweep --trace " + trace + " --trace " + other +
                   " --policy h2o --grid h2o.budget=2,3,4 --policy tova --grid "
                   "tova.budget=2,4 --out " +
                   out + " > /dev/null 2>&1")
                      .c_str()),
      0);
  // The kvsim package of the build beside the binary (its C++ module gives the intervals), else
  // the source tree's (a build without the module, e.g. the sanitizer build: no intervals).
  const std::string python_dir =
      fs::path(KVSIM_BINARY).parent_path().string() + "/python:" + kRoot + "/python";
  ASSERT_EQ(
      std::system(("PYTHONPATH=" + python_dir + " /usr/bin/python3 -m kvsim.report.sweep_report " +
                   out + "/results.csv --out " + out + " > /dev/null")
                      .c_str()),
      0);
  const std::string table = read_all(fs::path(out) / "table.md");
  EXPECT_NE(table.find("`h2o[budget=3]`"), std::string::npos) << table;
  EXPECT_NE(table.find("output error / value norm"), std::string::npos) << table;
  // Two traces: a table per trace and configuration as well (5 configurations x 2 traces).
  const std::string by_trace = read_all(fs::path(out) / "table_by_trace.md");
  EXPECT_NE(by_trace.find("| sweep_report_other.h5 | `tova[budget=4]` |"), std::string::npos)
      << by_trace;
  // A header of two lines, ten rows, and the note on n and the intervals after a blank line.
  EXPECT_EQ(std::count(by_trace.begin(), by_trace.end(), '\n'), 2 + 10 + 2) << by_trace;
  EXPECT_NE(by_trace.find("| `tova[budget=4]` | 1 | "), std::string::npos) << by_trace;
  for (const char* f :
       {"pareto.png", "pareto.pdf", "h2o_budget.png", "tova_budget.pdf", "held_vs_error.png"})
    EXPECT_GT(fs::file_size(fs::path(out) / f), 1000u) << f;
}

}  // namespace
}  // namespace kvsim::test

namespace kvsim::test {
namespace {

TEST(Sweep, MpirunGivesTheSameResultsFile) {
#ifndef KVSIM_TEST_MPIEXEC
  GTEST_SKIP() << "kvsim was built without MPI";
#else
  const std::string trace = sweep_trace("sweep_mpi.h5");
  const std::string one = temp_path("sweep_mpi_one"), two = temp_path("sweep_mpi_two");
  fs::remove_all(one);
  fs::remove_all(two);
  ASSERT_EQ(std::system(sweep_args(trace, one, 1).c_str()), 0);
  const std::string mpi = mpirun_command(3, sweep_options(trace, two, 1));
  ASSERT_EQ(std::system(mpi.c_str()), 0) << mpi;
  EXPECT_EQ(read_all(fs::path(one) / "results.csv"), read_all(fs::path(two) / "results.csv"));
#endif
}

}  // namespace
}  // namespace kvsim::test
