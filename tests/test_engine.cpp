// The replay engine: agreement with the plain reference, determinism across thread counts,
// merged and stored-but-unused entries, the lookahead gate, and the decisions dump.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <cmath>
#include <cstring>
#include <set>

#include "sim/replay/bounds.hpp"
#include "sim/replay/reference_replay.hpp"
#include "sim/replay/results.hpp"
#include "sim/replay/step_metric.hpp"
#include "tests/replay_helpers.hpp"
#include "tests/tiny_trace.hpp"
#include "traces/hdf5_util.hpp"
#include "traces/synth.hpp"

namespace kvsim::test {
namespace {

// Test-only policy: at the prefill, merges entry 1 into entry 0 (mean key and value) and parks
// entry 2 (stored, not attended); never evicts.
class MergeAndPark final : public Policy {
 public:
  void on_prefill(const LayerView& view, KvCache& cache) override {
    const int d = cache.head_dim();
    for (int g = 0; g < cache.kv_heads(); ++g) {
      std::vector<float> k(d), v(d);
      for (int i = 0; i < d; ++i) {
        k[i] = (view.key(0, g)[i] + view.key(1, g)[i]) / 2;
        v[i] = view.has_values() ? (view.value(0, g)[i] + view.value(1, g)[i]) / 2 : 0.0f;
      }
      cache.merge(g, 1, 0, k.data(), v.data());
      cache.set_attended(g, 1, false);  // position 2 is now entry 1
    }
  }
  void on_decode(const LayerView&, const StepAttention&, KvCache&) override {}
};

const PolicyRegistration merge_reg({
    .name = "test_merge_park",
    .summary = "test only",
    .provenance = "tests",
    .params = {},
    .merges = true,
    .create = [](const ParamSet&, const SampleInfo&) -> std::unique_ptr<Policy> {
      return std::make_unique<MergeAndPark>();
    },
});

// Test-only policy: at every decode step each KV head evicts its oldest entry; only KV head 1
// exposes the scores it evicts by (its positions: the oldest is the lowest), as a policy that
// scores some heads only.
class OldestOutScoresHeadOne final : public Policy {
 public:
  void on_prefill(const LayerView&, KvCache&) override {}
  void on_decode(const LayerView&, const StepAttention&, KvCache& cache) override {
    for (int g = 0; g < cache.kv_heads(); ++g) {
      const int oldest = 0;
      cache.evict(g, std::span<const int>(&oldest, 1));
    }
    scores_.clear();
    for (int p = 0; p <= cache.position(1, cache.size(1) - 1); ++p) scores_.push_back(p);
  }
  const std::vector<double>* eviction_scores(int, int kv_head) const override {
    return kv_head == 1 ? &scores_ : nullptr;
  }

 private:
  std::vector<double> scores_;
};

const PolicyRegistration scores_head_one_reg({
    .name = "test_scores_head_one",
    .summary = "test only",
    .provenance = "tests",
    .params = {},
    .create = [](const ParamSet&, const SampleInfo&) -> std::unique_ptr<Policy> {
      return std::make_unique<OldestOutScoresHeadOne>();
    },
});

void expect_same(const LayerResult& a, const LayerResult& b, double tol, const std::string& what) {
  ASSERT_EQ(a.steps.size(), b.steps.size()) << what;
  for (std::size_t g = 0; g < a.steps.size(); ++g) {
    ASSERT_EQ(a.evicted[g].size(), b.evicted[g].size()) << what << " head " << g;
    for (std::size_t i = 0; i < a.evicted[g].size(); ++i) {
      EXPECT_EQ(a.evicted[g][i].step, b.evicted[g][i].step) << what;
      EXPECT_EQ(a.evicted[g][i].position, b.evicted[g][i].position) << what;
    }
    for (std::size_t t = 0; t < a.steps[g].size(); ++t) {
      const auto &x = a.steps[g][t], &y = b.steps[g][t];
      EXPECT_EQ(x.cache_size, y.cache_size) << what;
      EXPECT_EQ(x.attended_size, y.attended_size) << what;
      EXPECT_NEAR(x.mass_recall, y.mass_recall, tol)
          << what << " layer " << a.layer << " step " << t;
      EXPECT_NEAR(x.output_rel_error, y.output_rel_error, tol) << what << " step " << t;
      EXPECT_NEAR(x.output_value_error, y.output_value_error, tol) << what << " step " << t;
      EXPECT_EQ(x.kv_bytes, y.kv_bytes) << what;
    }
  }
}

TEST(Engine, MatchesThePlainReferenceForEveryBaseline) {
  const std::string path = small_synthetic_trace("engine_ref.h5");
  TraceReader reader(path);
  const std::vector<std::pair<std::string, std::map<std::string, std::string>>> cases = {
      {"full", {}},
      {"streamingllm", {{"budget", "16"}}},
      {"h2o", {{"budget", "16"}}},
      {"snapkv", {{"budget", "24"}, {"window", "8"}, {"kernel", "5"}}},
      {"oracle", {{"budget", "16"}}},
      {"hae", {{"r", "0.02"}, {"alpha", "0.05"}, {"rc_size", "4"}}},
      {"hae", {{"budget", "20"}, {"rc_size", "3"}, {"stages", "decode"}}},
      {"hae", {{"r", "0.02"}, {"alpha", "0.05"}, {"rc_size", "4"}, {"ddes", "mark"}}},
      {"meda", {{"budget", "12"}}},
      {"avl", {}},
      {"fastv", {}},
      {"lookm", {{"budget", "16"}, {"merge", "pivotal"}}},
      {"lookm", {{"budget", "16"}, {"merge", "weighted"}}},
      {"vtw", {{"K", "1"}}},
      {"tova", {{"budget", "16"}}},
      {"pyramidkv", {{"budget", "20"}, {"window", "4"}, {"kernel", "3"}}},
      {"adakv", {{"budget", "20"}, {"window", "4"}, {"kernel", "3"}}},
      {"adakv", {{"budget", "20"}, {"window", "4"}, {"scorer", "h2o"}}},
      {"madakv", {{"budget", "16"}, {"proxy", "4"}}},
      {"madakv", {{"budget", "16"}, {"proxy", "4"}, {"hcc_reading", "literal_mean"}}},
      {"st3", {{"first_layer", "1"}, {"S", "1"}, {"tau", "8"}}},
      {"st3", {{"first_layer", "1"}, {"S", "2"}, {"tau", "8"}, {"anneal_layers", "all"}}},
      {"st3", {{"first_layer", "1"}, {"tau", "8"}, {"heredity", "0:1-2"}}},
      {"avl", {{"S", "40"}, {"C", "20"}, {"K", "2"}, {"P", "70"}, {"T", "40"}}},
      {"meda", {{"budget", "12"}, {"entropy", "full"}, {"compress_at", "first_decode"}}},
      {"test_merge_park", {}}};
  for (const auto& [name, params] : cases) {
    const PolicyConfig cfg = make_policy_config(name, params);
    const auto fast = run_policy(path, name, params, 2);
    const auto ref = reference_replay(reader, "000000", cfg);
    ASSERT_EQ(fast.size(), ref.size());
    for (std::size_t l = 0; l < fast.size(); ++l) expect_same(fast[l], ref[l], 2e-5, name);
  }
}

TEST(Engine, FlushesAreRecordedForEveryHeadThatScores) {
  // KV head 0 exposes no scores and head 1 does: every decode step's eviction of head 1 (one
  // entry, the oldest, which is also the lowest score: realized = greedy) is recorded, none of
  // head 0's. The scores are read after the hook, so the evicted oldest position p scores p.
  const std::string path = small_synthetic_trace("engine_flushes.h5", 1);
  TraceReader reader(path);
  std::vector<LayerResult> out;
  Replayer(reader, {make_policy_config("test_scores_head_one", {})},
           {.threads = 1, .checks = {bounds_check(0.01)}})
      .replay_sample("000000", [&](const LayerResult& l) { out.push_back(l); });
  ASSERT_EQ(out.size(), 1u);
  const SampleInfo sample = reader.read_sample("000000");
  ASSERT_EQ(static_cast<int>(bounds_record(out[0])->flushes.size()), sample.gen_len);
  for (int t = 0; t < sample.gen_len; ++t) {
    const FlushEvent& f = bounds_record(out[0])->flushes[t];
    EXPECT_EQ(f.step, t);
    EXPECT_EQ(f.kv_head, 1);
    EXPECT_EQ(f.removed, 1);
    EXPECT_DOUBLE_EQ(f.realized, t);  // the oldest of head 1 at step t is position t
    EXPECT_DOUBLE_EQ(f.greedy, t);
  }
}

TEST(Engine, ResultsDoNotDependOnTheThreadCount) {
  const std::string path = small_synthetic_trace("engine_threads.h5", 2);
  TraceReader reader(path);
  std::vector<PolicyConfig> policies;
  policies.push_back(make_policy_config("full", {}));
  for (const std::string p : {"streamingllm", "h2o", "oracle"})
    policies.push_back(make_policy_config(p, {{"budget", "30%"}}));
  policies.push_back(make_policy_config("snapkv", {{"budget", "30%"}, {"window", "4"}}));
  auto run = [&](const std::vector<PolicyConfig>& configs, int threads) {
    std::vector<LayerResult> out;
    Replayer(reader, configs, ReplayOptions{.threads = threads})
        .replay_sample("000000", [&](const LayerResult& r) { out.push_back(r); });
    return out;
  };
  auto one = run(policies, 1), four = run(policies, 4);
  // One policy on four threads: its output errors are batched by KV head on several threads.
  const std::vector<PolicyConfig> h2o_alone = {policies[2]};
  for (auto& r : run(h2o_alone, 1)) one.push_back(r);
  for (auto& r : run(h2o_alone, 4)) four.push_back(r);
  ASSERT_EQ(one.size(), four.size());
  for (std::size_t i = 0; i < one.size(); ++i) {
    EXPECT_EQ(one[i].policy_index, four[i].policy_index);
    for (std::size_t g = 0; g < one[i].steps.size(); ++g)
      for (std::size_t t = 0; t < one[i].steps[g].size(); ++t) {
        const auto &a = one[i].steps[g][t], &b = four[i].steps[g][t];
        EXPECT_EQ(std::memcmp(&a.mass_recall, &b.mass_recall, 4), 0);
        EXPECT_EQ(std::memcmp(&a.output_rel_error, &b.output_rel_error, 4), 0);
        EXPECT_EQ(std::memcmp(&a.output_value_error, &b.output_value_error, 4), 0);
      }
    expect_same(one[i], four[i], 0, "threads");
  }
}

TEST(Engine, MergedAndParkedEntriesByHand) {
  // P = 3, G = 1, w = [1, 4, 2 | 1], v = [2, 6, 10, 4]. Entry 1 merges into 0: key ln 2 (mean of
  // ln 1 and ln 4), value 4; position 2 is parked. Step 0 attends {0 (merged), 3} with weights
  // 2 and 1: ô = (2*4 + 1*4)/3 = 4. Full: weights [1 4 2 1]/8, o = (2 + 24 + 20 + 4)/8 = 6.25.
  // Recall counts the attended positions 0 and 3: (1 + 1)/8.
  TinyTrace t{.prompt_len = 3, .weights = {1, 4, 2, 1}, .values = {2, 6, 10, 4}};
  const auto r = run_policy(t.write("merge.h5"), "test_merge_park", {});
  const auto& m = r[0].steps[0][0];
  EXPECT_EQ(m.cache_size, 3);
  EXPECT_EQ(m.attended_size, 2);
  EXPECT_NEAR(m.mass_recall, 0.25, 1e-6);
  EXPECT_NEAR(m.output_rel_error, (6.25 - 4) / 6.25, 1e-5);
  ASSERT_EQ(r[0].merged[0].size(), 1u);
  EXPECT_EQ(r[0].merged[0][0].step, -1);
  EXPECT_EQ(r[0].merged[0][0].position, 1);
  EXPECT_EQ(r[0].merged[0][0].into_position, 0);
  EXPECT_TRUE(r[0].evicted[0].empty());
}

TEST(Engine, BatchedOutputErrorsByHand) {
  // The H2O case of DiagnosticsByHand with values v = [1 2 3 4 5 6] (d = 1), B = 2.
  // Step 0: p = [4 1 2 1 1] / 9, o = 21 / 9; h2o attends {0 3 4}, three of five, so the GEMM gets
  // the two missing positions: ô = (o - (1·2 + 2·3) / 9) / (1 - 3 / 9) = 13 / 6.
  // Step 1: p = [4 1 2 1 1 1] / 10, o = 27 / 10; it attends {0 4 5}, three of six, so the GEMM
  // gets the attended ones: ô = (4·1 + 5 + 6) / 6 = 5 / 2. Every v_j > 0, so Σ p|v| = o and both
  // errors agree. `full` attends everything: its error is exactly 0, without a GEMM.
  TinyTrace t{.prompt_len = 4, .weights = {4, 1, 2, 1, 1, 1}, .values = {1, 2, 3, 4, 5, 6}};
  const std::string path = t.write("batched_output.h5");
  const auto h2o = run_policy(path, "h2o", {{"budget", "2"}})[0].steps[0];
  EXPECT_EQ(h2o[0].attended_size, 3);
  EXPECT_NEAR(h2o[0].output_rel_error, (21.0 / 9 - 13.0 / 6) / (21.0 / 9), 1e-6);
  EXPECT_NEAR(h2o[0].output_value_error, (21.0 / 9 - 13.0 / 6) / (21.0 / 9), 1e-6);
  EXPECT_NEAR(h2o[1].output_rel_error, (2.7 - 2.5) / 2.7, 1e-6);
  EXPECT_NEAR(h2o[1].output_value_error, (2.7 - 2.5) / 2.7, 1e-6);
  const auto full = run_policy(path, "full", {});
  for (const auto& m : full[0].steps[0]) {
    EXPECT_EQ(m.output_rel_error, 0.0f);
    EXPECT_EQ(m.mass_recall, 1.0f);
  }
}

TEST(Engine, PoliciesThatIgnoreTheStepAttentionNeverFillIt) {
  // StepAttention::head fills a KV head's row on its first read and only then.
  StepAttention sa;
  sa.group = 1;
  sa.probs.resize(2);
  sa.filled.assign(2, 0);
  int calls = 0;
  sa.fill = [&](int g, std::vector<float>& p) {
    ++calls;
    p.assign(3, static_cast<float>(g + 1));
  };
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(sa.head(1, 0, 3)[2], 2.0f);
  EXPECT_EQ(sa.head(1, 0, 3)[0], 2.0f);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(sa.head(0, 0, 3)[1], 1.0f);
  EXPECT_EQ(calls, 2);
}

// Samples side by side (replay_samples with several threads) deliver what one after the other
// delivers: the same (sample, layer, policy) sequence with the same bytes, and, when a sample's
// layer is bad, the layers before it and then its error.
TEST(Engine, SamplesSideBySideDeliverInSampleOrder) {
  SynthConfig c;
  c.layers = 3;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 16;
  c.samples = 5;
  c.media_tokens = 30;
  c.gen_tokens = 8;
  c.write.dtype = DType::kFloat32;
  const std::string path = temp_path("side_by_side.h5");
  synth_write(c, path);
  const std::vector<PolicyConfig> policies = {make_policy_config("h2o", {{"budget", "40%"}}),
                                              make_policy_config("tova", {{"budget", "40%"}})};
  struct Seen {
    std::vector<std::string> order;  // "sample/layer/policy"
    std::vector<float> recall;
    std::string error;
    int layers = 0;
  };
  auto run = [&](int threads) {
    TraceReader reader(path);
    Replayer replayer(reader, policies, {.threads = threads});
    Seen seen;
    try {
      replayer.replay_samples(
          reader.sample_names(),
          [&](const LayerResult& r) {
            seen.order.push_back(r.sample + "/" + std::to_string(r.layer) + "/" +
                                 std::to_string(r.policy_index));
            for (const auto& head : r.steps)
              for (const auto& m : head) seen.recall.push_back(m.mass_recall);
          },
          [&](int) { ++seen.layers; });
    } catch (const TraceError& e) {
      seen.error = e.what();
    }
    return seen;
  };
  const Seen serial = run(1);
  EXPECT_EQ(serial.order.size(), 5u * 3 * 2);
  EXPECT_EQ(serial.order.front(), "000000/0/0");
  EXPECT_EQ(serial.order.back(), "000004/2/1");
  for (int threads : {2, 3, 8}) {
    const Seen side = run(threads);
    EXPECT_EQ(side.order, serial.order) << threads;
    ASSERT_EQ(side.recall.size(), serial.recall.size());
    EXPECT_EQ(std::memcmp(side.recall.data(), serial.recall.data(), 4 * side.recall.size()), 0);
    EXPECT_EQ(side.layers, 15) << threads;
  }
  {  // a NaN in layer 1 of sample 2
    silence_hdf5_errors();
    H5Handle f(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    H5Handle d(H5Dopen2(f.get(), "samples/000002/layers/1/q", H5P_DEFAULT));
    const auto shape = h5_dataset_shape(d.get());
    std::vector<float> q(shape[0] * shape[1] * shape[2]);
    ASSERT_GE(H5Dread(d.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, q.data()), 0);
    q[5] = NAN;
    ASSERT_GE(H5Dwrite(d.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, q.data()), 0);
  }
  const Seen bad_serial = run(1);
  EXPECT_NE(bad_serial.error.find("sample '000002', dataset 'layers/1/q': NaN"), std::string::npos)
      << bad_serial.error;
  // Samples 0 and 1 whole, then layer 0 of sample 2.
  EXPECT_EQ(bad_serial.order.size(), 2u * 3 * 2 + 2);
  EXPECT_EQ(bad_serial.order.back(), "000002/0/1");
  for (int threads : {2, 3}) {
    const Seen bad = run(threads);
    EXPECT_EQ(bad.order, bad_serial.order) << threads;
    EXPECT_EQ(bad.error, bad_serial.error) << threads;
  }
}

TEST(Engine, ABadLayerStopsThePipelineAfterTheLayersBeforeIt) {
  // Layer 2 of 4 gets a NaN query. Serial or pipelined, the layers before it are delivered in
  // full and in order, then the replay throws the reader's error; nothing hangs.
  TinyTrace t{
      .prompt_len = 4, .weights = {1, 2, 3, 4, 5, 6}, .values = {1, 2, 3, 4, 5, 6}, .layers = 4};
  const std::string path = t.write("pipeline_nan.h5");
  {
    silence_hdf5_errors();
    H5Handle f(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    H5Handle d(H5Dopen2(f.get(), "samples/s0/layers/2/q", H5P_DEFAULT));
    std::vector<float> q(6, 1.0f);
    q[3] = NAN;
    ASSERT_GE(H5Dwrite(d.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, q.data()), 0);
  }
  TraceReader reader(path);
  const std::vector<PolicyConfig> policies = {make_policy_config("h2o", {{"budget", "2"}}),
                                              make_policy_config("full", {})};
  for (const int threads : {1, 2, 4}) {
    std::vector<std::pair<int, int>> seen;  // (layer, policy) in delivery order
    std::vector<int> layers_done;
    Replayer replayer(reader, policies, {.threads = threads});
    try {
      replayer.replay_sample(
          "s0", [&](const LayerResult& r) { seen.emplace_back(r.layer, r.policy_index); },
          [&](int l) { layers_done.push_back(l); });
      ADD_FAILURE() << "no error with " << threads << " threads";
    } catch (const TraceError& e) {
      EXPECT_NE(std::string(e.what()).find("layers/2/q"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("NaN at [token 3"), std::string::npos) << e.what();
    }
    EXPECT_EQ(seen, (std::vector<std::pair<int, int>>{{0, 0}, {0, 1}, {1, 0}, {1, 1}}))
        << threads << " threads";
    EXPECT_EQ(layers_done, (std::vector<int>{0, 1})) << threads << " threads";
  }
}

TEST(Engine, OnlyLookaheadPoliciesSeeTheFuture) {
  const std::string path = small_synthetic_trace("lookahead.h5", 1);
  TraceReader reader(path);
  const SampleInfo s = reader.read_sample("000000");
  const LayerAttention att(reader.info(), s, reader.read_layer(s, 0), {}, 1);
  EXPECT_THROW(LayerView(att, false).future_decode_probs(3, 0), std::logic_error);
  EXPECT_NO_THROW(LayerView(att, true).future_decode_probs(3, 0));
  EXPECT_THROW(LayerView(att, false).future_gen_len(), std::logic_error);
  EXPECT_EQ(LayerView(att, true).future_gen_len(), s.gen_len);
}

TEST(Engine, AViewShowsOnlyThePositionsThatExist) {
  // At the prefill the P prompt positions exist; at decode step t, positions <= P + t. q, k, v and
  // decode attention past that throw for a causal policy and not for a lookahead one.
  const std::string path = small_synthetic_trace("horizon.h5", 1);
  TraceReader reader(path);
  const SampleInfo s = reader.read_sample("000000");
  const LayerAttention att(reader.info(), s, reader.read_layer(s, 0), {}, 1);
  const int P = s.prompt_len;
  LayerView view(att, false);
  EXPECT_EQ(view.visible_len(), P);
  EXPECT_NO_THROW(view.key(P - 1, 0));
  EXPECT_THROW(view.key(P, 0), std::logic_error);
  EXPECT_THROW(view.value(P, 1), std::logic_error);
  EXPECT_THROW(view.query(P, 0), std::logic_error);
  EXPECT_THROW(view.decode_probs(0, 0), std::logic_error);
  view.set_horizon(P + 3);  // decode step 2
  EXPECT_NO_THROW(view.key(P + 2, 0));
  EXPECT_NO_THROW(view.decode_probs(2, 0));
  EXPECT_THROW(view.key(P + 3, 0), std::logic_error);
  EXPECT_THROW(view.decode_probs(3, 0), std::logic_error);
  EXPECT_EQ(view.causal().visible_len(), P + 3);
  EXPECT_NO_THROW(LayerView(att, true).key(P + 5, 0));
  // The modality is positional too: its size is what exists, not the generation's length.
  LayerView at_prefill(att, false);
  EXPECT_EQ(at_prefill.modality().size(), P);
  EXPECT_EQ(at_prefill.modality()[P - 1], s.modality[P - 1]);
  EXPECT_THROW(at_prefill.modality()[P], std::logic_error);
  EXPECT_EQ(view.modality().size(), P + 3);
  EXPECT_THROW(view.modality()[P + 3], std::logic_error);
  EXPECT_EQ(LayerView(att, true).modality().size(), P + s.gen_len);
  // What a policy is created with: the prompt, not the generation.
  const SampleInfo known = known_before_decoding(s);
  EXPECT_EQ(known.gen_len, 0);
  EXPECT_EQ(known.prompt_len, P);
  EXPECT_EQ(known.modality.size(), static_cast<std::size_t>(P));
  EXPECT_EQ(known.segment.size(), static_cast<std::size_t>(P));
  EXPECT_TRUE(std::equal(known.modality.begin(), known.modality.end(), s.modality.begin()));
}

TEST(Engine, DecisionDumpLayout) {
  TinyTrace t{.prompt_len = 4, .weights = {4, 1, 2, 1, 1, 1}, .values = {1, 2, 3, 4, 5, 6}};
  const std::string trace = t.write("dump_trace.h5");
  const std::string dump = temp_path("decisions.h5");
  TraceReader reader(trace);
  const std::vector<PolicyConfig> policies = {make_policy_config("h2o", {{"budget", "2"}}),
                                              make_policy_config("test_merge_park", {})};
  {
    DecisionWriter w(dump, policies);
    Replayer(reader, policies, {}).replay_sample("s0", [&](const LayerResult& r) { w.write(r); });
    w.close();
  }
  H5Handle f(H5Fopen(dump.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  H5Handle g(H5Gopen2(f.get(), "h2o", H5P_DEFAULT));
  EXPECT_EQ(
      h5_read_string_attr(g.get(), "params").value(),
      "budget=2,budget_rounding=ceil,caches=kv_head,merge=none,mode=cumulative,normalize=none,"
      "question=compress,"
      "recent=50%");
  std::vector<hsize_t> shape;
  // The H2O case of test_policies: 1, 2 at the prefill, 3 after step 0, 4 after step 1.
  EXPECT_EQ(read_ints(f.get(), "h2o/samples/s0/layers/0/heads/0/evicted", shape),
            (std::vector<std::int32_t>{-1, 1, -1, 2, 0, 3, 1, 4}));
  EXPECT_EQ(shape, (std::vector<hsize_t>{4, 2}));
  EXPECT_FALSE(h5_path_exists(f.get(), "h2o/samples/s0/layers/0/heads/0/merged"));
  EXPECT_EQ(read_ints(f.get(), "test_merge_park/samples/s0/layers/0/heads/0/merged", shape),
            (std::vector<std::int32_t>{-1, 1, 0}));
  EXPECT_EQ(read_ints(f.get(), "test_merge_park/samples/s0/layers/0/heads/0/evicted", shape).size(),
            0u);
  EXPECT_EQ(shape, (std::vector<hsize_t>{0, 2}));
}

}  // namespace
}  // namespace kvsim::test

namespace kvsim::test {
namespace {

TEST(Engine, EveryPolicyKeepsItsLogsConsistent) {
  // For every registered policy on a GQA synthetic trace: no position is evicted or merged twice,
  // an evicted position never attends again (the cache only ever appends new positions), and
  // cache sizes account for every prompt and generated position.
  const std::string path = small_synthetic_trace("logs.h5", 4);
  for (const auto& name : PolicyRegistry::instance().names()) {
    const PolicyInfo& info = PolicyRegistry::instance().get(name);
    std::map<std::string, std::string> params;
    for (const auto& spec : info.params) {
      if (spec.name == "budget") params["budget"] = "24";
      if (spec.name == "window") params["window"] = "8";
    }
    for (const auto& r : run_policy(path, name, params)) {
      for (std::size_t g = 0; g < r.evicted.size(); ++g) {
        std::set<int> gone;
        for (const auto& e : r.evicted[g]) EXPECT_TRUE(gone.insert(e.position).second) << name;
        for (const auto& m : r.merged[g]) EXPECT_TRUE(gone.insert(m.position).second) << name;
        const int G = static_cast<int>(r.steps[g].size());
        for (int t = 0; t < G; ++t) {
          int gone_before = 0;  // removed before step t attended
          for (const auto& e : r.evicted[g]) gone_before += e.step < t;
          for (const auto& m : r.merged[g]) gone_before += m.step < t;
          EXPECT_EQ(r.steps[g][t].cache_size, r.steps[g][t].position + 1 - gone_before) << name;
          EXPECT_LE(r.steps[g][t].attended_size, r.steps[g][t].cache_size) << name;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvsim::test

namespace kvsim::test {
namespace {

TEST(Engine, DiagnosticsByHand) {
  // The H2O case (P = 4, w = [4 1 2 1 | 1 1], B = 2) with `oracle` at the same budget.
  // Step 0: full-cache [4 1 2 1 1] / 9, ranked 0, 2, 4, 3, 1 (ties to the newer); h2o stores
  // {0 3 4}. Top 10% = ceil(.5) = 1 key {0}: hit 1, no miss. 90% of the mass needs all 5 keys:
  // 3 of them stored, .6. Evicted: 1 and 2, 3 / 9. Step 1: [4 1 2 1 1 1] / 10, h2o stores
  // {0 4 5}: hits 1 and 3 / 5 again, evicted 1 + 2 + 1 = .4, cumulative 1/3 + .4.
  // The oracle keeps {0 2} (future mass .844, .422), so at step 0 it recalls 7 / 9 vs h2o's 6 / 9.
  TinyTrace t{.prompt_len = 4, .weights = {4, 1, 2, 1, 1, 1}};
  TraceReader reader(t.write("diagnostics.h5"));
  const std::vector<PolicyConfig> policies = {make_policy_config("h2o", {{"budget", "2"}}),
                                              make_policy_config("oracle", {{"budget", "2"}})};
  std::vector<LayerResult> out;
  Replayer(reader, policies, {.threads = 1, .metrics = {"diagnostics"}})
      .replay_sample("s0", [&](const LayerResult& r) { out.push_back(r); });
  const auto h2o = [&](const char* column, int step) {
    return observed_value(out[0], column, 0, step);
  };
  EXPECT_FLOAT_EQ(h2o("hit_rate_top10", 0), 1.0f);
  EXPECT_EQ(h2o("misses_top10", 0), 0);
  EXPECT_NEAR(h2o("hit_rate_mass90", 0), 0.6, 1e-6);
  EXPECT_NEAR(h2o("evicted_mass", 0), 3.0 / 9, 1e-6);
  EXPECT_NEAR(h2o("hit_rate_mass90", 1), 0.6, 1e-6);
  EXPECT_NEAR(h2o("evicted_mass", 1), 0.4, 1e-6);
  EXPECT_NEAR(h2o("cumulative_evicted_mass", 1), 1.0 / 3 + 0.4, 1e-6);
  EXPECT_NEAR(h2o("regret", 0), 7.0 / 9 - 6.0 / 9, 1e-6);
  EXPECT_FLOAT_EQ(observed_value(out[1], "regret", 0, 0), 0.0f);
  // Without --diagnostics the columns stay empty.
  const auto plain = run_policy(reader.path(), "h2o", {{"budget", "2"}});
  EXPECT_TRUE(std::isnan(observed_value(plain[0], "hit_rate_top10", 0, 0)));
  EXPECT_TRUE(std::isnan(observed_value(plain[0], "regret", 0, 0)));
}

TEST(Engine, RegretReferencesDeclareThemselves) {
  // The engine finds the regret reference by what a policy declares at registration, not by its
  // name: the oracle registered again under another name serves alike, and a policy without the
  // declaration (here h2o twice) gives no regret.
  PolicyConfig hindsight = make_policy_config("oracle", {{"budget", "2"}});
  PolicyInfo renamed = *hindsight.info;
  renamed.name = hindsight.label = "hindsight";
  hindsight.info = &renamed;
  TinyTrace t{.prompt_len = 4, .weights = {4, 1, 2, 1, 1, 1}};
  TraceReader reader(t.write("regret_reference.h5"));
  std::vector<LayerResult> out;
  Replayer(reader, {make_policy_config("h2o", {{"budget", "2"}}), hindsight},
           {.threads = 1, .metrics = {"diagnostics"}})
      .replay_sample("s0", [&](const LayerResult& r) { out.push_back(r); });
  EXPECT_NEAR(observed_value(out[0], "regret", 0, 0), 7.0 / 9 - 6.0 / 9,
              1e-6);  // as in DiagnosticsByHand
  out.clear();
  Replayer(reader,
           {make_policy_config("h2o", {{"budget", "2"}}),
            make_policy_config("h2o:paper", {{"budget", "2"}})},
           {.threads = 1, .metrics = {"diagnostics"}})
      .replay_sample("s0", [&](const LayerResult& r) { out.push_back(r); });
  EXPECT_TRUE(std::isnan(observed_value(out[0], "regret", 0, 0)));
  EXPECT_TRUE(PolicyRegistry::instance().get("full").keeps_everything);
  for (const auto& name : PolicyRegistry::instance().names()) {
    if (name == "full") continue;
    EXPECT_FALSE(PolicyRegistry::instance().get(name).keeps_everything) << name;
  }
}

// Test-only policy offering every switch but `compress` (which a policy implements itself): at the
// prefill each KV head keeps its first `budget` positions; it never evicts while decoding (its
// `decode` mode may).
class KeepFirst final : public Policy {
 public:
  explicit KeepFirst(int budget) : budget_(budget) {}
  void on_prefill(const LayerView&, KvCache& cache) override {
    cache.evict_positions_if([&](int pos) { return pos >= budget_; });
  }
  void on_decode(const LayerView&, const StepAttention&, KvCache&) override {}

 private:
  int budget_;
};

const PolicyRegistration switches_reg({
    .name = "test_offers_switches",
    .summary = "test only",
    .provenance = "tests",
    .params = {budget_param("3")},
    .switches = {.decode = true, .caches = true, .question = true},
    .create = [](const ParamSet& p, const SampleInfo& s) -> std::unique_ptr<Policy> {
      return std::make_unique<KeepFirst>(resolve_budget(p, s.prompt_len, "test_offers_switches"));
    },
});

TEST(Engine, SwitchesAreOfferedAtRegistrationNotNamed) {
  // The registry appends the offered switches' parameters after the policy's own.
  std::vector<std::string> names;
  for (const ParamSpec& s : PolicyRegistry::instance().get("test_offers_switches").params)
    names.push_back(s.name);
  EXPECT_EQ(names, (std::vector<std::string>{"budget", "decode", "caches", "question"}));
  // What the engine reads comes from the switches' values.
  EXPECT_FALSE(make_policy_config("test_offers_switches", {}).query_head_caches());
  EXPECT_TRUE(
      make_policy_config("test_offers_switches", {{"caches", "query_head"}}).query_head_caches());
  EXPECT_TRUE(
      make_policy_config("test_offers_switches", {{"question", "append"}}).appends_question());
  // `decode` is implemented by the registry's wrapper: grow appends every token, cap holds what
  // the prefill kept (3 entries, and the step's own token while it attends).
  const std::string trace = small_synthetic_trace("offers_switches.h5", 1);
  for (const auto& [mode, held] : {std::pair{"grow", 0}, std::pair{"cap", 4}}) {
    const auto out = run_policy(trace, "test_offers_switches", {{"decode", mode}});
    const auto& steps = out.at(0).steps.at(0);
    for (std::size_t t = 0; t < steps.size(); ++t)
      EXPECT_EQ(steps[t].cache_size, held ? held : 4 + static_cast<int>(t)) << mode << " " << t;
  }
  // Equal memory turns every offered switch to the reading that holds the least.
  PolicyConfig roomy =
      make_policy_config("test_offers_switches",
                         {{"decode", "grow"}, {"caches", "query_head"}, {"question", "append"}});
  EXPECT_EQ(equal_memory_overrides(roomy),
            (std::map<std::string, std::string>{
                {"caches", "kv_head"}, {"decode", "cap"}, {"question", "compress"}}));
  // A policy may not take a switch's name for a parameter of its own (the engine would read it).
  PolicyInfo impostor = PolicyRegistry::instance().get("test_offers_switches");
  impostor.name = "test_impostor";
  impostor.switches = {};
  impostor.params = {caches_param()};
  try {
    PolicyRegistry::instance().add(impostor);
    ADD_FAILURE() << "a parameter named like a switch was registered";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(),
                 "policy 'test_impostor' declares a parameter 'caches', the name of a switch the "
                 "registry adds: offer the switch (PolicyInfo::switches) or name the parameter "
                 "otherwise");
  }
  EXPECT_THROW(PolicyRegistry::instance().get("test_impostor"), std::invalid_argument);
}

}  // namespace
}  // namespace kvsim::test
