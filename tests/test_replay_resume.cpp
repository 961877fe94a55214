// kvsim replay keeps finished samples: an interrupted replay resumes after the last finished
// sample, and its outputs are byte for byte those of a replay that ran straight through.
#include <gtest/gtest.h>

#include <filesystem>
#include <stdexcept>

#include "sim/replay/bounds.hpp"
#include "sim/replay/replay_checkpoint.hpp"
#include "sim/replay/replay_run.hpp"
#include "sim/run/result_files.hpp"
#include "sim/run/resume_store.hpp"
#include "tests/cli_helpers.hpp"
#include "tests/replay_helpers.hpp"
#include "tests/tiny_trace.hpp"
#include "traces/synth.hpp"

namespace kvsim::test {
namespace {

namespace fs = std::filesystem;

constexpr int kSamples = 4, kLayers = 3;

std::string four_sample_trace() {
  SynthConfig c;
  c.layers = kLayers;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 16;
  c.samples = kSamples;
  c.system_tokens = 6;
  c.media_tokens = 40;
  c.user_tokens = 6;
  c.gen_tokens = 10;
  c.write.dtype = DType::kFloat32;
  const std::string path = temp_path("resume_trace.h5");
  synth_write(c, path);
  return path;
}

std::vector<PolicyConfig> policies() {
  return {make_policy_config("h2o", {{"budget", "30%"}}),
          make_policy_config("hae", {{"budget", "30%"}})};
}

ReplayOutputs outputs_in(const std::string& dir) {
  fs::create_directories(dir);
  return {.steps_csv = dir + "/steps.csv",
          .summary_csv = dir + "/summary.csv",
          .decisions_h5 = dir + "/decisions.h5",
          .bounds_csv = dir + "/bounds.csv"};
}

const ReplayOptions kOptions{.threads = 2, .checks = {bounds_check(0.01)}};

TEST(ReplayResume, AnInterruptedReplayResumesAndWritesTheSameBytes) {
  const std::string trace = four_sample_trace();
  TraceReader reader(trace);
  const auto samples = reader.sample_names();
  ASSERT_EQ(samples.size(), static_cast<std::size_t>(kSamples));

  const ReplayOutputs straight = outputs_in(temp_path("resume_straight"));
  const ReplayRunReport whole =
      run_replay(trace, reader, policies(), kOptions, samples, straight, {});
  EXPECT_EQ(whole.samples_resumed, 0);
  EXPECT_FALSE(fs::exists(straight.checkpoint_dir())) << "removed once the outputs exist";

  // Stopped in the third sample's second layer, as Ctrl-C would stop it (one thread, so that
  // samples do not run side by side and the layer count says where it stopped).
  const ReplayOutputs resumed = outputs_in(temp_path("resume_interrupted"));
  int layers = 0;
  ReplayOptions one_thread = kOptions;
  one_thread.threads = 1;
  EXPECT_THROW(run_replay(trace, reader, policies(), one_thread, samples, resumed, {},
                          [&] {
                            if (++layers == 2 * kLayers + 2) throw std::runtime_error("stop");
                          }),
               std::runtime_error);
  const std::string dir = resumed.checkpoint_dir();
  EXPECT_EQ(dir, resumed.steps_csv + ".checkpoint");
  EXPECT_TRUE(fs::exists(dir + "/sample-0.done"));
  EXPECT_TRUE(fs::exists(dir + "/sample-1.done"));
  EXPECT_FALSE(fs::exists(dir + "/sample-2.done"));
  for (const std::string* out :
       {&resumed.steps_csv, &resumed.summary_csv, &resumed.bounds_csv, &resumed.decisions_h5})
    EXPECT_FALSE(fs::exists(*out)) << "no final-named file before every sample is finished";

  layers = 0;
  const ReplayRunReport again =
      run_replay(trace, reader, policies(), kOptions, samples, resumed, {}, [&] { ++layers; });
  EXPECT_EQ(again.samples_resumed, 2);
  EXPECT_EQ(layers, 2 * kLayers) << "only the two unfinished samples are replayed";
  EXPECT_EQ(again.table, whole.table);
  EXPECT_EQ(again.theorem_rows, whole.theorem_rows);
  EXPECT_EQ(again.flushes, whole.flushes);
  EXPECT_GT(whole.flushes, 0);
  EXPECT_EQ(slurp(resumed.steps_csv), slurp(straight.steps_csv));
  EXPECT_EQ(slurp(resumed.summary_csv), slurp(straight.summary_csv));
  EXPECT_EQ(slurp(resumed.bounds_csv), slurp(straight.bounds_csv));
  EXPECT_FALSE(fs::exists(dir));

  H5Handle a(H5Fopen(straight.decisions_h5.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  H5Handle b(H5Fopen(resumed.decisions_h5.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  std::vector<hsize_t> shape_a, shape_b;
  for (const auto& p : policies())
    for (const auto& s : samples)
      for (int l = 0; l < kLayers; ++l)
        for (int g = 0; g < 2; ++g) {
          const std::string path = p.label + "/samples/" + s + "/layers/" + std::to_string(l) +
                                   "/heads/" + std::to_string(g) + "/evicted";
          EXPECT_EQ(read_ints(b.get(), path, shape_b), read_ints(a.get(), path, shape_a)) << path;
          EXPECT_EQ(shape_a, shape_b) << path;
        }
}

TEST(ReplayResume, ASampleSubsetInAnotherOrderIsWrittenInTheOrderAsked) {
  const std::string trace = four_sample_trace();
  TraceReader reader(trace);
  const std::vector<std::string> samples = {reader.sample_names()[2], reader.sample_names()[0]};
  ReplayOutputs out = outputs_in(temp_path("resume_subset"));
  run_replay(trace, reader, policies(), kOptions, samples, out, {});
  const std::string csv = slurp(out.steps_csv);
  EXPECT_LT(csv.find("," + samples[0] + ","), csv.find("," + samples[1] + ","));
  EXPECT_THROW(run_replay(trace, reader, policies(), kOptions, {samples[0], samples[0]}, out, {}),
               std::invalid_argument);
}

TEST(ReplayResume, ACheckpointOfAnotherReplayIsRefusedNamingTheDifference) {
  const std::string trace = four_sample_trace();
  TraceReader reader(trace);
  const ReplayOutputs out = outputs_in(temp_path("resume_other"));
  int layers = 0;
  EXPECT_THROW(run_replay(trace, reader, policies(), kOptions, reader.sample_names(), out, {},
                          [&] {
                            if (++layers == kLayers + 1) throw std::runtime_error("stop");
                          }),
               std::runtime_error);
  auto other = policies();
  other[0] = make_policy_config("h2o", {{"budget", "40%"}});
  try {
    run_replay(trace, reader, other, kOptions, reader.sample_names(), out, {});
    FAIL() << "a checkpoint of another replay was used";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("checkpoint " + out.checkpoint_dir() +
                        " holds finished samples of a "
                        "different replay"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("budget=30%"), std::string::npos) << what;
    EXPECT_NE(what.find("budget=40%"), std::string::npos) << what;
  }
}

TEST(ReplayResume, WithoutOutputsNothingIsKept) {
  const std::string trace = four_sample_trace();
  TraceReader reader(trace);
  const ReplayRunReport r =
      run_replay(trace, reader, policies(), kOptions, reader.sample_names(), {}, {});
  EXPECT_TRUE(r.checkpoint_dir.empty());
  EXPECT_NE(r.table.find("hae"), std::string::npos);
}

TEST(Cli, ReplayResumesAfterAnInterruptionAndSaysSo) {
  // The command line: a second run of the same command picks up the finished samples, says how
  // many, and leaves the checkpoint directory behind neither time it succeeds.
  const std::string trace = four_sample_trace();
  const std::string dir = temp_path("resume_cli");
  fs::create_directories(dir);
  const std::string ckpt = dir + "/steps.csv.checkpoint";
  const std::string command = "replay " + trace + " -p h2o,hae --budget 30% -o " + dir +
                              "/steps.csv --summary " + dir + "/summary.csv";
  CliRun r = kvsim(command);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string straight = slurp(dir + "/steps.csv");
  EXPECT_FALSE(fs::exists(ckpt));
  // A checkpoint left by an interrupted run with the same command: samples 0 and 1 finished.
  {
    TraceReader reader(trace);
    int layers = 0;
    ReplayOutputs out{.steps_csv = dir + "/steps.csv", .summary_csv = dir + "/summary.csv"};
    fs::remove(out.steps_csv);
    EXPECT_THROW(run_replay(trace, reader, policies(), {}, reader.sample_names(), out, {},
                            [&] {
                              if (++layers == 2 * kLayers + 1) throw std::runtime_error("stop");
                            }),
                 std::runtime_error);
  }
  ASSERT_TRUE(fs::exists(ckpt + "/sample-1.done"));
  r = kvsim(command);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed: 2 of 4 sample(s) were finished in " + ckpt), std::string::npos)
      << r.output;
  EXPECT_EQ(slurp(dir + "/steps.csv"), straight);
  EXPECT_FALSE(fs::exists(ckpt));
}

TEST(ReplayResume, WhatPoliciesNoteWhileReplayingIsReportedAndSurvivesAResume) {
  // madakv's conserve reading notes where its budget ran dry, during the prefill hooks: the note
  // reaches the report and the policies sidecar once, counted over samples, also for samples
  // finished before an interruption.
  const std::string trace = four_sample_trace();
  TraceReader reader(trace);
  const auto samples = reader.sample_names();
  const std::vector<PolicyConfig> dry = {
      make_policy_config("madakv", {{"budget", "2"}, {"hcc_reading", "conserve"}})};
  const std::string dir = temp_path("notes_resume");
  fs::remove_all(dir);
  fs::create_directories(dir);
  const ReplayOutputs out{.steps_csv = dir + "/steps.csv"};
  int layers = 0;
  EXPECT_THROW(run_replay(trace, reader, dry, {.threads = 1}, samples, out, {},
                          [&] {
                            if (++layers == 2 * kLayers + 1) throw std::runtime_error("stop");
                          }),
               std::runtime_error);
  const ReplayRunReport r = run_replay(trace, reader, dry, {.threads = 1}, samples, out, {});
  EXPECT_EQ(r.samples_resumed, 2);
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(r.notes[0].find("madakv: with hcc_reading = conserve the budget ran dry at layer"),
            std::string::npos)
      << r.notes[0];
  EXPECT_NE(r.notes[0].find("(4 of 4 sample(s))"), std::string::npos) << r.notes[0];
  EXPECT_NE(slurp(dir + "/steps.policies.csv").find(r.notes[0]), std::string::npos);
  // The default reading spends the budget in proportion to the needs and notes nothing.
  const ReplayRunReport scaled = run_replay(
      trace, reader, {make_policy_config("madakv", {{"budget", "2"}})}, {}, samples, {}, {});
  EXPECT_TRUE(scaled.notes.empty());
}

}  // namespace
}  // namespace kvsim::test

namespace kvsim::test {
namespace {

// The one resume store under the replay checkpoint, the sweep's items and the live pieces.
TEST(ResumeStore, KeysAreWrittenWholeAndAManifestClaimsTheStore) {
  const std::string dir = temp_path("resume_store") + "/nested";
  std::filesystem::remove_all(temp_path("resume_store"));
  const ResumeStore store(dir, "store: cannot create: ");
  EXPECT_TRUE(std::filesystem::is_directory(dir));
  EXPECT_FALSE(store.has("a"));
  EXPECT_FALSE(store.try_read("a"));
  EXPECT_THROW(store.read("a"), std::runtime_error);
  store.write("a", "one\n");
  EXPECT_TRUE(store.has("a"));
  EXPECT_EQ(store.read("a"), "one\n");
  EXPECT_EQ(store.path("a"), dir + "/a");
  // Nothing but the finished file is left beside it.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), {}), 1);
  store.remove("a");
  EXPECT_FALSE(store.has("a"));
  // The first claim writes the manifest; the same one reopens; another names the first line
  // where the two differ.
  EXPECT_FALSE(store.claim("manifest", "kvsim 1\ntrace abc\n"));
  EXPECT_FALSE(store.claim("manifest", "kvsim 1\ntrace abc\n"));
  EXPECT_EQ(store.claim("manifest", "kvsim 1\ntrace abd\n"),
            "it has 'trace abc' where this run has 'trace abd'");
  EXPECT_EQ(store.claim("manifest", "kvsim 1\n"),
            "it has 'trace abc' where this run has '(nothing)'");
  store.clear();
  EXPECT_FALSE(std::filesystem::exists(dir));
  // A store where a file stands is refused with the caller's words and the reason.
  write_whole(temp_path("resume_store") + "/file", "x");
  try {
    ResumeStore(temp_path("resume_store") + "/file", "store: cannot create: ");
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("store: cannot create: ", 0), 0u) << e.what();
  }
}

}  // namespace
}  // namespace kvsim::test
