// `caches = query_head`: a policy that keeps one cache per query head (the original SnapKV, Ada-KV
// and KVCache-Factory on GQA models, after repeat_kv) replays exactly as the same policy with one
// cache per KV head on a trace whose K and V were repeated per query head, written out here.
#include <gtest/gtest.h>

#include <algorithm>

#include "tests/replay_helpers.hpp"
#include "tests/tiny_trace.hpp"
#include "traces/kvtrace_writer.hpp"

namespace kvsim::test {
namespace {

// The GQA trace at `path` rewritten with Hkv = H: KV head g's rows copied to query heads
// g·group .. g·group + group - 1.
std::string write_repeated(const std::string& path, const std::string& name) {
  const TraceReader reader(path);
  TraceInfo info = reader.info();
  const int group = info.num_heads / info.num_kv_heads;
  info.num_kv_heads = info.num_heads;
  const std::string out = temp_path(name);
  TraceWriter writer(out, info, WriteOptions{.dtype = DType::kFloat32});
  for (const auto& s : reader.sample_names()) {
    const SampleInfo sample = reader.read_sample(s);
    writer.write_sample(sample);
    for (int l = 0; l < info.num_layers; ++l) {
      const LayerTensors t = reader.read_layer(sample, l);
      LayerTensors r{l, t.q,
                     xt::zeros<float>({t.k.shape(0), std::size_t(info.num_heads), t.k.shape(2)}),
                     xt::zeros<float>({t.v.shape(0), std::size_t(info.num_heads), t.v.shape(2)})};
      for (std::size_t i = 0; i < t.k.shape(0); ++i)
        for (int h = 0; h < info.num_heads; ++h)
          for (std::size_t c = 0; c < t.k.shape(2); ++c) {
            r.k(i, h, c) = t.k(i, h / group, c);
            r.v(i, h, c) = t.v(i, h / group, c);
          }
      writer.write_layer(sample, r);
    }
  }
  writer.close();
  return out;
}

void expect_same(const std::vector<LayerResult>& a, const std::vector<LayerResult>& b,
                 const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (std::size_t l = 0; l < a.size(); ++l) {
    ASSERT_EQ(a[l].steps.size(), b[l].steps.size()) << what;
    for (std::size_t h = 0; h < a[l].steps.size(); ++h) {
      ASSERT_EQ(a[l].evicted[h].size(), b[l].evicted[h].size()) << what;
      for (std::size_t e = 0; e < a[l].evicted[h].size(); ++e)
        EXPECT_EQ(a[l].evicted[h][e].position, b[l].evicted[h][e].position) << what;
      for (std::size_t t = 0; t < a[l].steps[h].size(); ++t) {
        const StepMetrics &x = a[l].steps[h][t], &y = b[l].steps[h][t];
        EXPECT_EQ(x.cache_size, y.cache_size) << what;
        EXPECT_EQ(x.kv_bytes, y.kv_bytes) << what;
        EXPECT_EQ(x.mass_recall, y.mass_recall) << what << " layer " << l << " head " << h;
        EXPECT_EQ(x.output_rel_error, y.output_rel_error) << what;
      }
    }
  }
}

TEST(QueryHeadCaches, ReplayAsTheTraceWithKAndVRepeated) {
  const std::string gqa = small_synthetic_trace("qhc_gqa.h5", 2, true, 4, 2);
  const std::string repeated = write_repeated(gqa, "qhc_repeated.h5");
  const std::vector<std::pair<std::string, std::map<std::string, std::string>>> runs = {
      {"snapkv", {{"budget", "20"}, {"window", "8"}}},
      {"h2o", {{"budget", "20"}}},
      {"adakv", {{"budget", "20"}, {"window", "8"}}},
      {"pyramidkv", {{"budget", "20"}, {"window", "8"}}},
      {"streamingllm", {{"budget", "20"}}}};
  for (auto [policy, params] : runs) {
    const auto on_repeated = run_policy(repeated, policy, params);
    params["caches"] = "query_head";
    const auto per_query_head = run_policy(gqa, policy, params);
    ASSERT_EQ(per_query_head[0].steps.size(), 4u) << policy;  // a cache per query head
    expect_same(per_query_head, on_repeated, policy);
  }
}

TEST(QueryHeadCaches, HoldGroupSizeTimesTheMemory) {
  const std::string gqa = small_synthetic_trace("qhc_memory.h5", 2, true, 4, 2);
  auto bytes = [&](const std::string& caches) {
    std::int64_t total = 0;
    for (const auto& r :
         run_policy(gqa, "snapkv", {{"budget", "20"}, {"window", "8"}, {"caches", caches}}))
      for (const auto& head : r.steps) total += head.back().kv_bytes;
    return total;
  };
  EXPECT_EQ(bytes("query_head"), 2 * bytes("kv_head"));
}

TEST(QueryHeadCaches, AreTheKVHeadCachesOnAMultiHeadTrace) {
  const std::string mha = small_synthetic_trace("qhc_mha.h5", 2, true, 4, 4);
  const std::map<std::string, std::string> p = {{"budget", "20"}, {"window", "8"}};
  auto q = p;
  q["caches"] = "query_head";
  expect_same(run_policy(mha, "snapkv", q), run_policy(mha, "snapkv", p), "snapkv on MHA");
}

}  // namespace
}  // namespace kvsim::test
