// The CUDA backend against the CPU reference, operation by operation and end to end. Every test
// skips when kvsim was built without CUDA or no device is visible.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "sim/live/evaluate.hpp"
#include "tests/tiny_trace.hpp"

namespace kvsim::test {
namespace {

using live::Backend;

class GpuVsCpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!live::cuda_available()) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
    gpu = live::make_cuda_backend();
    cpu = live::make_cpu_backend();
  }
  std::vector<float> random(std::size_t n, float scale = 1.0f) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> x(n);
    for (auto& v : x) v = d(rng);
    return x;
  }
  // The same host data in both backends.
  std::pair<float*, float*> both(const std::vector<float>& host) {
    float* c = cpu->alloc(host.size());
    float* g = gpu->alloc(host.size());
    cpu->upload(c, host.data(), host.size());
    gpu->upload(g, host.data(), host.size());
    owned.push_back({c, g});
    return {c, g};
  }
  void expect_close(std::pair<float*, float*> p, std::size_t n, double tol, const char* what) {
    std::vector<float> c(n), g(n);
    cpu->download(c.data(), p.first, n);
    gpu->download(g.data(), p.second, n);
    double diff = 0, scale = 1e-30;
    for (std::size_t i = 0; i < n; ++i)
      diff = std::max(diff, static_cast<double>(std::abs(c[i] - g[i]))),
      scale = std::max(scale, static_cast<double>(std::abs(c[i])));
    EXPECT_LE(diff / scale, tol) << what;  // <=: tol 0 asks for an exact copy (embed)
  }
  void TearDown() override {
    for (auto [c, g] : owned) cpu->release(c), gpu->release(g);
  }
  std::mt19937 rng{11};
  std::unique_ptr<Backend> gpu, cpu;
  std::vector<std::pair<float*, float*>> owned;
};

TEST_F(GpuVsCpu, ElementwiseAndNormKernels) {
  const int rows = 5, dim = 96, heads = 3, d = 32;
  auto x = both(random(rows * dim)), w = both(random(dim)), out = both(random(rows * dim));
  cpu->rms_norm(x.first, w.first, rows, dim, 1e-6f, out.first);
  gpu->rms_norm(x.second, w.second, rows, dim, 1e-6f, out.second);
  expect_close(out, rows * dim, 1e-5, "rms_norm");
  auto y = both(random(rows * dim));
  cpu->swiglu(x.first, y.first, rows * dim, out.first);
  gpu->swiglu(x.second, y.second, rows * dim, out.second);
  expect_close(out, rows * dim, 1e-5, "swiglu");
  cpu->add(x.first, y.first, rows * dim);
  gpu->add(x.second, y.second, rows * dim);
  expect_close(x, rows * dim, 1e-6, "add");
  std::vector<std::int32_t> pos = {0, 7, 100, 4095, 16000};
  std::vector<float> inv(d / 2);
  for (int i = 0; i < d / 2; ++i) inv[i] = std::pow(10000.0f, -2.0f * i / d);
  cpu->rope(x.first, rows, heads, d, pos.data(), 1, nullptr, inv.data());
  gpu->rope(x.second, rows, heads, d, pos.data(), 1, nullptr, inv.data());
  expect_close(x, rows * heads * d, 1e-4, "rope");
  // M-RoPE: three ids per row, frequencies split 4 / 6 / 6 over them (Qwen2-VL's layout).
  std::vector<std::int32_t> pos3 = {0, 0, 0, 5, 1, 2, 5, 3, 9, 40, 40, 40, 7000, 12, 31};
  std::vector<std::int32_t> axis(d / 2);
  for (int i = 0; i < d / 2; ++i) axis[i] = i < 4 ? 0 : i < 10 ? 1 : 2;
  cpu->rope(x.first, rows, heads, d, pos3.data(), 3, axis.data(), inv.data());
  gpu->rope(x.second, rows, heads, d, pos3.data(), 3, axis.data(), inv.data());
  expect_close(x, rows * heads * d, 1e-4, "rope (M-RoPE)");
  std::vector<std::int32_t> ids = {3, 0, 3, 1, 2};
  auto table = both(random(4 * dim));
  cpu->embed(table.first, ids.data(), rows, dim, out.first);
  gpu->embed(table.second, ids.data(), rows, dim, out.second);
  expect_close(out, rows * dim, 0, "embed");
}

TEST_F(GpuVsCpu, LinearWithBias) {
  const int rows = 7, k = 64, n = 40;
  auto x = both(random(rows * k)), w = both(random(n * k)), b = both(random(n)),
       y = both(random(rows * n));
  for (int r : {1, rows}) {
    cpu->linear(x.first, r, k, w.first, n, b.first, y.first);
    gpu->linear(x.second, r, k, w.second, n, b.second, y.second);
    expect_close(y, r * n, 1e-5, "linear");
  }
}

TEST_F(GpuVsCpu, CausalAttention) {
  const int P = 300, H = 8, Hkv = 2, d = 64;
  auto q = both(random(P * H * d)), k = both(random(P * Hkv * d)), v = both(random(P * Hkv * d)),
       o = both(random(P * H * d));
  cpu->causal_attention(q.first, k.first, v.first, P, H, Hkv, d, 0.125f, o.first);
  gpu->causal_attention(q.second, k.second, v.second, P, H, Hkv, d, 0.125f, o.second);
  expect_close(o, P * H * d, 1e-4, "causal_attention");
}

// Varying lengths per KV head, compaction, a merged row, a stored-but-unattended row, and a
// cache split over many decode chunks (32 to 256 rows each).
TEST_F(GpuVsCpu, DecodeAttentionOverACompactedCache) {
  const int L = 2, Hkv = 4, H = 16, d = 128, P = 700, cap = P + 4;
  const std::vector<float> k = random(P * Hkv * d), v = random(P * Hkv * d);
  for (Backend* b : {cpu.get(), gpu.get()}) {
    b->cache_reset(L, Hkv, d, cap);
    for (int l = 0; l < L; ++l)
      for (int g = 0; g < Hkv; ++g) b->cache_assign(l, g, &k[g * d], &v[g * d], P, Hkv * d);
  }
  auto newk = both(random(Hkv * d)), newv = both(random(Hkv * d)), q = both(random(H * d)),
       out = both(random(H * d));
  std::vector<int> keep;
  for (int e = 0; e < P; e += 3) keep.push_back(e);
  const std::vector<float> merged_k = random(d), merged_v = random(d);
  for (int pass = 0; pass < 2; ++pass) {
    Backend* b = pass ? gpu.get() : cpu.get();
    const float* nk = pass ? newk.second : newk.first;
    const float* nv = pass ? newv.second : newv.first;
    b->cache_keep(1, 1, keep);
    b->cache_keep(1, 2, {0, 5, 699});
    b->cache_write(1, 1, 4, merged_k.data(), merged_v.data());
    for (int g = 0; g < Hkv; ++g) b->cache_append(1, g, nk + g * d, nv + g * d);
  }
  std::vector<std::vector<std::uint8_t>> mask(Hkv);
  mask[3].assign(P + 1, 1);
  mask[3][10] = 0;
  std::vector<std::vector<float>> pc, pg;
  cpu->decode_attention(1, q.first, H, 0.088f, mask, out.first, pc);
  gpu->decode_attention(1, q.second, H, 0.088f, mask, out.second, pg);
  expect_close(out, H * d, 1e-4, "decode output");
  for (int g = 0; g < Hkv; ++g) {
    ASSERT_EQ(pc[g].size(), pg[g].size()) << g;
    EXPECT_EQ(gpu->cache_rows(1, g), cpu->cache_rows(1, g));
    for (std::size_t i = 0; i < pc[g].size(); ++i)
      ASSERT_NEAR(pc[g][i], pg[g][i], 1e-5 + 1e-4 * pc[g][i]) << g << " " << i;
  }
  EXPECT_EQ(pg[3][10], 0.0f);
  std::vector<float> rk(d), rv(d);
  gpu->cache_read(1, 1, 4, rk.data(), rv.data());
  EXPECT_EQ(rk, merged_k);
}

TEST(GpuLive, CudaModelMatchesCpuModelInTheLoop) {
  // The checkpoint and the CPU half run everywhere, so the test's own setup is checked without a
  // device (it once lacked max_position_embeddings, found only on the first GPU run).
  live::ModelConfig c;
  c.model_type = "qwen2";
  c.hidden_size = 128, c.intermediate_size = 256, c.num_hidden_layers = 3;
  c.num_attention_heads = 8, c.num_key_value_heads = 2, c.head_dim = 16, c.vocab_size = 300;
  c.qkv_bias = true;
  c.max_position_embeddings = 4096;  // the loader requires it, as in every real config.json
  const std::string dir = temp_path("gpu_model");
  std::filesystem::remove_all(dir);
  live::write_random_checkpoint(dir, c, live::WeightDType::kBFloat16, 1, 5, 0.1);
  const live::Checkpoint ck = live::load_checkpoint(dir);
  auto cpu = live::make_cpu_backend();
  live::Model mc(ck, *cpu);
  live::LiveEngine ec(mc, 1);
  PromptSample prompt;
  prompt.info.name = "p";
  prompt.info.prompt_len = 96;
  for (int i = 0; i < 96; ++i) {
    prompt.info.token_ids.push_back((i * 37) % 300);
    prompt.info.modality.push_back(i >= 8 && i < 72);
    prompt.info.segment.push_back(1);
  }
  const PolicyConfig policy = make_policy_config("h2o", {{"budget", "48"}});
  live::PreparedPrompt pc = ec.prepare(prompt, 8, policy.needs());
  live::RunOptions o;
  o.steps = 8;
  o.keep_logits = true;
  const live::RunResult full = ec.run(pc, o);
  o.forced = &full.predicted;
  o.policy = &policy;
  const live::RunResult rc = ec.run(pc, o);
  ASSERT_EQ(rc.logits.size(), 8u);
  if (!live::cuda_available()) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  auto gpu = live::make_cuda_backend();
  live::Model mg(ck, *gpu);
  live::LiveEngine eg(mg, 1);
  live::PreparedPrompt pg = eg.prepare(prompt, 8, policy.needs());
  const live::RunResult rg = eg.run(pg, o);
  for (int t = 0; t < 8; ++t) {
    double diff = 0, scale = 0;
    for (std::size_t i = 0; i < rc.logits[t].size(); ++i)
      diff = std::max(diff, static_cast<double>(std::abs(rc.logits[t][i] - rg.logits[t][i]))),
      scale = std::max(scale, static_cast<double>(std::abs(rc.logits[t][i])));
    EXPECT_LT(diff / scale, 1e-4) << "step " << t;
  }
}

}  // namespace
}  // namespace kvsim::test
