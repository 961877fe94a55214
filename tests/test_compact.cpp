// Compact traces: replay of a compact trace gives the full trace's results byte for byte for
// every policy and preset whose needs it holds; every other is refused naming the policy and the
// statistic; the format is validated like the full one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>

#include "core/layer_attention.hpp"
#include "policies/policy.hpp"
#include "sim/replay/engine.hpp"
#include "sim/replay/reference_replay.hpp"
#include "sim/run/compact_trace.hpp"
#include "tests/cli_helpers.hpp"
#include "tests/replay_helpers.hpp"
#include "tests/tiny_trace.hpp"
#include "traces/synth.hpp"

namespace kvsim::test {
namespace {

// Two samples with two images and a question after them (so the context's statistics are stored
// too); `user_tokens = 0` leaves no question.
std::string synthetic(const std::string& name, int heads, int kv_heads, int user_tokens = 12,
                      DType dtype = DType::kFloat16) {
  SynthConfig c;
  c.samples = 2;
  c.layers = 2;
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.head_dim = 16;
  c.media_count = 2;
  c.media_tokens = 80;
  c.user_tokens = user_tokens;
  c.gen_tokens = 10;
  c.write.dtype = dtype;
  const std::string path = temp_path(name);
  synth_write(c, path);
  return path;
}

// A compact trace as `kvsim compact` writes it at its defaults (the window statistics of the
// widths every policy and preset reads at its defaults), or with `window` rows.
std::string compacted(const std::string& full, int window = 0) {
  const std::string out = full + ".compact.h5";
  const CliRun run = kvsim("compact " + full + " " + out + " --force -j 2" +
                           (window > 0 ? " --window " + std::to_string(window) : ""));
  EXPECT_EQ(run.code, 0) << run.output;
  return out;
}

// The same without window statistics, as compact traces were written before them: a replay
// computes the window rows from the kept queries.
std::string compacted_without_window_stats(const std::string& full) {
  const std::string out = full + ".rows.compact.h5";
  write_compact_trace(TraceReader(full), out, CompactOptions{.window = 64, .threads = 2});
  return out;
}

// Every registered policy and preset, and whether a compact trace can serve it: a restatement of
// what each reads (expected_attention's Gaussian is fitted to every prompt query).
std::vector<std::string> every_name() {
  std::vector<std::string> names;
  for (const std::string& n : PolicyRegistry::instance().names())
    if (n.rfind("test_", 0) != 0) names.push_back(n);  // policies the tests register themselves
  for (const auto& p : policy_presets()) names.push_back(p.name);
  return names;
}
bool reads_every_prompt_query(const std::string& name) {
  const PolicyConfig c = make_policy_config(name, {});
  const auto scorer = c.params.values().find("scorer");
  return c.info->name == "expected_attention" ||
         (scorer != c.params.values().end() && scorer->second == "expected_attention");
}

// The replay's result files for `args` on `trace`, concatenated (CSV, summary, decisions dump).
std::string replay_outputs(const std::string& trace, const std::string& args,
                           const std::string& tag) {
  const std::string out = temp_path("compact_" + tag);
  const CliRun run = kvsim("replay " + trace + " " + args + " --out " + out + ".csv --summary " +
                           out + ".summary.csv --dump-decisions " + out + ".h5");
  EXPECT_EQ(run.code, 0) << run.output;
  return slurp(out + ".csv") + slurp(out + ".policies.csv") + slurp(out + ".summary.csv") +
         slurp(out + ".h5");
}

TEST(CompactTrace, HoldsTheLayoutItDeclares) {
  const std::string full = synthetic("compact_layout.h5", 4, 2);
  const std::string compact = compacted(full);
  const TraceReader f(full), c(compact);
  EXPECT_FALSE(f.info().compact());
  EXPECT_EQ(c.info().compact_window, 64);
  const SampleInfo fs = f.read_sample("000000"), cs = c.read_sample("000000");
  // P = 2 * 80 media + 35 system + 2 separator + 12 question = 209; context 197; the block of
  // 64 rows holding row 197 - 64 = 133 starts at 128.
  ASSERT_EQ(fs.prompt_len, 209);
  EXPECT_EQ(cs.compact_context_len, 197);
  EXPECT_EQ(cs.compact_first_row, 128);
  for (int l = 0; l < 2; ++l) {
    const LayerTensors a = f.read_layer(fs, l), b = c.read_layer(cs, l);
    ASSERT_EQ(b.q.shape(0), a.q.shape(0) - 128);
    EXPECT_EQ(a.k, b.k);
    EXPECT_EQ(a.v, b.v);
    for (int pos = 128; pos < fs.total_len(); ++pos)
      for (int h = 0; h < 4; ++h)
        for (int e = 0; e < 16; ++e) ASSERT_EQ(a.q(pos, h, e), b.query(pos, h)[e]);
    EXPECT_THROW(b.query(127, 0), std::logic_error);
    ASSERT_TRUE(b.stored);
    EXPECT_EQ(b.stored->by_prompt_len.size(), 2u);  // the prompt and the context
    // The stored column sums sum every causal row: Σ_j = P for each head (each row sums to 1).
    const auto& sums = b.stored->prompt(209, "test").column_sums;
    for (int h = 0; h < 4; ++h) {
      double total = 0;
      for (int j = 0; j < 209; ++j) total += sums[static_cast<std::size_t>(h) * 209 + j];
      EXPECT_NEAR(total, 209.0, 1e-3);
    }
  }
  // A compact trace is much smaller in its queries and is not compacted twice.
  EXPECT_LT(c.stored_bytes("000000"), f.stored_bytes("000000"));
  EXPECT_THROW(write_compact_trace(c, temp_path("twice.h5"), {}), std::invalid_argument);
  EXPECT_THROW(reference_replay(c, "000000", make_policy_config("snapkv", {})), std::logic_error);
}

// The statistics of the prompt and of its context as two prompts of their own (what compaction
// computed until it took both from one pass): plain LayerAttentions of each.
StoredPromptStats two_pass_stats(const TraceInfo& trace, const SampleInfo& sample,
                                 const LayerTensors& full, int threads) {
  const AttentionNeeds needs{.prefill_column_sums = true,
                             .text_query_layers = trace.num_layers,
                             .prefill_column_sums_rounded = true};
  StoredPromptStats stats;
  const int question = question_length(sample);
  for (const SampleInfo& s :
       {sample, question > 0 ? context_only(sample, question) : SampleInfo{}}) {
    if (s.prompt_len == 0) continue;
    LayerAttention att(LayerAttention::PromptOnly{}, trace, s, full, needs, threads);
    StoredPromptStats::Prompt& p = stats.by_prompt_len[s.prompt_len];
    for (int h = 0; h < trace.num_heads; ++h) {
      p.column_sums.insert(p.column_sums.end(), att.prefill_column_sums(h),
                           att.prefill_column_sums(h) + s.prompt_len);
      p.column_sums_rounded.insert(p.column_sums_rounded.end(), att.prefill_column_sums_rounded(h),
                                   att.prefill_column_sums_rounded(h) + s.prompt_len);
    }
    p.text_column_sums.assign(att.text_query_column_sums(),
                              att.text_query_column_sums() + s.prompt_len);
    p.text_column_max.assign(att.text_query_column_max(),
                             att.text_query_column_max() + s.prompt_len);
  }
  return stats;
}

bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The context's statistics come from the prompt's pass (its rows before the context's end, and
// the one block that straddles the end multiplied again at the context's shape): the bytes of a
// pass of its own, on MHA and GQA, float16 and float32, at 1 and 2 threads, for contexts that end
// at a block's end, just before and after it, inside a block and after one position; and with
// no text query after the context (its last positions relabelled as image tokens).
TEST(CompactTrace, ContextStatisticsFromThePromptsPassAreATwoPassesBytes) {
  struct Case {
    std::string name;
    int heads, kv_heads;
    DType dtype;
  };
  for (const Case& k : {Case{"mha", 4, 4, DType::kFloat16}, Case{"gqa", 4, 2, DType::kFloat16},
                        Case{"gqa32", 4, 2, DType::kFloat32}}) {
    const TraceReader reader(
        synthetic("compact_one_pass_" + k.name + ".h5", k.heads, k.kv_heads, 12, k.dtype));
    const SampleInfo original = reader.read_sample("000000");
    ASSERT_EQ(original.prompt_len, 209);
    const LayerTensors full = reader.read_layer(original, 1);
    int compared = 0;
    for (const int context : {197, 192, 191, 193, 128, 100, 64, 20, 1, -197}) {
      SampleInfo sample = original;
      sample.question_len = sample.prompt_len - std::abs(context);
      if (context < 0)
        std::fill(sample.modality.begin() + sample.prompt_len - sample.question_len,
                  sample.modality.begin() + sample.prompt_len,
                  static_cast<std::uint8_t>(Modality::kImage));
      for (const int threads : {1, 2}) {
        const StoredPromptStats want = two_pass_stats(reader.info(), sample, full, threads);
        LayerTensors moved = full;
        const StoredPromptStats got =
            prompt_stats_of_layer(reader.info(), sample, moved, false, threads);
        EXPECT_EQ(moved.q, full.q);  // handed back
        ASSERT_EQ(got.by_prompt_len.size(), 2u) << k.name << " context " << context;
        for (const auto& [len, w] : want.by_prompt_len) {
          const StoredPromptStats::Prompt& g = got.prompt(len, "test");
          const std::string where = k.name + " context " + std::to_string(context) + " length " +
                                    std::to_string(len) + " threads " + std::to_string(threads);
          EXPECT_TRUE(same_bytes(g.column_sums, w.column_sums)) << where;
          EXPECT_TRUE(same_bytes(g.column_sums_rounded, w.column_sums_rounded)) << where;
          EXPECT_TRUE(same_bytes(g.text_column_sums, w.text_column_sums)) << where;
          EXPECT_TRUE(same_bytes(g.text_column_max, w.text_column_max)) << where;
          ++compared;
        }
      }
    }
    EXPECT_EQ(compared, 10 * 2 * 2) << k.name;
  }
}

// Each policy and preset alone (its own window alignment) on MHA and GQA traces, with and
// without a question, float16 and float32: the same bytes from the compact trace, with its window
// statistics and without them.
TEST(CompactTrace, EveryPolicyAndPresetReplaysByteForByte) {
  struct Case {
    std::string name;
    int heads, kv_heads, user_tokens;
    DType dtype;
  };
  for (const Case& k :
       {Case{"mha", 4, 4, 12, DType::kFloat16}, Case{"gqa", 4, 2, 12, DType::kFloat16},
        Case{"gqa_noq", 4, 2, 0, DType::kFloat32}}) {
    const std::string full =
        synthetic("compact_" + k.name + ".h5", k.heads, k.kv_heads, k.user_tokens, k.dtype);
    const std::string compact = compacted(full);
    const std::string rows = compacted_without_window_stats(full);
    int compared = 0;
    for (const std::string& name : every_name()) {
      if (reads_every_prompt_query(name)) continue;
      const std::string args = "-p " + name + " --seeds 2 -j 2";
      const std::string from_full = replay_outputs(full, args, k.name + "_f");
      ASSERT_EQ(from_full, replay_outputs(compact, args, k.name + "_c")) << k.name << ": " << name;
      ASSERT_EQ(from_full, replay_outputs(rows, args, k.name + "_r")) << k.name << ": " << name;
      ++compared;
    }
    EXPECT_GE(compared, 40) << k.name;
  }
}

// The per-step rows of `label` in a replay of `trace` with `args`.
std::string rows_of(const std::string& trace, const std::string& args, const std::string& label) {
  const std::string out = temp_path("compact_rows_of.csv");
  const CliRun run = kvsim("replay " + trace + " " + args + " -j 2 --out " + out);
  EXPECT_EQ(run.code, 0) << run.output;
  std::string rows, line;
  std::istringstream in(slurp(out));
  while (std::getline(in, line))
    if (line.rfind(label + ",", 0) == 0) rows += line + "\n";
  return rows;
}

// A policy's window rows come from the blocks of 64 rows counted from position 0 whatever else
// the run computes (a BLAS may round a row differently in a product of another row count: with
// the column sums of H2O beside it, or alone with a window of one row or of 32), so its results
// do not depend on the policies beside it, from a full trace or a compact one.
TEST(CompactTrace, APolicysResultsDoNotDependOnThePoliciesBesideIt) {
  const std::string full = synthetic("compact_beside.h5", 4, 2);
  for (const std::string& trace : {full, compacted(full), compacted_without_window_stats(full)})
    for (const std::string policy : {"snapkv", "tova", "fastv", "snapkv:kvpress"}) {
      const std::string alone = rows_of(trace, "-p " + policy, policy);
      EXPECT_FALSE(alone.empty()) << policy;
      EXPECT_EQ(alone, rows_of(trace, "-p " + policy + " -p h2o", policy))
          << trace << " " << policy;
      EXPECT_EQ(alone, rows_of(trace, "-p " + policy + " -p madakv --set madakv.proxy=40", policy))
          << trace << " " << policy;
    }
}

// The demo's settings, every policy in one run (one shared computation, column sums wanted: the
// window's rows come from blocks aligned at row 0), at equal memory too, with diagnostics and
// HAE's bound checks, one thread and two.
TEST(CompactTrace, DemoSettingsReplayByteForByte) {
  const std::string full = synthetic("compact_demo.h5", 4, 2);
  const std::string compact = compacted(full);
  const std::string demo =
      "-p full -p random -p downsample -p text_only -p streamingllm -p h2o -p snapkv -p oracle "
      "-p fastv -p vtw -p pyramidkv -p adakv -p tova -p lookm -p hae -p hae:table1 -p madakv "
      "-p avl -p st3 -p meda --budget 20% --set avl.max_new_tokens=10 "
      "--set st3.max_new_tokens=10 --set hae.budget=auto --set hae.rc_size=4 --diagnostics";
  for (const std::string threads : {"1", "2"}) {
    EXPECT_EQ(replay_outputs(full, demo + " -j " + threads, "demo_f"),
              replay_outputs(compact, demo + " -j " + threads, "demo_c"));
    const std::string equal =
        "-p snapkv -p h2o -p lookm -p madakv -p adakv:kvpress -p st3 "
        "--set st3.heredity=0:1-1 -p hae --set hae.budget=30 --budget 25% "
        "--equal-memory -j " +
        threads;
    EXPECT_EQ(replay_outputs(full, equal, "equal_f"), replay_outputs(compact, equal, "equal_c"));
  }
}

// The window statistics a compact trace stores are the sums a re-statement adds from the full
// trace's rows (the group's query heads outer, the window's rows inner, in double from 0; the last
// row over every head, each term p / H in float), and a layer that reads only them computes no
// rows; a width it does not store (SnapKV's window clamped to a small budget) is added from rows
// computed when first read.
TEST(CompactTrace, StoresWindowStatisticsAsTheRowsAddThem) {
  const std::string full = synthetic("compact_window_stats.h5", 4, 2);
  const std::string compact = compacted(full);
  const TraceReader f(full), c(compact);
  const std::vector<int>& widths = c.info().compact_window_widths;
  ASSERT_TRUE(std::binary_search(widths.begin(), widths.end(), 32));  // snapkv's default window
  const auto added = [](const LayerAttention& rows, int g, int width) {
    std::vector<double> sum(rows.prompt_len(), 0.0);
    for (int r = 0; r < rows.group_size(); ++r)
      for (int w = rows.prefill_window() - width; w < rows.prefill_window(); ++w)
        for (int j = 0; j < rows.prompt_len(); ++j)
          sum[j] += rows.prefill_window_row(g * rows.group_size() + r, w)[j];
    return sum;
  };
  for (const std::string& name : f.sample_names())
    for (int l = 0; l < f.info().num_layers; ++l) {
      const SampleInfo fs = f.read_sample(name), cs = c.read_sample(name);
      const LayerAttention rows(f.info(), fs, f.read_layer(fs, l),
                                AttentionNeeds{.prefill_window = 32}, 1);
      const LayerAttention stored(
          c.info(), cs, c.read_layer(cs, l),
          AttentionNeeds{.window_group_sums = {32}, .last_row_head_mean = true}, 2);
      EXPECT_FALSE(stored.holds_window_rows());
      for (int g = 0; g < f.info().num_kv_heads; ++g)
        EXPECT_EQ(stored.window_group_sums(g, 32), added(rows, g, 32)) << name << " " << l;
      std::vector<double> mean(fs.prompt_len, 0.0);
      for (int h = 0; h < f.info().num_heads; ++h)
        for (int j = 0; j < fs.prompt_len; ++j)
          mean[j] += static_cast<float>(rows.prefill_window_row(h, 31)[j] / f.info().num_heads);
      EXPECT_EQ(stored.last_row_head_mean(), mean);
      EXPECT_FALSE(stored.holds_window_rows());
      EXPECT_EQ(stored.window_group_sums(1, 5), added(rows, 1, 5));
      EXPECT_TRUE(stored.holds_window_rows());
    }
}

// Deferred window rows first read by several threads at once (policies replay side by side) are
// computed once, and every thread reads the rows a layer computing them at once holds.
TEST(CompactTrace, DeferredWindowRowsReadFromSeveralThreads) {
  const std::string full = synthetic("compact_window_threads.h5", 4, 2);
  const std::string compact = compacted(full);
  const TraceReader c(compact);
  const SampleInfo s = c.read_sample(c.sample_names().front());
  const LayerAttention eager(c.info(), s, c.read_layer(s, 1), AttentionNeeds{.prefill_window = 32},
                             1);
  const LayerAttention deferred(c.info(), s, c.read_layer(s, 1),
                                AttentionNeeds{.window_group_sums = {32}}, 1);
  ASSERT_FALSE(deferred.holds_window_rows());
  std::vector<std::vector<double>> read(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] { read[t] = deferred.window_group_sums(t % 2, 5 + t % 3); });
  for (auto& t : threads) t.join();
  for (int t = 0; t < 8; ++t) EXPECT_EQ(read[t], eager.window_group_sums(t % 2, 5 + t % 3)) << t;
  for (int h = 0; h < c.info().num_heads; ++h)
    for (int r = 0; r < 32; ++r)
      ASSERT_EQ(std::memcmp(deferred.prefill_window_row(h, r), eager.prefill_window_row(h, r),
                            sizeof(float) * s.prompt_len),
                0)
          << h << " " << r;
}

TEST(CompactTrace, RefusesWhatItDoesNotHoldNamingPolicyAndStatistic) {
  const std::string full = synthetic("compact_refuse.h5", 4, 2);
  const std::string compact = compacted(full, 32);
  CliRun run = kvsim("replay " + compact + " -p expected_attention");
  EXPECT_NE(run.code, 0);
  EXPECT_NE(run.output.find("expected_attention: " + compact +
                            " is a compact trace, and the "
                            "policy needs every prompt query"),
            std::string::npos)
      << run.output;
  run = kvsim("replay " + compact + " -p adakv:kvpress-expected-attention");
  EXPECT_NE(run.output.find("adakv:kvpress-expected-attention: "), std::string::npos) << run.output;
  // SnapKV's window of 48 rows is longer than the 32 kept.
  run = kvsim("replay " + compact + " -p snapkv --set snapkv.window=48");
  EXPECT_NE(run.code, 0);
  EXPECT_NE(run.output.find("snapkv: " + compact +
                            " is a compact trace, and the policy needs "
                            "the attention of the last 48 prompt rows; it keeps the query rows "
                            "of windows up to 32 rows: compact the full trace again with "
                            "--window 48"),
            std::string::npos)
      << run.output;
  // MadaKV's window sums over every layer, the same way.
  run = kvsim("replay " + compact + " -p madakv --set madakv.proxy=40");
  EXPECT_NE(run.output.find("last 40 prompt rows"), std::string::npos) << run.output;
  // The attention statistics need every prompt row.
  run = kvsim("stats " + compact + " --out " + temp_path("compact_stats.h5"));
  EXPECT_NE(run.code, 0);
  EXPECT_NE(run.output.find(compact + " is a compact trace: the attention statistics"),
            std::string::npos)
      << run.output;
  // Widths of the window sums: positive, and within the window.
  run = kvsim("compact " + full + " " + temp_path("compact_sums.h5") + " --window-sums 8,x");
  EXPECT_NE(run.code, 0);
  EXPECT_NE(run.output.find("--window-sums: 'x' is not a width of 1 or more rows"),
            std::string::npos)
      << run.output;
  run = kvsim("compact " + full + " " + temp_path("compact_sums.h5") + " --window-sums 100");
  EXPECT_NE(run.code, 0);
  EXPECT_NE(run.output.find("--window-sums: widths must ascend from 1 to --window 64, not 100"),
            std::string::npos)
      << run.output;
  // Within the window it keeps, the same policy runs.
  EXPECT_EQ(kvsim("replay " + compact + " -p snapkv --set snapkv.window=32").code, 0);
  // Written without the entropies, MEDA (whose layer budgets need them) is refused; H2O runs.
  const std::string no_entropies = temp_path("compact_no_entropies.h5");
  run = kvsim("compact " + full + " " + no_entropies + " --no-entropies");
  ASSERT_EQ(run.code, 0) << run.output;
  run = kvsim("replay " + no_entropies + " -p meda");
  EXPECT_NE(run.code, 0);
  EXPECT_NE(run.output.find("meda: " + no_entropies +
                            " is a compact trace, and the policy needs "
                            "the prompt entropies of every layer, which this compact trace was "
                            "written without (--no-entropies)"),
            std::string::npos)
      << run.output;
  EXPECT_EQ(kvsim("replay " + no_entropies + " -p h2o").code, 0);
  // An output that cannot be written is named with the system's reason, and a compact trace is
  // not compacted again.
  run = kvsim("compact " + full + " /nonexistent-dir/x.h5");
  EXPECT_NE(run.code, 0);
  EXPECT_NE(run.output.find("OUT /nonexistent-dir/x.h5: cannot write there: No such file or "
                            "directory"),
            std::string::npos)
      << run.output;
  run = kvsim("compact " + compact + " " + temp_path("twice.h5"));
  EXPECT_NE(run.output.find(compact + " is already a compact trace"), std::string::npos)
      << run.output;
}

// Rewrites an integer attribute of a written file.
void set_int_attr(const std::string& path, const std::string& object, const char* name,
                  std::int64_t value) {
  H5Handle f(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
  H5Handle o(H5Oopen(f.get(), object.c_str(), H5P_DEFAULT));
  if (H5Aexists(o.get(), name) > 0) H5Adelete(o.get(), name);
  h5_write_int_attr(o.get(), name, value);
}

void remove_object(const std::string& path, const std::string& object) {
  H5Handle f(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
  H5Ldelete(f.get(), object.c_str(), H5P_DEFAULT);
}

std::string error_of(const std::string& path, int layer = 0) {
  try {
    const TraceReader r(path);
    const SampleInfo s = r.read_sample("000000");
    r.read_layer(s, layer);
  } catch (const TraceError& e) {
    return e.what();
  }
  return "";
}

TEST(CompactTrace, ValidatesItsOwnParts) {
  const std::string full = synthetic("compact_bad.h5", 4, 2);
  // Each case: a fresh compact copy spoilt one way, and what the reader's error reading layer
  // `layer` of sample 000000 names.
  struct Case {
    std::string name;
    std::function<void(const std::string&)> spoil;
    std::string error;
    int layer = 0;
  };
  const auto set = [](const char* object, const char* attribute, int value) {
    return [=](const std::string& p) { set_int_attr(p, object, attribute, value); };
  };
  const auto remove = [](const char* object) {
    return [=](const std::string& p) { remove_object(p, object); };
  };
  const std::vector<Case> cases = {
      {"bad_version.h5", set("/", "kvtrace_compact", 4),
       "kvtrace_compact is 4; this kvsim reads compact traces of versions 1 to 3"},
      {"bad_context.h5", set("/samples/000000", "compact_context_len", 150),
       "sample '000000': attribute 'compact_context_len' = 150 but the sample's context is 197 "
       "positions"},
      {"bad_first.h5", set("/samples/000000", "compact_first_row", 198),
       "attribute 'compact_first_row' = 198 drops queries"},
      // T = 219: rows 128..218 are stored (91), the attribute now declares 64..218 (155).
      {"bad_rows.h5", set("/samples/000000", "compact_first_row", 64),
       "dataset 'layers/0/q_rows': shape [91, 4, 16] does not match [T - compact_first_row, H, d] "
       "= [155, 4, 16]"},
      {"bad_missing.h5", remove("/samples/000000/layers/1/stats/context/column_sums_rounded"),
       "sample '000000', dataset 'layers/1/stats/context/column_sums_rounded': missing dataset", 1},
      {"bad_widths.h5", set("/", "compact_window_widths", 65),
       "file attribute 'compact_window_widths' must be ascending widths of 1 to compact_window = "
       "64 rows"},
      {"bad_window_sums.h5", remove("/samples/000000/layers/1/stats/prompt/window_group_sums"),
       "dataset 'layers/1/stats/prompt/window_group_sums': missing dataset", 1},
      {"bad_q.h5", remove("/samples/000000/layers/1/q_rows"),
       "dataset 'layers/1/q_rows': missing dataset"},
  };
  for (const Case& c : cases) {
    const std::string p = temp_path(c.name);
    std::rename(compacted(full).c_str(), p.c_str());
    c.spoil(p);
    EXPECT_NE(error_of(p, c.layer).find(c.error), std::string::npos) << error_of(p, c.layer);
  }
}

TEST(CompactTrace, AnEarlierVersionsEntropiesAreRefusedTheRestRuns) {
  // Compact traces of versions 1 and 2 store entropies from products shaped otherwise (equal to
  // about 1e-9) and from scalar exponentials (about 1e-15): MEDA is refused with how to remake
  // it; the other statistics are today's, H2O runs.
  const std::string full = synthetic("compact_v1.h5", 4, 2);
  const std::string earlier = compacted(full);
  const std::string refused = "meda: " + earlier +
                              " is a compact trace, and the policy needs the prompt entropies of "
                              "every layer as this kvsim computes them; this compact trace ";
  const std::pair<int, std::string> versions[] = {
      {1,
       "(version 1) stores them from products shaped otherwise, equal to about 1e-9 and not "
       "byte for byte: compact the full trace again"},
      {2,
       "(version 2) stores them with scalar exponentials, equal to about 1e-15 and not byte "
       "for byte: compact the full trace again"}};
  for (const auto& [version, why] : versions) {
    set_int_attr(earlier, "/", "kvtrace_compact", version);
    CliRun run = kvsim("replay " + earlier + " -p meda");
    EXPECT_NE(run.code, 0);
    EXPECT_NE(run.output.find(refused + why), std::string::npos) << run.output;
    EXPECT_EQ(kvsim("replay " + earlier + " -p h2o").code, 0);
  }
  set_int_attr(earlier, "/", "kvtrace_compact", 3);
  EXPECT_EQ(kvsim("replay " + earlier + " -p meda").code, 0);
}

// The full cache's decode results are stored as a replay computes them, and read in place of
// computing them only for the layer's own tensors in the trace's shape: a layer attending with
// another layer's q/k, KV heads repeated per query head, or a prompt split before positions fed
// after it (`question = append`; here one position) computes its own (shown by storing wrong
// numbers, which only the trace's own shape then reads).
TEST(CompactTrace, StoresTheFullCachesDecodeResultsAsAReplayComputesThem) {
  const std::string full = synthetic("compact_decode.h5", 4, 2);
  const std::string compact = compacted(full);
  const TraceReader f(full), c(compact);
  const SampleInfo fs = f.read_sample("000000"), cs = c.read_sample("000000");
  const std::size_t G = 10, H = 4, d = 16;
  for (int l = 0; l < 2; ++l) {
    const LayerAttention computed(f.info(), fs, f.read_layer(fs, l), AttentionNeeds{}, 1);
    const LayerTensors layer = c.read_layer(cs, l);
    ASSERT_TRUE(layer.stored);
    const StoredPromptStats::Decode& stored = layer.stored->decode;
    EXPECT_EQ(layer.stored->layer, l);
    EXPECT_EQ(stored.prompt_len, 209);
    EXPECT_EQ(stored.kv_heads, 2);
    ASSERT_EQ(stored.output.size(), G * H * d);
    ASSERT_EQ(stored.mass.size(), G * H);
    EXPECT_TRUE(same_bytes(
        stored.output,
        std::vector<float>(computed.full_output(0, 0), computed.full_output(0, 0) + G * H * d)));
    for (std::size_t t = 0; t < G; ++t)
      for (std::size_t h = 0; h < H; ++h) {
        EXPECT_EQ(stored.value_norm[t * H + h], computed.full_value_norm(t, h));
        EXPECT_EQ(stored.mass[t * H + h], computed.decode_mass(t, h));
      }
  }
  LayerTensors layer = c.read_layer(cs, 0);
  auto wrong = std::make_shared<StoredPromptStats>(*layer.stored);
  wrong->decode.output.assign(wrong->decode.output.size(), 7.0f);
  wrong->decode.value_norm.assign(wrong->decode.value_norm.size(), 7.0f);
  wrong->decode.mass.assign(wrong->decode.mass.size(), 7.0);
  layer.stored = wrong;
  const LayerAttention own(c.info(), cs, layer, AttentionNeeds{}, 1);
  EXPECT_EQ(own.full_output(3, 1)[5], 7.0f);
  EXPECT_EQ(own.full_value_norm(3, 1), 7.0f);
  EXPECT_EQ(own.decode_mass(3, 1), 7.0);
  // Each shape beside the same shape of the full trace's layer.
  const LayerTensors full0 = f.read_layer(fs, 0);
  LayerTensors heir = layer;
  heir.layer = 1;  // layer 1 attending with layer 0's q/k (and, here, its values)
  const auto repeated = [](const TraceInfo& info, const SampleInfo& s, const LayerTensors& t) {
    return LayerAttention(info_with_kv_heads(info, 4), s, repeat_kv_heads(t, 2), {}, 1);
  };
  const std::vector<std::pair<LayerAttention, LayerAttention>> shapes = [&] {
    std::vector<std::pair<LayerAttention, LayerAttention>> v;
    v.emplace_back(repeated(c.info(), cs, layer), repeated(f.info(), fs, full0));
    v.emplace_back(LayerAttention(c.info(), context_only(cs, 1), layer, {}, 1),
                   LayerAttention(f.info(), context_only(fs, 1), full0, {}, 1));
    v.emplace_back(LayerAttention(c.info(), cs, heir, {}, 1),
                   LayerAttention(f.info(), fs, full0, {}, 1));
    return v;
  }();
  for (const auto& [got, want] : shapes)
    for (int t = 0; t < got.gen_len(); ++t)
      for (int h = 0; h < 4; ++h) {
        ASSERT_EQ(std::memcmp(got.full_output(t, h), want.full_output(t, h), d * sizeof(float)), 0);
        ASSERT_EQ(got.full_value_norm(t, h), want.full_value_norm(t, h));
        ASSERT_EQ(got.decode_mass(t, h), want.decode_mass(t, h));
      }
}

// A compact trace without the decode results (written before they were stored, or by a writer
// that leaves them out) replays the same bytes; one with a part of them missing is refused.
TEST(CompactTrace, DecodeResultsAreOptionalAndValidated) {
  const std::string full = synthetic("compact_no_decode.h5", 4, 2);
  const std::string compact = compacted(full);
  const std::string bare = temp_path("compact_no_decode_bare.h5");
  std::filesystem::copy_file(compact, bare, std::filesystem::copy_options::overwrite_existing);
  for (const char* sample : {"000000", "000001"})
    for (int l = 0; l < 2; ++l)
      remove_object(bare, std::string("/samples/") + sample + "/layers/" + std::to_string(l) +
                              "/stats/decode");
  EXPECT_TRUE(TraceReader(bare)
                  .read_layer(TraceReader(bare).read_sample("000000"), 1)
                  .stored->decode.empty());
  for (const std::string& args :
       {std::string("-p h2o -p snapkv -p tova -p adakv:kvpress -p st3 --set st3.heredity=0:1-1 "
                    "-p meda --budget 25% -j 2"),
        std::string("-p h2o -p snapkv -p knorm --set snapkv.question=append "
                    "--set knorm.question=append --budget 25% -j 2")}) {
    const std::string want = replay_outputs(full, args, "decode_f");
    EXPECT_EQ(replay_outputs(compact, args, "decode_c"), want) << args;
    EXPECT_EQ(replay_outputs(bare, args, "decode_b"), want) << args;
  }
  remove_object(compact, "/samples/000000/layers/1/stats/decode/mass");
  EXPECT_NE(error_of(compact, 1)
                .find("sample '000000', dataset 'layers/1/stats/decode/mass': "
                      "missing dataset"),
            std::string::npos)
      << error_of(compact, 1);
}

}  // namespace
}  // namespace kvsim::test
