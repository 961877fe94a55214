// The synthetic generator shows the attention structure the papers observe in real MLLMs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "core/layer_attention.hpp"
#include "traces/synth.hpp"

namespace kvsim {
namespace {

SynthConfig small_config() {
  SynthConfig c;
  c.layers = 8;
  c.heads = 8;
  c.kv_heads = 4;
  c.head_dim = 64;
  c.system_tokens = 12;
  c.media_tokens = 144;
  c.user_tokens = 12;
  c.gen_tokens = 32;
  return c;
}

struct Observed {
  SampleInfo sample;
  std::vector<std::unique_ptr<LayerAttention>> layers;
};

const Observed& observed() {
  static const Observed obs = [] {
    Observed o;
    const SynthConfig c = small_config();
    o.sample = synth_sample_info(c, 0);
    TraceInfo info{.num_layers = c.layers,
                   .num_heads = c.heads,
                   .num_kv_heads = c.kv_heads,
                   .head_dim = c.head_dim,
                   .scale = 1 / std::sqrt(64.0)};
    for (int l = 0; l < c.layers; ++l)
      o.layers.push_back(std::make_unique<LayerAttention>(
          info, o.sample, synth_layer(c, 0, l),
          AttentionNeeds{.prefill_column_sums = true, .prefill_window = o.sample.prompt_len}, 1));
    return o;
  }();
  return obs;
}

bool vision(int j) {
  return observed().sample.modality[j] != 0;
}

// Head-averaged full-cache decode attention of step t in layer l.
std::vector<double> decode_mean(int l, int t) {
  const auto& a = *observed().layers[l];
  std::vector<double> m(a.total_len(), 0.0);
  for (int h = 0; h < a.num_heads(); ++h)
    for (int j = 0; j < a.total_len(); ++j) m[j] += a.decode_probs(t, h)[j] / a.num_heads();
  return m;
}

double vision_share(int l, int t, int h) {
  const auto& a = *observed().layers[l];
  double s = 0;
  for (int j = 0; j < a.total_len(); ++j)
    if (vision(j)) s += a.decode_probs(t, h)[j];
  return s;
}

// ε-sparsity (HAE Eq. 7): share of causal prompt attention entries below ε.
double sparsity(int l, double eps = 1e-4) {
  const auto& a = *observed().layers[l];
  long below = 0, total = 0;
  for (int h = 0; h < a.num_heads(); ++h)
    for (int r = 0; r < a.prompt_len(); ++r)
      for (int j = 0; j <= r; ++j, ++total) below += a.prefill_window_row(h, r)[j] < eps;
  return static_cast<double>(below) / total;
}

std::set<int> top_vision_half(const std::vector<double>& p) {
  std::vector<int> idx;
  for (int j = 0; j < static_cast<int>(p.size()); ++j)
    if (vision(j)) idx.push_back(j);
  std::sort(idx.begin(), idx.end(), [&](int a, int b) { return p[a] > p[b]; });
  return std::set<int>(idx.begin(), idx.begin() + idx.size() / 2);
}

TEST(Synth, DeeperLayersAreSparser) {
  EXPECT_GT(sparsity(7), sparsity(0) + 0.1);
  EXPECT_GT(sparsity(4), sparsity(0));
}

TEST(Synth, VisionAttentionConcentratesWithDepth) {
  // Fraction of vision tokens holding 80% of the vision mass at the first decode step.
  auto fraction_for_80 = [](int l) {
    auto p = decode_mean(l, 0);
    std::vector<double> v;
    for (int j = 0; j < static_cast<int>(p.size()); ++j)
      if (vision(j)) v.push_back(p[j]);
    std::sort(v.rbegin(), v.rend());
    const double total = std::accumulate(v.begin(), v.end(), 0.0);
    double acc = 0;
    for (std::size_t i = 0; i < v.size(); ++i)
      if ((acc += v[i]) >= 0.8 * total) return (i + 1.0) / v.size();
    return 1.0;
  };
  // Dense early, yet concentrated enough for HAE's DAP to find tokens below r·Σ A in layer 0.
  EXPECT_GT(fraction_for_80(0), 0.45);
  EXPECT_LT(fraction_for_80(7), 0.3);  // a few tokens deep
}

TEST(Synth, TopHalfOfVisionTokensIsStableAcrossDecodeSteps) {
  for (int l : {3, 7}) {
    const auto a = top_vision_half(decode_mean(l, 0));
    const auto b = top_vision_half(decode_mean(l, 4));
    int common = 0;
    for (int j : a) common += b.count(j);
    EXPECT_GT(static_cast<double>(common) / a.size(), 0.75) << "layer " << l;
  }
}

TEST(Synth, FirstTokensAreAttentionSinks) {
  const auto p = decode_mean(6, 0);
  const double mean = 1.0 / p.size();
  EXPECT_GT(p[0], 20 * mean);
  EXPECT_GT(p[1], 20 * mean);
  EXPECT_LT(decode_mean(0, 0)[0], p[0] / 4);  // sinks form after the first layers
}

TEST(Synth, TextAttentionIsLocal) {
  // A user-instruction query attends its neighbour more than text 8 positions back.
  const auto& a = *observed().layers[4];
  const int P = a.prompt_len();
  double near = 0, far = 0;
  for (int h = 0; h < a.num_heads(); ++h)
    for (int r = P - 3; r < P; ++r) {
      near += a.prefill_window_row(h, r)[r - 1];
      far += a.prefill_window_row(h, r)[r - 8];
    }
  EXPECT_GT(near, 2 * far);
}

TEST(Synth, VisionShareDecaysWithGeneratedLength) {
  double first = 0, last = 0;
  for (int l = 0; l < 8; ++l)
    for (int h = 0; h < 8; ++h) {
      first += vision_share(l, 0, h);
      last += vision_share(l, 31, h);
    }
  EXPECT_LT(last, 0.8 * first);
}

TEST(Synth, HeadsPreferAModality) {
  std::vector<double> share;
  for (int h = 0; h < 8; ++h) share.push_back(vision_share(5, 0, h));
  const auto [lo, hi] = std::minmax_element(share.begin(), share.end());
  EXPECT_GT(*hi - *lo, 0.25);
}

TEST(Synth, AdjacentLayersAttendAlike) {
  auto cosine = [](int l1, int l2) {
    const auto a = decode_mean(l1, 0), b = decode_mean(l2, 0);
    double ab = 0, aa = 0, bb = 0;
    for (std::size_t j = 0; j < a.size(); ++j)
      if (vision(static_cast<int>(j))) ab += a[j] * b[j], aa += a[j] * a[j], bb += b[j] * b[j];
    return ab / std::sqrt(aa * bb);
  };
  EXPECT_GT(cosine(5, 6), cosine(1, 7));
  EXPECT_GT(cosine(6, 7), 0.7);
}

TEST(Synth, DeterministicForASeed) {
  SynthConfig c = small_config();
  const LayerTensors a = synth_layer(c, 0, 3), b = synth_layer(c, 0, 3);
  EXPECT_EQ(a.q, b.q);
  EXPECT_EQ(a.k, b.k);
  EXPECT_EQ(a.v, b.v);
  c.seed = 2;
  EXPECT_NE(synth_layer(c, 0, 3).k, a.k);
  EXPECT_NE(synth_layer(small_config(), 1, 3).k, a.k);  // samples differ
}

double cosine(const float* a, const float* b, int d) {
  double ab = 0, aa = 0, bb = 0;
  for (int i = 0; i < d; ++i) ab += a[i] * b[i], aa += a[i] * a[i], bb += b[i] * b[i];
  return ab / std::sqrt(aa * bb);
}

TEST(Synth, NeighbouringPatchesHaveSimilarKeysAndValues) {
  // The 144 image tokens of the small config lie on a 12 x 12 grid from position 12. Horizontal
  // neighbours are on average far more alike than patches 6 rows apart, in keys and in values,
  // and across all image pairs key similarity and value similarity go together.
  const SynthConfig c = small_config();
  const LayerTensors t = synth_layer(c, 0, 4);
  const int first = 12, d = c.head_dim;
  double key_near = 0, key_far = 0, val_near = 0, val_far = 0;
  int n = 0;
  for (int g = 0; g < c.kv_heads; ++g)
    for (int y = 0; y < 6; ++y)
      for (int x = 0; x < 11; ++x, ++n) {
        const int a = first + y * 12 + x, b = a + 1, far = a + 6 * 12;
        key_near += cosine(&t.k(a, g, 0), &t.k(b, g, 0), d);
        key_far += cosine(&t.k(a, g, 0), &t.k(far, g, 0), d);
        val_near += cosine(&t.v(a, g, 0), &t.v(b, g, 0), d);
        val_far += cosine(&t.v(a, g, 0), &t.v(far, g, 0), d);
      }
  EXPECT_GT(key_near / n, 0.8);
  EXPECT_GT(val_near / n, 0.8);
  EXPECT_GT(key_near - key_far, 0.05 * n);
  EXPECT_GT(val_near - val_far, 0.1 * n);
  std::vector<double> ks, vs;
  for (int a = first; a < first + 144; a += 3)
    for (int b = a + 1; b < first + 144; b += 5)
      ks.push_back(cosine(&t.k(a, 0, 0), &t.k(b, 0, 0), d)),
          vs.push_back(cosine(&t.v(a, 0, 0), &t.v(b, 0, 0), d));
  const double mk = std::accumulate(ks.begin(), ks.end(), 0.0) / ks.size(),
               mv = std::accumulate(vs.begin(), vs.end(), 0.0) / vs.size();
  double kv = 0, kk = 0, vv = 0;
  for (std::size_t i = 0; i < ks.size(); ++i)
    kv += (ks[i] - mk) * (vs[i] - mv), kk += (ks[i] - mk) * (ks[i] - mk),
        vv += (vs[i] - mv) * (vs[i] - mv);
  EXPECT_GT(kv / std::sqrt(kk * vv), 0.5);
}

TEST(Synth, ValuesHaveAMeanAndSinksSmallValues) {
  // ‖mean of the values‖ is a large part of a typical ‖v‖ (a shared component), and the sinks'
  // values are sink_value_scale times smaller than the others'.
  const SynthConfig c = small_config();
  const LayerTensors t = synth_layer(c, 0, 2);
  const int T = static_cast<int>(t.v.shape(0)), d = c.head_dim;
  std::vector<double> mean(d, 0.0);
  double norms = 0, sink_norm = 0;
  for (int j = 0; j < T; ++j) {
    double n2 = 0;
    for (int e = 0; e < d; ++e) mean[e] += t.v(j, 0, e) / T, n2 += t.v(j, 0, e) * t.v(j, 0, e);
    (j < c.sinks ? sink_norm : norms) += std::sqrt(n2);
  }
  double m2 = 0;
  for (double x : mean) m2 += x * x;
  const double typical = norms / (T - c.sinks);
  EXPECT_GT(std::sqrt(m2) / typical, 0.4);
  EXPECT_LT(sink_norm / c.sinks, 0.3 * typical);
}

// Mean of the values of one modality (vision or not) of KV head 0, sinks left out.
std::vector<double> modality_value_mean(const LayerTensors& t, const SampleInfo& s, bool vis,
                                        int sinks) {
  const int d = static_cast<int>(t.v.shape(2));
  std::vector<double> mean(d, 0.0);
  int n = 0;
  for (int j = sinks; j < s.prompt_len; ++j)
    if ((s.modality[j] != 0) == vis) {
      ++n;
      for (int e = 0; e < d; ++e) mean[e] += t.v(j, 0, e);
    }
  for (auto& x : mean) x /= n;
  return mean;
}

TEST(Synth, VisionValueMeanSeparatesTheModalitiesValues) {
  // --vision-value-mean m adds to every vision token's value one vector of norm ≈ m·sqrt(d) (the
  // content part has unit variance per coordinate): the two modalities' mean values then differ
  // by about that much, and by far less without it. Keys and queries do not change.
  SynthConfig c = small_config();
  const SampleInfo s = synth_sample_info(c, 0);
  auto gap = [&](const LayerTensors& t) {
    const auto a = modality_value_mean(t, s, true, c.sinks),
               b = modality_value_mean(t, s, false, c.sinks);
    double g2 = 0;
    for (std::size_t e = 0; e < a.size(); ++e) g2 += (a[e] - b[e]) * (a[e] - b[e]);
    return std::sqrt(g2 / a.size());  // per coordinate
  };
  const LayerTensors plain = synth_layer(c, 0, 2);
  c.vision_value_mean = 1.5;
  const LayerTensors gapped = synth_layer(c, 0, 2);
  EXPECT_LT(gap(plain), 0.5);
  EXPECT_NEAR(gap(gapped), 1.5, 0.5);
  EXPECT_EQ(plain.k, gapped.k);
  EXPECT_EQ(plain.q, gapped.q);
  for (int j = 0; j < s.prompt_len; ++j)  // text values untouched
    if (s.modality[j] == 0) {
      EXPECT_EQ(plain.v(j, 1, 5), gapped.v(j, 1, 5)) << j;
    }
  c.vision_value_mean = -1;
  EXPECT_THROW(c.validate(), std::invalid_argument);
}

TEST(Synth, LayoutAndGqaShapes) {
  SynthConfig c = small_config();
  c.media_count = 2;
  c.video = true;
  const SampleInfo s = synth_sample_info(c, 0);
  EXPECT_EQ(s.prompt_len, 12 + 2 * 144 + 2 + 12);
  EXPECT_EQ(std::count(s.modality.begin(), s.modality.end(), 2), 288);
  EXPECT_EQ(*std::max_element(s.media_id.begin(), s.media_id.end()), 1);
  const LayerTensors t = synth_layer(c, 0, 0);
  EXPECT_EQ(t.q.shape(1), 8u);
  EXPECT_EQ(t.k.shape(1), 4u);
  c.kv_heads = 3;
  EXPECT_THROW(c.validate(), std::invalid_argument);
}

TEST(Synth, HiddenStateKnobsAreChecked) {
  auto rejects = [](auto change, const std::string& knob) {
    SynthConfig c = small_config();
    change(c);
    try {
      c.validate();
      ADD_FAILURE() << knob << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(knob), std::string::npos) << e.what();
    }
  };
  rejects([](SynthConfig& c) { c.region_share = 0.8, c.smooth_share = 0.3; }, "region-share");
  rejects([](SynthConfig& c) { c.key_rank = 0; }, "key-rank");
  rejects([](SynthConfig& c) { c.saliency_head_share = 1.5; }, "saliency-head-share");
  rejects([](SynthConfig& c) { c.key_modality_norm = 0; }, "key-modality-norm");
  rejects([](SynthConfig& c) { c.frame_correlation = -0.1; }, "frame-correlation");
}

}  // namespace
}  // namespace kvsim
