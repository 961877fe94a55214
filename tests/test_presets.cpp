// Each repository preset against an independent re-statement of that repository's rule, computed
// here from the trace's own queries and keys (softmax of the causal prompt attention), on a small
// multi-head trace (one query head per KV head) and, for the readings that keep a cache per query
// head (after repeat_kv), on a GQA trace too, where each query head selects its own set.
// Equal scores keep the newer position (torch.topk leaves the order of ties unspecified).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <tuple>

#include "tests/replay_helpers.hpp"
#include "tests/tiny_trace.hpp"

namespace kvsim::test {
namespace {

using Positions = std::set<int>;

// p[i][j], i, j < P: causal softmax of scale · q_i · k_j for query head h (its KV head h).
std::vector<std::vector<double>> prompt_attention(const TraceReader& reader,
                                                  const SampleInfo& sample, int layer, int h) {
  const LayerTensors t = reader.read_layer(sample, layer);
  const int P = sample.prompt_len, d = reader.info().head_dim;
  const int g = h / (reader.info().num_heads / reader.info().num_kv_heads);
  std::vector<std::vector<double>> p(P, std::vector<double>(P, 0.0));
  for (int i = 0; i < P; ++i) {
    std::vector<double> logit(i + 1);
    for (int j = 0; j <= i; ++j) {
      double dot = 0;
      for (int c = 0; c < d; ++c) dot += double(t.q(i, h, c)) * t.k(j, g, c);
      logit[j] = reader.info().scale * dot;
    }
    const double m = *std::max_element(logit.begin(), logit.end());
    double z = 0;
    for (int j = 0; j <= i; ++j) z += std::exp(logit[j] - m);
    for (int j = 0; j <= i; ++j) p[i][j] = std::exp(logit[j] - m) / z;
  }
  return p;
}

// The `keep` highest of score[0..n), ties to the newer position.
Positions top(const std::vector<double>& score, int keep) {
  std::vector<int> order(score.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return score[a] != score[b] ? score[a] > score[b] : a > b;
  });
  return Positions(order.begin(), order.begin() + std::min<std::size_t>(keep, order.size()));
}

Positions range(int from, int to) {
  Positions s;
  for (int j = from; j < to; ++j) s.insert(j);
  return s;
}

// The mean vote of the last w prompt queries on each prefix position j < P - w, pooled with
// stride 1 and same padding (F.max_pool1d ignores the padding; F.avg_pool1d counts it as zeros).
std::vector<double> pooled_window_votes(const std::vector<std::vector<double>>& p, int w,
                                        int kernel, bool max_pool) {
  const int P = static_cast<int>(p.size()), n = P - w;
  std::vector<double> votes(n, 0.0), pooled(n);
  for (int i = n; i < P; ++i)
    for (int j = 0; j < n; ++j) votes[j] += p[i][j] / w;
  for (int j = 0; j < n; ++j) {
    double acc = max_pool ? -1.0 : 0.0;
    for (int o = j - kernel / 2; o <= j + kernel / 2; ++o)
      if (o >= 0 && o < n) acc = max_pool ? std::max(acc, votes[o]) : acc + votes[o];
    pooled[j] = max_pool ? acc : acc / kernel;
  }
  return pooled;
}

// Σ_i p_ij over every prompt query: the attention each prompt position received.
std::vector<double> column_sums(const std::vector<std::vector<double>>& p) {
  std::vector<double> col(p.size(), 0.0);
  for (std::size_t i = 0; i < p.size(); ++i)
    for (std::size_t j = 0; j <= i; ++j) col[j] += p[i][j];
  return col;
}

// SnapKV as SnapKVCluster / SnapKVPress: the window plus the top B - w prefix positions by
// pooled window votes.
Positions snapkv_kept(const std::vector<std::vector<double>>& p, int B, int w, int kernel,
                      bool max_pool) {
  const int n = static_cast<int>(p.size()) - w;
  Positions kept = top(pooled_window_votes(p, w, kernel, max_pool), B - w);
  for (int j = n; j < n + w; ++j) kept.insert(j);
  return kept;
}

// Cosine of the keys at positions a and b of KV head g (a zero key has cosine 0, as F.normalize).
double key_cosine(const LayerTensors& t, int a, int b, int g) {
  double ab = 0, aa = 0, bb = 0;
  for (std::size_t c = 0; c < t.k.shape(2); ++c) {
    ab += double(t.k(a, g, c)) * t.k(b, g, c);
    aa += double(t.k(a, g, c)) * t.k(a, g, c);
    bb += double(t.k(b, g, c)) * t.k(b, g, c);
  }
  return ab / std::max(std::sqrt(aa), 1e-6) / std::max(std::sqrt(bb), 1e-6);
}

// What a preset kept in every layer and cache head after the prefill; and it never evicts while
// decoding (every one of these readings compresses the prompt once, then appends). A cache head is
// a KV head, or a query head for the readings that keep a cache per query head; `reference` gets
// its index (prompt_attention reads a query head's KV head itself).
void expect_kept(const std::string& trace, const std::string& preset,
                 const std::map<std::string, std::string>& params,
                 const std::function<Positions(const TraceReader&, const SampleInfo&, int layer,
                                               int head)>& reference) {
  TraceReader reader(trace);
  const SampleInfo sample = reader.read_sample(reader.sample_names()[0]);
  const auto results = run_policy(trace, preset, params);
  const int P = sample.prompt_len;
  const int heads = make_policy_config(preset, params).query_head_caches()
                        ? reader.info().num_heads
                        : reader.info().num_kv_heads;
  ASSERT_EQ(results.size(), static_cast<std::size_t>(reader.info().num_layers)) << preset;
  for (const auto& r : results) {
    ASSERT_EQ(r.evicted.size(), static_cast<std::size_t>(heads)) << preset;
    for (int g = 0; g < heads; ++g) {
      Positions kept = range(0, P);
      for (const auto& e : r.evicted[g]) {
        EXPECT_EQ(e.step, -1) << preset << ": decode eviction in layer " << r.layer;
        kept.erase(e.position);
      }
      EXPECT_LT(kept.size(), static_cast<std::size_t>(P)) << preset << ": nothing was evicted";
      EXPECT_EQ(kept, reference(reader, sample, r.layer, g))
          << preset << " layer " << r.layer << " head " << g;
      for (std::size_t t = 0; t < r.steps[g].size(); ++t)
        EXPECT_EQ(r.steps[g][t].cache_size, static_cast<int>(kept.size() + t + 1));
    }
  }
}

std::string mha_trace(const std::string& name) {
  return small_synthetic_trace(name, 2, true, 4, 4);  // P = 52, G = 12
}
std::string gqa_trace(const std::string& name) {
  return small_synthetic_trace(name, 2, true, 4, 2);  // 4 query heads on 2 KV heads
}

TEST(Presets, ABudgetWithinTheWindowKeepsTheNewestEntries) {
  // P = 10, budget 3, window 32: the window is clamped to the budget and the 3 newest prompt
  // entries stay (kvsim's tie rule). kvpress's SnapKVPress gives every window entry the same
  // score, so which n_kept it keeps is torch.topk's tie order: the oldest on a GPU.
  TinyTrace t{.prompt_len = 10, .weights = std::vector<double>(12, 1.0), .layers = 1};
  const std::string path = t.write("snapkv_small_budget.h5");
  for (const std::string policy : {"snapkv", "pyramidkv", "adakv", "snapkv:kvpress"}) {
    const auto r = run_policy(path, policy, {{"budget", "3"}});
    EXPECT_EQ(evicted_at(r[0], -1), (std::vector<int>{0, 1, 2, 3, 4, 5, 6})) << policy;
  }
}

TEST(Presets, SnapKVReadingsMatchTheirRepositories) {
  const std::string trace = mha_trace("presets_snapkv.h5");
  // FasterDecoding/SnapKV's published LongBench runs (ablation_c*_w32_k7_maxpool.json): window
  // 32, maxpool 7; per query head (on the GQA trace each of the 4 query heads keeps its own 40).
  for (const std::string& t : {trace, gqa_trace("presets_snapkv_gqa.h5")})
    expect_kept(t, "snapkv:original", {{"budget", "40"}},
                [](const TraceReader& r, const SampleInfo& s, int l, int h) {
                  return snapkv_kept(prompt_attention(r, s, l, h), 40, 32, 7, true);
                });
  // init_snapkv's defaults (a model patched without compress args): window 32, avgpool 5.
  for (const std::string& t : {trace, gqa_trace("presets_snapkv_quick_gqa.h5")})
    expect_kept(t, "snapkv:quickstart", {{"budget", "40"}},
                [](const TraceReader& r, const SampleInfo& s, int l, int h) {
                  return snapkv_kept(prompt_attention(r, s, l, h), 40, 32, 5, false);
                });
  // kvpress SnapKVPress with compression_ratio 0.25: n_kept = int(52 * 0.75) = 39, window 64
  // (the whole prompt: nothing to evict) -> here window 16 to have something to choose.
  // (The whole prompt compressed: kvpress's appending of the question is tested on its own below.)
  expect_kept(trace, "snapkv:kvpress",
              {{"compression_ratio", "0.25"}, {"window", "16"}, {"question", "compress"}},
              [](const TraceReader& r, const SampleInfo& s, int l, int h) {
                return snapkv_kept(prompt_attention(r, s, l, h), 39, 16, 5, false);
              });
  // KVCache-Factory run_longbench.py: window 8, maxpool 7; per query head.
  for (const std::string& t : {trace, gqa_trace("presets_snapkv_kvf_gqa.h5")})
    expect_kept(t, "snapkv:kvcache-factory", {{"budget", "20"}},
                [](const TraceReader& r, const SampleInfo& s, int l, int h) {
                  return snapkv_kept(prompt_attention(r, s, l, h), 20, 8, 7, true);
                });
}

// One cache per KV head on a GQA trace: the KV head's votes are the mean (or the max) over its
// query heads of their window-mean votes, then pooled (FFY0/AdaKV gqa_support; gqa_func).
TEST(Presets, SnapKVGroupReductionOnGQA) {
  const std::string trace = gqa_trace("presets_snapkv_group.h5");
  for (const bool max_reduce : {false, true})
    expect_kept(trace, "snapkv",
                {{"budget", "20"},
                 {"window", "8"},
                 {"kernel", "7"},
                 {"pooling", "max"},
                 {"group_reduce", max_reduce ? "max" : "mean"}},
                [max_reduce](const TraceReader& r, const SampleInfo& s, int l, int g) {
                  const int P = s.prompt_len, w = 8, n = P - w;
                  std::vector<double> votes(n, 0.0);
                  for (int h = 2 * g; h < 2 * g + 2; ++h) {
                    const auto p = prompt_attention(r, s, l, h);
                    for (int j = 0; j < n; ++j) {
                      double v = 0;
                      for (int i = n; i < P; ++i) v += p[i][j] / w;
                      votes[j] = max_reduce ? std::max(votes[j], v) : votes[j] + v / 2;
                    }
                  }
                  std::vector<double> pooled(n);
                  for (int j = 0; j < n; ++j) {
                    pooled[j] = 0;
                    for (int o = std::max(0, j - 3); o <= std::min(n - 1, j + 3); ++o)
                      pooled[j] = std::max(pooled[j], votes[o]);
                  }
                  Positions kept = top(pooled, 20 - w);
                  for (int j = n; j < P; ++j) kept.insert(j);
                  return kept;
                });
}

TEST(Presets, PyramidKVOfKvpress) {
  // PyramidKVPress on a 3-layer trace (P = 52), window 8, with B = 52 (1 - ratio) unrounded:
  //  ratio 0.55, β 2: B = 23.4, min 11.7, max 35.1 < P - w = 44, step 11.7: 35, 23, 12 in all;
  //  ratio 0.5, β 20: B = 26, max 50.7 >= 44 -> max 44, min 8: 44, 26, 8;
  //  ratio 0.6, β 3: B = 20.8, min 6.93 < w: the SnapKV fall-back, round(20.8) = 21 everywhere.
  const std::string trace = small_synthetic_trace("presets_pyramid_kvpress.h5", 3, true, 4, 4);
  const std::vector<std::tuple<std::string, std::string, std::vector<int>>> cases = {
      {"0.55", "2", {35, 23, 12}}, {"0.5", "20", {44, 26, 8}}, {"0.6", "3", {21, 21, 21}}};
  for (const auto& [ratio, beta, keep] : cases)
    expect_kept(
        trace, "pyramidkv:kvpress",
        {{"compression_ratio", ratio}, {"beta", beta}, {"window", "8"}, {"question", "compress"}},
        [keep = keep](const TraceReader& r, const SampleInfo& s, int l, int h) {
          return snapkv_kept(prompt_attention(r, s, l, h), keep[l], 8, 5, false);
        });
}

// AdaKVPress around SnapKVPress, restated on a GQA trace (kvpress selects per KV head): the
// window-vote mean of each query head, average-pooled, averaged over the group; the window scored
// with the maximum of all; each head's top int(α · n_kept) set to +inf; then the
// Hkv · (P - n_kept) lowest of the layer pruned jointly.
std::vector<Positions> adakv_kvpress_select(std::vector<std::vector<double>> score, double alpha,
                                            int n_kept);
std::vector<Positions> adakv_kvpress_kept(const TraceReader& r, const SampleInfo& s, int l,
                                          double alpha, int n_kept, int w, int kernel) {
  const int P = s.prompt_len, H = r.info().num_heads, Hkv = r.info().num_kv_heads;
  const int group = H / Hkv, n = P - w;
  std::vector<std::vector<double>> score(Hkv, std::vector<double>(P, 0.0));
  double best = -1;
  for (int h = 0; h < H; ++h) {
    const auto pooled = pooled_window_votes(prompt_attention(r, s, l, h), w, kernel, false);
    for (int j = 0; j < n; ++j) score[h / group][j] += pooled[j] / group;
  }
  for (const auto& sg : score) best = std::max(best, *std::max_element(sg.begin(), sg.begin() + n));
  for (auto& sg : score) std::fill(sg.begin() + n, sg.end(), best);
  return adakv_kvpress_select(score, alpha, n_kept);
}

// AdaKVPress's selection on any scorer's [kv head][position] scores.
std::vector<Positions> adakv_kvpress_select(std::vector<std::vector<double>> score, double alpha,
                                            int n_kept) {
  const int Hkv = static_cast<int>(score.size()), P = static_cast<int>(score[0].size());
  const int n_safe = static_cast<int>(n_kept * alpha);
  for (auto& sg : score)
    for (int j : top(sg, n_safe)) sg[j] = std::numeric_limits<double>::infinity();
  std::vector<std::tuple<double, int, int>> all;  // score, position, -head
  for (int g = 0; g < Hkv; ++g)
    for (int j = 0; j < P; ++j) all.emplace_back(score[g][j], j, -g);
  std::sort(all.begin(), all.end());  // lowest first; ties: older, then the higher head
  std::vector<Positions> kept(Hkv, range(0, P));
  for (int i = 0; i < Hkv * (P - n_kept); ++i)
    kept[-std::get<2>(all[i])].erase(std::get<1>(all[i]));
  return kept;
}

TEST(Presets, AdaKVOfKvpress) {
  // n_kept = int(52 * 0.5) = 26, window 8: α = 0.2 gives n_safe = 5 < w (no prefix floor);
  // α = 0.9 gives 23, a floor of 15 prefix entries per head where kvsim's own reading of
  // Alg. 1 (safeguard = prefix) gives floor(0.9 * 18) = 16.
  const std::string trace = small_synthetic_trace("presets_adakv_kvpress.h5", 2);
  for (const double alpha : {0.2, 0.9})
    expect_kept(trace, "adakv:kvpress",
                {{"compression_ratio", "0.5"},
                 {"window", "8"},
                 {"alpha", std::to_string(alpha)},
                 {"question", "compress"}},
                [alpha](const TraceReader& r, const SampleInfo& s, int l, int g) {
                  return adakv_kvpress_kept(r, s, l, alpha, 26, 8, 5)[g];
                });
}

// FFY0/AdaKV's AdaptiveSnapKVCluster (and KVCache-Factory's AdaKVCluster, its copy), per cache
// head h (a query head after repeat_kv): window-mean votes, max-pooled 7; with `normalize` each
// head's scores scaled by the share of its mass in its own top base = B - w; the joint top
// H · base counted per head (c_h); head h keeps its round(c_h · 0.8 + int(0.2 · base)) best
// (torch.round: half to even) and the window.
Positions adakv_authors_kept(const TraceReader& r, const SampleInfo& s, int l, int g, int B, int w,
                             bool normalize) {
  const int P = s.prompt_len, H = r.info().num_heads, base = B - w, n = P - w;
  std::vector<std::vector<double>> score(H, std::vector<double>(n));
  std::vector<std::tuple<double, int, int>> all;  // weighted score, position, -head
  for (int h = 0; h < H; ++h) {
    score[h] = pooled_window_votes(prompt_attention(r, s, l, h), w, 7, true);
    std::vector<double> sorted = score[h];
    std::sort(sorted.rbegin(), sorted.rend());
    const double weight = normalize ? std::accumulate(sorted.begin(), sorted.begin() + base, 0.0) /
                                          std::accumulate(sorted.begin(), sorted.end(), 0.0)
                                    : 1.0;
    for (int j = 0; j < n; ++j) all.emplace_back(score[h][j] * weight, j, -h);
  }
  std::sort(all.rbegin(), all.rend());  // best first; ties: newer, lower head
  int count = 0;
  for (int i = 0; i < H * base; ++i) count += -std::get<2>(all[i]) == g;
  const int keep = static_cast<int>(std::nearbyint(count * 0.8 + int(base * 0.2)));
  Positions kept = top(score[g], keep);
  for (int j = n; j < P; ++j) kept.insert(j);
  return kept;
}

TEST(Presets, AdaKVOfKVCacheFactory) {
  // run_longbench.py: window 8, maxpool 7, floor 0.2; init_adakv: normalize = True.
  for (const std::string& t :
       {mha_trace("presets_adakv_kvf.h5"), gqa_trace("presets_adakv_kvf_gqa.h5")})
    expect_kept(t, "adakv:kvcache-factory", {{"budget", "20"}},
                [](const TraceReader& r, const SampleInfo& s, int l, int g) {
                  return adakv_authors_kept(r, s, l, g, 20, 8, true);
                });
}

TEST(Presets, AdaKVOfItsAuthors) {
  // pred.py with c*_w32_k7_maxpool.json and --floor_alpha 0.2, without --normalize.
  for (const std::string& t :
       {mha_trace("presets_adakv_authors.h5"), gqa_trace("presets_adakv_authors_gqa.h5")})
    expect_kept(t, "adakv:authors", {{"budget", "44"}},
                [](const TraceReader& r, const SampleInfo& s, int l, int g) {
                  return adakv_authors_kept(r, s, l, g, 44, 32, false);
                });
  // The two readings differ on this trace: normalising moves entries between heads.
  const std::string t = gqa_trace("presets_adakv_authors_gqa.h5");
  const auto plain = run_policy(t, "adakv:authors", {{"budget", "44"}});
  const auto normalised = run_policy(t, "adakv:authors", {{"budget", "44"}, {"normalize", "true"}});
  bool differ = false;
  for (std::size_t l = 0; l < plain.size(); ++l)
    for (std::size_t h = 0; h < plain[l].evicted.size(); ++h)
      differ |= plain[l].evicted[h].size() != normalised[l].evicted[h].size();
  EXPECT_TRUE(differ);
}

TEST(Presets, H2OOfKVCacheFactory) {
  // H2OKVCluster: column sums of the causal prompt attention over every prompt query, for the
  // prefix before the window of 8; the window plus the top B - 8.
  expect_kept(mha_trace("presets_h2o.h5"), "h2o:kvcache-factory", {{"budget", "20"}},
              [](const TraceReader& r, const SampleInfo& s, int l, int h) {
                std::vector<double> col = column_sums(prompt_attention(r, s, l, h));
                const int P = static_cast<int>(col.size());
                col.resize(P - 8);  // the window is kept, not ranked
                Positions kept = top(col, 20 - 8);
                for (int j = P - 8; j < P; ++j) kept.insert(j);
                return kept;
              });
}

TEST(Presets, H2OOfKvpress) {
  // ObservedAttentionPress: attention received summed over the prompt queries and divided by
  // how many of them see the token (P - j), no window; n_kept = int(52 * (1 - 0.5)) = 26.
  expect_kept(mha_trace("presets_h2o_kvpress.h5"), "h2o:kvpress",
              {{"compression_ratio", "0.5"}, {"question", "compress"}},
              [](const TraceReader& r, const SampleInfo& s, int l, int h) {
                std::vector<double> score = column_sums(prompt_attention(r, s, l, h));
                const int P = static_cast<int>(score.size());
                for (int j = 0; j < P; ++j) score[j] /= P - j;
                return top(score, 26);
              });
}

TEST(Presets, StreamingLLMOfKvpressAndKVCacheFactory) {
  // 4 sinks and the newest B - 4 prompt entries, once.
  for (const std::string preset : {"streamingllm:kvpress", "streamingllm:kvcache-factory"})
    expect_kept(mha_trace("presets_streaming.h5"), preset,
                {{"budget", "20"}, {"question", "compress"}},
                [](const TraceReader&, const SampleInfo& s, int, int) {
                  Positions kept = range(0, 4);
                  for (int j = s.prompt_len - 16; j < s.prompt_len; ++j) kept.insert(j);
                  return kept;
                });
}

TEST(Presets, TovaOfKvpress) {
  // TOVAPress: the last prompt token's attention averaged over every head of the layer (one set
  // for all heads), the last token kept with the maximum score, the top B overall.
  expect_kept(mha_trace("presets_tova.h5"), "tova:kvpress",
              {{"compression_ratio", "0.5"}, {"question", "compress"}},
              [](const TraceReader& r, const SampleInfo& s, int l, int) {
                const int P = s.prompt_len, H = r.info().num_heads;
                std::vector<double> score(P, 0.0);
                for (int h = 0; h < H; ++h) {
                  const auto p = prompt_attention(r, s, l, h);
                  for (int j = 0; j < P; ++j) score[j] += p[P - 1][j] / H;
                }
                score[P - 1] = *std::max_element(score.begin(), score.end()) + 1;
                return top(score, P / 2);  // int(52 * 0.5)
              });
}

}  // namespace
}  // namespace kvsim::test

namespace kvsim::test {
namespace {

TEST(Knorm, KeepsTheSmallestKeyNormsAsKvpress) {
  // By hand (d = 1, k_j = ln w_j): w = [e^2, e^-1, 1, e^0.5, e^-3, e | 1] gives key norms
  // 2, 1, 0, 0.5, 3, 1; B = 3 keeps 2 and 3, then of the tied 1 and 5 the newer: evicts {0, 1, 4}.
  const double e = std::exp(1.0);
  TinyTrace t{.prompt_len = 6, .weights = {e * e, 1 / e, 1, std::sqrt(e), 1 / (e * e * e), e, 1}};
  const auto r = run_policy(t.write("knorm.h5"), "knorm", {{"budget", "3"}});
  EXPECT_EQ(evicted_at(r[0], -1), (std::vector<int>{0, 1, 4}));
  EXPECT_EQ(r[0].steps[0][0].cache_size, 4);
  // kvpress's KnormPress (score = -keys.norm(dim=-1), n_kept = int(P (1 - ratio))), restated
  // from the trace's keys on every KV head of a GQA trace.
  const std::string trace = small_synthetic_trace("knorm_gqa.h5");
  expect_kept(trace, "knorm", {{"compression_ratio", "0.6"}},
              [](const TraceReader& reader, const SampleInfo& s, int l, int g) {
                const LayerTensors ten = reader.read_layer(s, l);
                std::vector<double> score(s.prompt_len);
                for (int j = 0; j < s.prompt_len; ++j) {
                  double n2 = 0;
                  for (int c = 0; c < reader.info().head_dim; ++c)
                    n2 += double(ten.k(j, g, c)) * ten.k(j, g, c);
                  score[j] = -std::sqrt(n2);
                }
                return top(score, static_cast<int>(s.prompt_len * (1 - 0.6)));
              });
}

// KVCache-Factory's --merge (pyramidkv_utils.py merge_kv), re-stated: every prompt entry the
// policy drops joins the kept entry (selected or window) whose key has the highest cosine with
// its own; pivot: kept x becomes (x + Σ (d + x) / 2) / (1 + n); weighted: (x + Σ w d) / (1 + Σ w),
// w = max((1 + cos) / 2, 1e-6); keys and values alike, by the keys' similarity.
TEST(Presets, KVCacheFactoryMergeAsMergeKv) {
  TraceReader reader(mha_trace("presets_merge.h5"));
  const SampleInfo s = reader.read_sample(reader.sample_names()[0]);
  const LayerTensors t = reader.read_layer(s, 1);
  const int P = s.prompt_len, d = reader.info().head_dim;
  auto cosine = [&](int a, int b, int g) { return key_cosine(t, a, b, g); };
  for (const std::string policy : {"snapkv:kvcache-factory", "h2o:kvcache-factory",
                                   "pyramidkv:kvcache-factory", "streamingllm:kvcache-factory"})
    for (const std::string kind : {"pivot", "weighted"}) {
      const PolicyConfig cfg = make_policy_config(policy, {{"budget", "20"}, {"merge", kind}});
      EXPECT_TRUE(cfg.merges());
      const LayerAttention att(reader.info(), s, reader.read_layer(s, 1), cfg.needs(), 1);
      KvCache cache(reader.info().num_kv_heads, d);
      cache.fill_prompt(P);
      cfg.info->create(cfg.params, s)->on_prefill(LayerView(att, false), cache);
      for (int g = 0; g < cache.kv_heads(); ++g) {
        const std::vector<std::int32_t> kept = cache.positions(g);
        std::map<int, std::vector<std::pair<int, double>>> members;  // kept -> (dropped, cos)
        for (int j = 0; j < P; ++j) {
          if (std::binary_search(kept.begin(), kept.end(), j)) continue;
          int best = kept[0];
          for (int k : kept)
            if (cosine(j, k, g) > cosine(j, best, g)) best = k;
          members[best].emplace_back(j, cosine(j, best, g));
        }
        ASSERT_EQ(cache.merges(g).size(), static_cast<std::size_t>(P) - kept.size());
        for (std::size_t e = 0; e < kept.size(); ++e) {
          const auto it = members.find(kept[e]);
          if (it == members.end()) {
            EXPECT_EQ(cache.merged_key(g, static_cast<int>(e)), nullptr);
            continue;
          }
          for (const bool key : {true, false}) {
            const auto& x = key ? t.k : t.v;
            const float* got = key ? cache.merged_key(g, static_cast<int>(e))
                                   : cache.merged_value(g, static_cast<int>(e));
            ASSERT_NE(got, nullptr);
            for (int c = 0; c < d; ++c) {
              const double self = x(kept[e], g, c);
              double sum = self, weights = 1;
              for (const auto& [j, cos] : it->second) {
                const double w = kind == "pivot" ? 1.0 : std::max((1 + cos) / 2, 1e-6);
                sum += kind == "pivot" ? (x(j, g, c) + self) / 2 : w * x(j, g, c);
                weights += w;
              }
              EXPECT_NEAR(got[c], sum / weights, 1e-5 * (1 + std::abs(sum / weights)))
                  << policy << " " << kind << " head " << g << " entry " << kept[e];
            }
          }
        }
      }
    }
  // Merging once after the prompt only: the per-step readings refuse it.
  EXPECT_THROW(make_policy_config("h2o", {{"merge", "pivot"}})
                   .info->create(make_policy_config("h2o", {{"merge", "pivot"}}).params, s),
               std::invalid_argument);
}

// LOOK-M's released text-prior code (TextPivotMerge_LayerWise), re-stated: scores are the prompt
// column sums; image entries and the recent window drop below every text score; the top `heavy` of
// the non-recent prefix are chosen; every entry whose shifted score is >= 0 is kept (so every text
// entry) with the chosen and the window; every other entry pivot-merges into its most
// cosine-similar kept key. Budget 10 on P = 52: recent 5, heavy 5; the 7 text entries outside the
// window all stay, so 12 are kept (more than the budget, as the released code does). 20% is the
// released code's hh_ratio = recent_ratio = 0.1: int(5.2) = 5 each (ceil(10.4) = 11 would make it
// 6 heavy, text that is kept anyway here; the all-image trace below tells the two apart).
class LookMReleased : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Budgets, LookMReleased, ::testing::Values("10", "20%"));

TEST(Presets, H2OAndLookMSizeEachPartAsTheirCode) {
  // 255 image tokens at 20%: H2O's heavy_budget = int(0.1 * 255) = 25 and recent_budget = 25,
  // LOOK-M's hh and recent the same: 50 held after the prompt, where ceil(51) held 51.
  const std::string path = TinyTrace{.prompt_len = 255,
                                     .weights = std::vector<double>(256, 1.0),
                                     .values = std::vector<double>(256, 1.0),
                                     .modality = std::vector<std::uint8_t>(256, 1)}
                               .write("presets_parts.h5");
  for (const std::string name : {"lookm:released", "h2o:paper"}) {
    const auto r = run_policy(path, name, {{"budget", "20%"}});
    EXPECT_EQ(r[0].steps[0][0].cache_size, 50 + 1) << name;  // + step 0's own token
    const auto ceil = run_policy(path, name, {{"budget", "20%"}, {"budget_rounding", "ceil"}});
    EXPECT_EQ(ceil[0].steps[0][0].cache_size, 51 + 1) << name;
  }
}

TEST(Presets, LookMInItsReleasedArithmetic) {
  // float16 arithmetic by hand: -65516 rounds to -65504, where float16's spacing is 32, so an
  // image score below 16 shifted by it is exactly -65504 and one of 20 is -65472.
  EXPECT_EQ(round_to_dtype(-65516.0f, DType::kFloat16), -65504.0f);
  EXPECT_EQ(round_to_dtype(7.3f - 65504.0f, DType::kFloat16), -65504.0f);
  EXPECT_EQ(round_to_dtype(20.0f - 65504.0f, DType::kFloat16), -65472.0f);
  EXPECT_EQ(round_to_dtype(-65516.0f, DType::kFloat32), -65516.0f);
  // 40 image tokens, 10..14 attended 50 times as much as the rest: their column sums are the
  // largest, yet below 16 (at most 40 rows, each under 0.2 once they exist). Budget 10: recent 5,
  // heavy 5. Exact scores keep 10..14; in float16 all 35 candidates tie at -65504 and torch.topk
  // returns the oldest, 0..4 (the released code's choice on a GPU). In float32 the shift keeps
  // the scores apart (spacing 2^-8 at 65516) and the choice is the exact one.
  std::vector<double> w(41, 1.0);
  for (int j = 10; j < 15; ++j) w[j] = 50;
  auto trace = [&](DType dtype, const std::string& name) {
    return TinyTrace{.prompt_len = 40,
                     .weights = w,
                     .modality = std::vector<std::uint8_t>(41, 1),
                     .dtype = dtype}
        .write(name);
  };
  const std::map<std::string, std::string> p = {
      {"budget", "10"}, {"merge", "none"}, {"arithmetic", "released"}};
  auto kept = [](const LayerResult& r) {
    std::vector<int> out;
    const std::vector<int> gone = evicted_at(r, -1);
    for (int j = 0; j < 40; ++j)
      if (std::find(gone.begin(), gone.end(), j) == gone.end()) out.push_back(j);
    return out;
  };
  const std::vector<int> oldest = {0, 1, 2, 3, 4, 35, 36, 37, 38, 39};
  const std::vector<int> attended = {10, 11, 12, 13, 14, 35, 36, 37, 38, 39};
  const std::string half = trace(DType::kFloat16, "lookm_fp16.h5");
  EXPECT_EQ(kept(run_policy(half, "lookm:released", p)[0]), oldest);
  auto exact = p;
  exact["arithmetic"] = "exact";
  EXPECT_EQ(kept(run_policy(half, "lookm:released", exact)[0]), attended);
  EXPECT_EQ(kept(run_policy(trace(DType::kFloat32, "lookm_fp32.h5"), "lookm:released", p)[0]),
            attended);
}

TEST_P(LookMReleased, KeepsWhatItsReleasedCodeKeeps) {
  TraceReader reader(mha_trace("presets_lookm.h5"));
  const SampleInfo s = reader.read_sample(reader.sample_names()[0]);
  const int P = s.prompt_len, recent = 5, heavy = 5, layer = 1;
  ASSERT_EQ(P, 52);
  const PolicyConfig cfg = make_policy_config("lookm:released", {{"budget", GetParam()}});
  const LayerTensors t = reader.read_layer(s, layer);
  const LayerAttention att(reader.info(), s, reader.read_layer(s, layer), cfg.needs(), 1);
  KvCache cache(reader.info().num_kv_heads, reader.info().head_dim);
  cache.fill_prompt(P);
  cfg.info->create(cfg.params, s)->on_prefill(LayerView(att, false), cache);
  for (int g = 0; g < cache.kv_heads(); ++g) {
    std::vector<double> shifted = column_sums(prompt_attention(reader, s, layer, g));
    for (int j = 0; j < P; ++j)
      if (s.modality[j] != 0 || j >= P - recent) shifted[j] -= 65516;
    std::vector<double> prefix(shifted.begin(), shifted.end() - recent);
    Positions kept = top(prefix, heavy);
    for (int j = 0; j < P; ++j)
      if (shifted[j] >= 0 || j >= P - recent) kept.insert(j);
    EXPECT_EQ(kept.size(), 12u);
    const auto& held = cache.positions(g);
    EXPECT_EQ(Positions(held.begin(), held.end()), kept) << "head " << g;
    ASSERT_EQ(cache.merges(g).size(), static_cast<std::size_t>(P) - kept.size());
    for (const auto& m : cache.merges(g)) {
      auto cosine = [&](int a, int b) { return key_cosine(t, a, b, g); };
      int best = *kept.begin();
      for (int k : kept)
        if (cosine(m.position, k) > cosine(m.position, best)) best = k;
      EXPECT_EQ(m.into_position, best) << "head " << g << " position " << m.position;
    }
  }
}

}  // namespace
}  // namespace kvsim::test

namespace kvsim::test {
namespace {

// A GQA trace (4 query heads on 2 KV heads, d = 8) whose queries and keys are Gaussian draws the
// test keeps before applying the rotary embedding (base theta, rotate_half layout) itself.
struct RotaryTrace {
  static constexpr int P = 40, G = 4, H = 4, Hkv = 2, d = 8;
  double theta = 500;
  std::vector<double> q_plain;  // [P, H, d], before the rotation
  std::string path;
  explicit RotaryTrace(const std::string& name, bool write_theta = true) {
    std::mt19937_64 rng(11);
    std::normal_distribution<double> normal(0.0, 1.0);
    TraceInfo info{
        .model = "rotary", .num_layers = 1, .num_heads = H, .num_kv_heads = Hkv, .head_dim = d};
    info.scale = 1 / std::sqrt(double(d));
    info.rope_theta = write_theta ? theta : 0;
    SampleInfo s;
    s.name = "s0";
    s.prompt_len = P;
    s.gen_len = G;
    s.modality.assign(P + G, 0);
    for (int i = 0; i < P + G; ++i) s.segment.push_back(i < P ? 1 : 2);
    LayerTensors t;
    t.q = xt::zeros<float>({std::size_t(P + G), std::size_t(H), std::size_t(d)});
    t.k = xt::zeros<float>({std::size_t(P + G), std::size_t(Hkv), std::size_t(d)});
    t.v = xt::zeros<float>({std::size_t(P + G), std::size_t(Hkv), std::size_t(d)});
    // Rotation of position i by angle i θ^(-2f/d) on the pair (f, f + d/2).
    auto rope = [&](std::vector<double> x, int i) {
      std::vector<double> out(d);
      for (int f = 0; f < d / 2; ++f) {
        const double a = i * std::pow(theta, -2.0 * f / d);
        out[f] = x[f] * std::cos(a) - x[f + d / 2] * std::sin(a);
        out[f + d / 2] = x[f + d / 2] * std::cos(a) + x[f] * std::sin(a);
      }
      return out;
    };
    for (int i = 0; i < P + G; ++i) {
      for (int h = 0; h < H; ++h) {
        std::vector<double> x(d);
        for (int c = 0; c < d; ++c) x[c] = normal(rng) + (c == 1 ? 1.5 : 0.0) * (h + 1);
        if (i < P) q_plain.insert(q_plain.end(), x.begin(), x.end());
        const auto r = rope(x, i);
        for (int c = 0; c < d; ++c) t.q(i, h, c) = static_cast<float>(r[c]);
      }
      for (int g = 0; g < Hkv; ++g) {
        std::vector<double> x(d);
        for (int c = 0; c < d; ++c) x[c] = normal(rng);
        const auto r = rope(x, i);
        for (int c = 0; c < d; ++c) {
          t.k(i, g, c) = static_cast<float>(r[c]);
          t.v(i, g, c) = static_cast<float>(normal(rng) * (1 + (i % 3)));
        }
      }
    }
    path = temp_path(name);
    TraceWriter w(path, info, WriteOptions{.dtype = DType::kFloat32});
    w.write_sample(s);
    w.write_layer(s, t);
  }
};

// kvpress's ExpectedAttentionPress restated with d x d matrices: μ and the population covariance
// of the un-rotated queries after the sinks, R̄ = mean over positions P .. P + n - 1 of
// cos·I + sin·J (J[d/2 + f][f] = 1, J[f][d/2 + f] = -1), z_j = (R̄μ)·k_j/√d +
// k_jᵀ R̄ΣR̄ᵀ k_j / d / 2, softmax over the keys after the sinks, mean over the KV head's query
// heads, times ‖v_j‖; the sinks score the maximum over all heads; top int(P (1 - ratio)).
std::vector<std::vector<double>> expected_attention_restated(const RotaryTrace& rt,
                                                             const LayerTensors& t, int sinks,
                                                             int future) {
  constexpr int P = RotaryTrace::P, H = RotaryTrace::H, d = RotaryTrace::d;
  constexpr int group = H / RotaryTrace::Hkv;
  using Matrix = std::vector<std::vector<double>>;
  Matrix R(d, std::vector<double>(d, 0.0));
  for (int p = P; p < P + future; ++p)
    for (int f = 0; f < d / 2; ++f) {
      const double a = p * std::pow(rt.theta, -2.0 * f / d);
      R[f][f] += std::cos(a) / future;
      R[f + d / 2][f + d / 2] += std::cos(a) / future;
      R[f + d / 2][f] += std::sin(a) / future;
      R[f][f + d / 2] -= std::sin(a) / future;
    }
  std::vector<std::vector<double>> scores(RotaryTrace::Hkv, std::vector<double>(P, 0.0));
  for (int h = 0; h < H; ++h) {
    const int n = P - sinks;
    std::vector<double> mu(d, 0.0);
    for (int i = sinks; i < P; ++i)
      for (int c = 0; c < d; ++c) mu[c] += rt.q_plain[(i * H + h) * d + c] / n;
    Matrix cov(d, std::vector<double>(d, 0.0));
    for (int i = sinks; i < P; ++i)
      for (int a = 0; a < d; ++a)
        for (int b = 0; b < d; ++b)
          cov[a][b] += (rt.q_plain[(i * H + h) * d + a] - mu[a]) *
                       (rt.q_plain[(i * H + h) * d + b] - mu[b]) / n;
    std::vector<double> mu_r(d, 0.0);
    Matrix cov_r(d, std::vector<double>(d, 0.0));
    for (int a = 0; a < d; ++a)
      for (int b = 0; b < d; ++b) {
        mu_r[a] += R[a][b] * mu[b];
        for (int x = 0; x < d; ++x)
          for (int y = 0; y < d; ++y) cov_r[a][b] += R[a][x] * cov[x][y] * R[b][y];
      }
    const int g = h / group;
    std::vector<double> z(P, 0.0);
    double zmax = -INFINITY, sum = 0;
    for (int j = sinks; j < P; ++j) {
      for (int a = 0; a < d; ++a) {
        z[j] += mu_r[a] * t.k(j, g, a) / std::sqrt(double(d));
        for (int b = 0; b < d; ++b) z[j] += t.k(j, g, a) * cov_r[a][b] * t.k(j, g, b) / d / 2;
      }
      zmax = std::max(zmax, z[j]);
    }
    for (int j = sinks; j < P; ++j) sum += std::exp(z[j] - zmax);
    for (int j = sinks; j < P; ++j) scores[g][j] += std::exp(z[j] - zmax) / sum / group;
  }
  double top = -INFINITY;
  for (int g = 0; g < RotaryTrace::Hkv; ++g)
    for (int j = sinks; j < P; ++j) {
      double v2 = 0;
      for (int c = 0; c < d; ++c) v2 += double(t.v(j, g, c)) * t.v(j, g, c);
      scores[g][j] *= std::sqrt(v2);
      top = std::max(top, scores[g][j]);
    }
  for (auto& s : scores) std::fill(s.begin(), s.begin() + sinks, top);
  return scores;
}

TEST(ExpectedAttention, KeepsWhatKvpressExpectedAttentionPressKeeps) {
  const RotaryTrace rt("expected_attention.h5");
  TraceReader reader(rt.path);
  const LayerTensors t = reader.read_layer(reader.read_sample("s0"), 0);
  for (const auto& [sinks, future] : {std::pair{4, 512}, std::pair{2, 16}}) {
    const auto scores = expected_attention_restated(rt, t, sinks, future);
    expect_kept(rt.path, "expected_attention",
                {{"compression_ratio", "0.7"},
                 {"sinks", std::to_string(sinks)},
                 {"future_positions", std::to_string(future)}},
                [&](const TraceReader&, const SampleInfo& s, int, int g) {
                  const Positions kept = top(scores[g], static_cast<int>(s.prompt_len * (1 - 0.7)));
                  for (int j = 0; j < sinks; ++j) EXPECT_TRUE(kept.count(j)) << "sink " << j;
                  return kept;
                });
  }
}

TEST(ExpectedAttention, NeedsTheRotaryBase) {
  const RotaryTrace rt("expected_attention_no_theta.h5", false);
  try {
    run_policy(rt.path, "expected_attention", {{"budget", "10"}});
    FAIL() << "no error without rope_theta";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("rope_theta"), std::string::npos) << e.what();
  }
  // Given as a parameter, it is the trace's rotation: the same kept sets as with the attribute.
  const RotaryTrace with("expected_attention_theta.h5");
  const auto a =
      run_policy(rt.path, "expected_attention", {{"budget", "10"}, {"rope_theta", "500"}});
  const auto b = run_policy(with.path, "expected_attention", {{"budget", "10"}});
  EXPECT_EQ(a[0].evicted[1].size(), 30u);
  for (int g = 0; g < RotaryTrace::Hkv; ++g)
    EXPECT_EQ(evicted_at(a[0], -1, g), evicted_at(b[0], -1, g));
}

}  // namespace
}  // namespace kvsim::test

namespace kvsim::test {
namespace {

// AdaKVPress around KnormPress and ExpectedAttentionPress (no window): `adakv` with scorer knorm
// or expected_attention, window 0 and safeguard kvpress keeps AdaKVPress's selection of those
// scores (n_kept = int(40 * 0.6) = 24, n_safe = int(24 * 0.3) = 7).
TEST(Presets, AdaKVOfKvpressAroundAnyScorer) {
  const RotaryTrace rt("adakv_any_scorer.h5");
  TraceReader reader(rt.path);
  const LayerTensors t = reader.read_layer(reader.read_sample("s0"), 0);
  std::vector<std::vector<double>> knorm(RotaryTrace::Hkv);
  for (int g = 0; g < RotaryTrace::Hkv; ++g)
    for (int j = 0; j < RotaryTrace::P; ++j) {
      double n2 = 0;
      for (int c = 0; c < RotaryTrace::d; ++c) n2 += double(t.k(j, g, c)) * t.k(j, g, c);
      knorm[g].push_back(-std::sqrt(n2));
    }
  const std::map<std::string, std::vector<std::vector<double>>> scores = {
      {"knorm", knorm}, {"expected_attention", expected_attention_restated(rt, t, 4, 512)}};
  for (const auto& [scorer, score] : scores) {
    const auto kept = adakv_kvpress_select(score, 0.3, 24);
    EXPECT_NE(kept[0].size(), kept[1].size()) << scorer << ": the heads should differ";
    expect_kept(
        rt.path, "adakv:kvpress",
        {{"compression_ratio", "0.4"}, {"window", "0"}, {"alpha", "0.3"}, {"scorer", scorer}},
        [&](const TraceReader&, const SampleInfo&, int, int g) { return kept[g]; });
  }
  EXPECT_THROW(run_policy(rt.path, "adakv", {{"window", "0"}, {"budget", "20"}}), std::logic_error);
}

// kvpress's evaluation registry: AdaKVPress(ExpectedAttentionPress(epsilon=e)) with AdaKVPress's
// alpha 0.2; ExpectedAttentionPress adds epsilon to the group-mean scores before the value norms,
// (s + ε)·‖v‖, and the sinks then score the maximum. The bare press's preset keeps other sets.
TEST(Presets, KvpressRegistryAdaKVAroundExpectedAttention) {
  const RotaryTrace rt("adakv_registry.h5");
  TraceReader reader(rt.path);
  const LayerTensors t = reader.read_layer(reader.read_sample("s0"), 0);
  const auto plain = expected_attention_restated(rt, t, 4, 512);
  // (On this small trace epsilon does not change the kept sets, even at 1: the value norms rank
  // as the scores do; the preset's epsilon is checked as resolved below.)
  const std::vector<std::pair<std::string, double>> runs = {
      {"adakv:kvpress-expected-attention", 0.0}, {"adakv:kvpress-expected-attention-e2", 0.01}};
  for (const auto& [preset, eps] : runs) {
    std::vector<std::vector<double>> score = plain;
    double top = -INFINITY;
    for (int g = 0; g < RotaryTrace::Hkv; ++g)
      for (int j = 4; j < RotaryTrace::P; ++j) {
        double v2 = 0;
        for (int c = 0; c < RotaryTrace::d; ++c) v2 += double(t.v(j, g, c)) * t.v(j, g, c);
        // restated scores are s·‖v‖; (s + ε)·‖v‖ = s·‖v‖ + ε‖v‖
        score[g][j] += eps * std::sqrt(v2);
        top = std::max(top, score[g][j]);
      }
    for (auto& s : score) std::fill(s.begin(), s.begin() + 4, top);
    const auto kept = adakv_kvpress_select(score, 0.2, 24);
    expect_kept(rt.path, preset, {{"compression_ratio", "0.4"}, {"question", "compress"}},
                [&](const TraceReader&, const SampleInfo&, int, int g) { return kept[g]; });
  }
  for (const auto& [key, value] :
       std::map<std::string, std::string>{{"scorer", "expected_attention"},
                                          {"window", "0"},
                                          {"safeguard", "kvpress"},
                                          {"alpha", "0.2"},
                                          {"question", "append"}})
    EXPECT_EQ(make_policy_config("adakv:kvpress-expected-attention-e2", {}).params.values().at(key),
              value)
        << key;
  EXPECT_EQ(
      make_policy_config("adakv:kvpress-expected-attention-e2", {}).params.values().at("epsilon"),
      "0.01");
}

}  // namespace
}  // namespace kvsim::test

namespace kvsim::test {
namespace {

// The sample of `trace` as a context-only compression sees it, written as a trace of its own:
// the question's positions become the first generated tokens.
std::string split_at_question(const std::string& trace, const std::string& name, int& question) {
  TraceReader reader(trace);
  const SampleInfo s = reader.read_sample(reader.sample_names()[0]);
  question = question_length(s);
  SampleInfo context = context_only(s, question);
  context.question_len = -1;
  for (int i = context.prompt_len; i < s.prompt_len; ++i)
    context.segment[i] = static_cast<std::uint8_t>(Segment::kGenerated);
  TraceInfo info = reader.info();
  const std::string path = temp_path(name);
  TraceWriter w(path, info, WriteOptions{.dtype = s.dtype});
  w.write_sample(context);
  for (int l = 0; l < info.num_layers; ++l) w.write_layer(context, reader.read_layer(s, l));
  return path;
}

// kvpress's pipeline (kvpress/pipeline.py): the press compresses the context's prefill and the
// question is fed after it, uncompressed. Every kvpress preset, with its question appended, keeps
// and measures exactly what it does with the whole prompt compressed on the trace whose prompt
// ends where the question begins (the question there being the first generated tokens): the
// same prefill evictions, and at generated token t the same cache and recall as at step Q + t.
TEST(Presets, KvpressAppendsTheQuestionUncompressed) {
  const std::string trace = small_synthetic_trace("presets_question.h5", 2, true, 4, 2);
  int question = 0;
  const std::string context = split_at_question(trace, "presets_question_context.h5", question);
  ASSERT_EQ(question, 6);  // the synthetic user tokens after the image
  for (const auto& preset :
       {"snapkv:kvpress", "h2o:kvpress", "streamingllm:kvpress", "tova:kvpress",
        "pyramidkv:kvpress", "adakv:kvpress", "knorm:kvpress", "expected_attention:kvpress"}) {
    std::map<std::string, std::string> own = {{"compression_ratio", "0.6"}};
    if (make_policy_config(preset, {}).params.values().count("window")) own["window"] = "8";
    ASSERT_TRUE(make_policy_config(preset, own).appends_question()) << preset;
    const auto appended = run_policy(trace, preset, own);
    own["question"] = "compress";
    const auto reference = run_policy(context, preset, own);
    ASSERT_EQ(appended.size(), reference.size());
    for (std::size_t i = 0; i < appended.size(); ++i) {
      const LayerResult &a = appended[i], &b = reference[i];
      EXPECT_EQ(a.budget_entries, static_cast<int>(46 * 0.4)) << preset;  // int(C (1 - ratio))
      for (std::size_t g = 0; g < a.steps.size(); ++g) {
        EXPECT_EQ(evicted_at(a, -1, g), evicted_at(b, -1, g)) << preset << " head " << g;
        EXPECT_FALSE(evicted_at(a, -1, g).empty()) << preset;
        ASSERT_EQ(a.steps[g].size() + question, b.steps[g].size()) << preset;
        for (std::size_t t = 0; t < a.steps[g].size(); ++t) {
          const StepMetrics &x = a.steps[g][t], &y = b.steps[g][t + question];
          EXPECT_EQ(x.position, y.position);
          EXPECT_EQ(x.cache_size, y.cache_size) << preset << " step " << t;
          EXPECT_EQ(x.mass_recall, y.mass_recall) << preset << " step " << t;
          EXPECT_NEAR(x.output_rel_error, y.output_rel_error, 1e-5) << preset << " step " << t;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvsim::test
