// Synthetic attention structure. Queries and keys are built from a few named directions so that
// each observation of the papers is one term of the logit scale·q_i·k_j (before the layer's
// sharpness factor γ_l):
//
//   locality(i-j)           rotary kernel Σ_f r_f² cos((i-j)θ_f) over the fast pairs: local,
//                           fast-decaying text attention (vision keys weighted by vision_locality)
//   + sink_strength         on the first `sinks` positions (attention sinks)
//   + offset_h(t)           on vision keys: vision_offset + head preference - vision decay with
//                           generated length (heads preferring one modality; vision share falls
//                           as generation proceeds, ST³ Fig. 4b / A-VL Fig. 1)
//   - pref_h                on text keys
//   + a_l · s_l,j(φ_t)      vision saliency: a per-token field, AR(1)-correlated across layers
//                           (adjacent layers attend alike, ST³ Fig. 3), with spread a_l growing
//                           with depth (dense early, concentrated deep, HAE Fig. 2/3), read by
//                           the query along a direction that rotates slowly with the decode step
//                           (salient set drifts slowly, A-VL Fig. 5)
//   + noise
//
// Content terms live in the slowest rotary pairs, where RoPE barely rotates them, and the whole
// vectors are then rotated, so stored q/k are post-RoPE as the format requires.
//
// Every token has a hidden state h (hidden_dim wide, unit variance per coordinate), evolving over
// layers as an AR(1) with the layer correlation (the residual stream changes slowly). Queries,
// keys and values are projections of it, as in a real attention layer: the saliency terms are
// h·u along per-KV-head directions (partly shared by all heads, so important image tokens are
// important to many heads), the remaining key and query pairs are W_k h and W_q h, and
// v = W_v h + μ, with μ a value mean shared by the layer's tokens (real value vectors have a
// large common component; vision_value_mean adds a second one shared by the vision tokens, the
// modalities' separate cones) and sinks' values scaled down. Image tokens on their grid mix a
// region prototype (near-duplicate patches), a spatially smooth field and their own detail, so
// neighbouring patches have similar keys and similar values; video frames are correlated in
// time; text tokens are independent.
#include "traces/synth.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <utility>

#include "traces/mrope.hpp"

namespace kvsim {

namespace {

// SplitMix64: small, fast, and identical on every platform (std distributions are not).
struct Rng {
  std::uint64_t state;
  explicit Rng(std::uint64_t s) : state(s) {}
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return (next() >> 11) * (1.0 / 9007199254740992.0); }
  double gaussian() {
    const double u1 = std::max(uniform(), 1e-300), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

std::uint64_t mix_seed(std::uint64_t a, std::uint64_t b, std::uint64_t c = 0, std::uint64_t d = 0) {
  Rng r(a * 0x100000001B3ull ^ (b + 1) * 0x9E3779B97F4A7C15ull ^ (c + 7) * 0xC2B2AE3D27D4EB4Full ^
        (d + 13) * 0x165667B19E3779F9ull);
  r.next();
  return r.next();
}

// Rotary pair layout (Hugging Face rotate_half convention: pair f couples dims f and f + d/2).
struct Geometry {
  int d, pairs, content_first, noise_pairs;
  // The five named content directions, one rotary pair each (first dim of the pair).
  int sink, vision, text, sal1, sal2;
  explicit Geometry(int head_dim) : d(head_dim), pairs(head_dim / 2) {
    const int content = std::max(6, pairs / 4);
    content_first = pairs - content;
    sink = pairs - 1;
    vision = pairs - 2;
    text = pairs - 3;
    sal1 = pairs - 4;
    sal2 = pairs - 5;
    noise_pairs = content - 5;
  }
};

double lerp_layer(double first, double last, int layer, int layers) {
  return layers <= 1 ? first : first + (last - first) * layer / (layers - 1.0);
}

bool is_vision(std::uint8_t m) {
  return m != static_cast<std::uint8_t>(Modality::kText);
}

}  // namespace

void SynthConfig::validate() const {
  auto need = [](bool ok, const char* knob, const char* rule) {
    if (!ok) throw std::invalid_argument(std::string("synth: ") + knob + " " + rule);
  };
  need(layers >= 1, "layers", "must be >= 1");
  need(heads >= 1, "heads", "must be >= 1");
  need(kv_heads >= 1 && heads % kv_heads == 0, "kv-heads", "must divide heads");
  need(head_dim >= 16 && head_dim % 2 == 0, "head-dim", "must be even and >= 16");
  need(samples >= 1, "samples", "must be >= 1");
  need(system_tokens >= 0 && user_tokens >= 0 && separator_tokens >= 0,
       "system/user/separator tokens", "must be >= 0");
  need(media_count >= 0 && media_tokens >= 0, "media-count/media-tokens", "must be >= 0");
  need(gen_tokens >= 0, "gen-tokens", "must be >= 0");
  need(prompt_len() >= 1, "prompt", "must hold at least one token");
  need(sinks >= 0, "sinks", "must be >= 0");
  need(layer_correlation >= 0 && layer_correlation <= 1, "layer-correlation", "must be in [0, 1]");
  need(locality_width > 0, "locality-width", "must be > 0");
  need(rope_base > 1, "rope-base", "must be > 1");
  need(gen_decay_steps >= 1, "gen-decay-steps", "must be >= 1");
  need(write.gzip_level >= 0 && write.gzip_level <= 9, "gzip", "must be in [0, 9]");
  need(hidden_dim >= 1, "hidden-dim", "must be >= 1");
  need(key_rank >= 1, "key-rank", "must be >= 1");
  need(image_regions >= 1, "image-regions", "must be >= 1");
  need(region_share >= 0 && smooth_share >= 0 && region_share + smooth_share <= 1,
       "region-share/smooth-share", "must be >= 0 and sum to at most 1");
  need(smooth_length > 0, "smooth-length", "must be > 0");
  need(frame_correlation >= 0 && frame_correlation <= 1, "frame-correlation", "must be in [0, 1]");
  need(saliency_head_share >= 0 && saliency_head_share <= 1, "saliency-head-share",
       "must be in [0, 1]");
  need(value_mean >= 0, "value-mean", "must be >= 0");
  need(vision_value_mean >= 0, "vision-value-mean", "must be >= 0");
  need(key_modality_norm > 0, "key-modality-norm", "must be > 0");
  need(sink_value_scale >= 0, "sink-value-scale", "must be >= 0");
}

SampleInfo synth_sample_info(const SynthConfig& c, int index) {
  SampleInfo s;
  char name[16];
  std::snprintf(name, sizeof name, "%06d", index);
  s.name = name;
  s.prompt_len = c.prompt_len();
  s.gen_len = c.gen_tokens;
  s.task = "synthetic";
  s.has_v = c.with_v;
  s.dtype = c.write.dtype;
  const std::uint8_t media_modality =
      static_cast<std::uint8_t>(c.video ? Modality::kVideo : Modality::kImage);
  auto push = [&s](int n, std::uint8_t modality, std::uint8_t segment, int media) {
    for (int i = 0; i < n; ++i) {
      s.modality.push_back(modality);
      s.segment.push_back(segment);
      s.media_id.push_back(media);
    }
  };
  push(c.system_tokens, 0, 0, -1);
  for (int m = 0; m < c.media_count; ++m) {
    if (m > 0) push(c.separator_tokens, 0, 1, -1);
    push(c.media_tokens, media_modality, 1, m);
  }
  push(c.user_tokens, 0, 1, -1);
  push(c.gen_tokens, 0, 2, -1);
  // The user's tokens after the media are the question (a context-only compression appends them).
  if (c.user_tokens < s.prompt_len) s.question_len = c.user_tokens;
  if (c.mrope) s.position_ids = qwen2vl_position_ids(s);
  Rng rng(mix_seed(c.seed, index, 0xD0C));
  for (int i = 0; i < s.total_len(); ++i)
    s.token_ids.push_back(is_vision(s.modality[i]) ? 32000 : static_cast<int>(rng.next() % 32000));
  return s;
}

namespace {

// The Gaussian draws behind the hidden states: region prototypes [media, regions, m], the raw
// smooth field and the detail [T, m] (the detail is the whole state of a text token).
struct HiddenDraws {
  std::vector<double> proto, field, detail;
  HiddenDraws(const SynthConfig& c, int T)
      : proto(static_cast<std::size_t>(std::max(1, c.media_count)) * c.image_regions *
              c.hidden_dim),
        field(static_cast<std::size_t>(T) * c.hidden_dim),
        detail(field.size()) {}
  void draw(Rng& r) {
    for (auto* v : {&proto, &field, &detail})
      for (auto& x : *v) x = r.gaussian();
  }
  void ar1(const HiddenDraws& innovation, double rho) {
    const double w = std::sqrt(1.0 - rho * rho);
    for (auto [a, b] : {std::pair{&proto, &innovation.proto}, std::pair{&field, &innovation.field},
                        std::pair{&detail, &innovation.detail}})
      for (std::size_t i = 0; i < a->size(); ++i) (*a)[i] = rho * (*a)[i] + w * (*b)[i];
  }
};

// One image (or frame) on its grid: positions in the trace, grid width, region of each patch.
struct MediaGrid {
  std::vector<int> positions;
  int width = 1;
  std::vector<int> region;
};

std::vector<MediaGrid> media_grids(const SynthConfig& c, const SampleInfo& info, int sample) {
  std::vector<MediaGrid> grids(std::max(0, c.media_count));
  for (int j = 0; j < info.total_len(); ++j)
    if (is_vision(info.modality[j]) && info.media_id[j] >= 0)
      grids[info.media_id[j]].positions.push_back(j);
  for (int m = 0; m < static_cast<int>(grids.size()); ++m) {
    MediaGrid& g = grids[m];
    const int n = static_cast<int>(g.positions.size());
    g.width = std::max(1, static_cast<int>(std::ceil(std::sqrt(static_cast<double>(n)))));
    const int rows = (n + g.width - 1) / std::max(1, g.width);
    // Video frames share the first frame's layout: the scene persists, its content drifts.
    Rng r(mix_seed(c.seed, sample, 0x4E6, c.video ? 0 : m));
    std::vector<std::pair<double, double>> seeds(std::max(1, c.image_regions));
    for (auto& s : seeds) s = {r.uniform() * rows, r.uniform() * g.width};
    for (int t = 0; t < n; ++t) {
      const double y = t / g.width + 0.5, x = t % g.width + 0.5;
      int best = 0;
      double best_d = INFINITY;
      for (int k = 0; k < static_cast<int>(seeds.size()); ++k) {
        const double d = (y - seeds[k].first) * (y - seeds[k].first) +
                         (x - seeds[k].second) * (x - seeds[k].second);
        if (d < best_d) best_d = d, best = k;
      }
      g.region.push_back(best);
    }
  }
  return grids;
}

// Gaussian smoothing of a raw field over one grid, rescaled to unit variance at every patch.
std::vector<double> smooth_field(const SynthConfig& c, const MediaGrid& g, const double* raw) {
  const int n = static_cast<int>(g.positions.size()), m = c.hidden_dim, w = g.width;
  const int radius = static_cast<int>(std::ceil(2 * c.smooth_length));
  std::vector<double> out(static_cast<std::size_t>(n) * m, 0.0);
  for (int t = 0; t < n; ++t) {
    const int y = t / w, x = t % w;
    double norm = 0;
    double* o = &out[static_cast<std::size_t>(t) * m];
    for (int dy = -radius; dy <= radius; ++dy)
      for (int dx = -radius; dx <= radius; ++dx) {
        const int yy = y + dy, xx = x + dx, u = yy * w + xx;
        if (yy < 0 || xx < 0 || xx >= w || u >= n) continue;
        const double k = std::exp(-(dy * dy + dx * dx) / (2 * c.smooth_length * c.smooth_length));
        norm += k * k;
        const double* in = raw + static_cast<std::size_t>(g.positions[u]) * m;
        for (int e = 0; e < m; ++e) o[e] += k * in[e];
      }
    for (int e = 0; e < m; ++e) o[e] /= std::sqrt(norm);
  }
  return out;
}

// Hidden states [T, m] at `layer`: AR(1) over layers from the draws of layer 0, so each layer is
// reproducible on its own.
std::vector<double> hidden_states(const SynthConfig& c, const SampleInfo& info, int sample,
                                  int layer) {
  const int T = info.total_len(), m = c.hidden_dim;
  HiddenDraws z(c, T), innovation(c, T);
  Rng r0(mix_seed(c.seed, sample, 0x41D, 0));
  z.draw(r0);
  for (int l = 1; l <= layer; ++l) {
    Rng r(mix_seed(c.seed, sample, 0x41D, l));
    innovation.draw(r);
    z.ar1(innovation, c.layer_correlation);
  }
  std::vector<double> h = z.detail;  // text tokens: their own state
  const auto grids = media_grids(c, info, sample);
  const double a = std::sqrt(c.region_share), b = std::sqrt(c.smooth_share),
               e = std::sqrt(std::max(0.0, 1 - c.region_share - c.smooth_share));
  std::vector<double> previous;  // the previous frame's states (video)
  for (std::size_t g = 0; g < grids.size(); ++g) {
    const MediaGrid& grid = grids[g];
    const std::vector<double> field = smooth_field(c, grid, z.field.data());
    std::vector<double> frame(field.size());
    for (std::size_t t = 0; t < grid.positions.size(); ++t) {
      const double* proto =
          &z.proto[(g * c.image_regions + grid.region[t]) * static_cast<std::size_t>(m)];
      const double* detail = &z.detail[static_cast<std::size_t>(grid.positions[t]) * m];
      for (int k = 0; k < m; ++k)
        frame[t * m + k] = a * proto[k] + b * field[t * m + k] + e * detail[k];
    }
    if (c.video && !previous.empty() && previous.size() == frame.size()) {
      const double rho = c.frame_correlation, w = std::sqrt(1 - rho * rho);
      for (std::size_t i = 0; i < frame.size(); ++i) frame[i] = rho * previous[i] + w * frame[i];
    }
    for (std::size_t t = 0; t < grid.positions.size(); ++t)
      std::copy(&frame[t * m], &frame[t * m] + m,
                &h[static_cast<std::size_t>(grid.positions[t]) * m]);
    previous = std::move(frame);
  }
  return h;
}

// A [rows, m] Gaussian matrix scaled by 1/sqrt(m): W h has unit-variance entries.
std::vector<double> projection(std::uint64_t seed, int rows, int m) {
  std::vector<double> w(static_cast<std::size_t>(rows) * m);
  Rng r(seed);
  const double s = 1 / std::sqrt(static_cast<double>(m));
  for (auto& x : w) x = s * r.gaussian();
  return w;
}

// A [rows, m] projection of rank r (rows x r times r x m, each Gaussian), scaled so that W h
// still has unit-variance entries: keys see only r directions of the hidden state.
std::vector<double> low_rank_projection(std::uint64_t seed, int rows, int m, int r) {
  if (r >= std::min(rows, m)) return projection(seed, rows, m);
  const std::vector<double> a = projection(mix_seed(seed, 1), rows, r),
                            b = projection(mix_seed(seed, 2), r, m);
  std::vector<double> w(static_cast<std::size_t>(rows) * m, 0.0);
  for (int i = 0; i < rows; ++i)
    for (int k = 0; k < r; ++k)
      for (int j = 0; j < m; ++j)
        w[static_cast<std::size_t>(i) * m + j] +=
            a[static_cast<std::size_t>(i) * r + k] * b[static_cast<std::size_t>(k) * m + j];
  return w;
}

double project(const std::vector<double>& w, int row, const double* h, int m) {
  double s = 0;
  for (int k = 0; k < m; ++k) s += w[static_cast<std::size_t>(row) * m + k] * h[k];
  return s;
}

// Saliency directions of KV head `kv` (two rows): a share common to every head plus the head's
// own, the same in every layer (the AR(1) of h carries the layer correlation).
std::vector<double> saliency_directions(const SynthConfig& c, int kv) {
  const int m = c.hidden_dim;
  const std::vector<double> shared = projection(mix_seed(c.seed, 0x5A1, 0xA11), 2, m);
  const std::vector<double> own = projection(mix_seed(c.seed, 0x5A1, kv), 2, m);
  std::vector<double> u(shared.size());
  const double a = std::sqrt(c.saliency_head_share), b = std::sqrt(1 - c.saliency_head_share);
  for (std::size_t i = 0; i < u.size(); ++i) u[i] = a * shared[i] + b * own[i];
  return u;
}

// RoPE of token `position`, each pair f at its rotary position (traces/mrope.hpp: the token
// index, or its M-RoPE id on the pair's axis).
void rotate(float* x, int d, const std::vector<int>& mrope_section, const SampleInfo& sample,
            int position, double base) {
  const int half = d / 2;
  for (int f = 0; f < half; ++f) {
    const double theta =
        rotary_position(mrope_section, sample, position, f) * std::pow(base, -2.0 * f / d);
    const double cs = std::cos(theta), sn = std::sin(theta);
    const double a = x[f], b = x[f + half];
    x[f] = static_cast<float>(a * cs - b * sn);
    x[f + half] = static_cast<float>(a * sn + b * cs);
  }
}

// What every head of one (sample, layer) shares: the sample, the geometry of a head's
// dimensions, the rotary spectrum, the hidden states and the layer's attention shape.
struct LayerSetting {
  LayerSetting(const SynthConfig& config, int sample_index, int layer_index)
      : c(config),
        sample(sample_index),
        layer(layer_index),
        info(synth_sample_info(config, sample_index)),
        mrope_section(config.mrope ? qwen2vl_mrope_section(config.head_dim) : std::vector<int>{}),
        g(config.head_dim),
        gamma(lerp_layer(c.sharpness_first, c.sharpness_last, layer, c.layers)),
        spread(lerp_layer(c.saliency_first, c.saliency_last, layer, c.layers)),
        sink(c.sink_strength * std::min(1.0, layer / 2.0 + 0.2)),
        qscale(std::sqrt(static_cast<double>(c.head_dim))),  // cancels the trace's 1/sqrt(d)
        hidden(hidden_states(c, info, sample, layer)) {
    // Rotary spectrum shared by queries and keys: weight on fast pairs (local attention).
    spectrum.resize(g.content_first);
    double norm = 0;
    for (int f = 0; f < g.content_first; ++f) norm += spectrum[f] = std::exp(-f / c.locality_width);
    for (auto& s : spectrum) s = std::sqrt(s / norm);
  }
  const SynthConfig& c;
  int sample, layer;
  SampleInfo info;
  std::vector<int> mrope_section;
  Geometry g;
  double gamma, spread, sink, qscale;
  std::vector<double> hidden, spectrum;
};

// KV head kv's keys (and values) at every position.
void synth_kv_head(const LayerSetting& ls, int kv, LayerTensors& out) {
  const SynthConfig& c = ls.c;
  const Geometry& g = ls.g;
  const int T = ls.info.total_len(), d = c.head_dim, m = c.hidden_dim,
            content_dims = 2 * g.noise_pairs, layer = ls.layer;
  // The model's weights: the same for every sample.
  const std::vector<double> wk =
      low_rank_projection(mix_seed(c.seed, layer, kv, 0xCE7), content_dims, m, c.key_rank);
  const std::vector<double> wv = projection(mix_seed(c.seed, layer, kv, 0x7A1), d, m);
  const std::vector<double> u = saliency_directions(c, kv);
  std::vector<double> value_mean(d);
  Rng mean_rng(mix_seed(c.seed, layer, kv, 0x3EA));
  for (auto& x : value_mean) x = c.value_mean * mean_rng.gaussian();
  std::vector<double> vision_mean(d);
  for (auto& x : vision_mean) x = c.vision_value_mean * mean_rng.gaussian();
  for (int j = 0; j < T; ++j) {
    const double* hj = &ls.hidden[static_cast<std::size_t>(j) * m];
    float* k = &out.k(j, kv, 0);
    const bool vis = is_vision(ls.info.modality[j]);
    // Sinks draw attention by content alone: the rotary kernel's aliasing at long range would
    // otherwise make their share swing from step to step.
    const double w = j < c.sinks ? 0.0 : vis ? std::sqrt(c.vision_locality) : 1.0;
    for (int f = 0; f < g.content_first; ++f) k[f] = static_cast<float>(ls.spectrum[f] * w);
    // A sink's key is its own direction (norm A, its content left out): sinks are attention
    // dumps, unlike any content token.
    const bool is_sink = j < c.sinks;
    k[g.sink] = is_sink ? static_cast<float>(c.key_modality_norm) : 0.0f;
    // A modality component of norm A in the key and 1/A in the query: the logit is unchanged,
    // and keys of one modality share a large common direction, as real keys do.
    k[g.vision] = vis ? static_cast<float>(c.key_modality_norm) : 0.0f;
    k[g.text] = vis ? 0.0f : static_cast<float>(c.key_modality_norm);
    if (vis) {
      k[g.sal1] = static_cast<float>(project(u, 0, hj, m));
      k[g.sal2] = static_cast<float>(project(u, 1, hj, m));
    }
    for (int n = 0; n < g.noise_pairs && !is_sink; ++n) {
      k[g.content_first + n] = static_cast<float>(project(wk, 2 * n, hj, m));
      k[g.content_first + n + g.pairs] = static_cast<float>(project(wk, 2 * n + 1, hj, m));
    }
    rotate(k, d, ls.mrope_section, ls.info, j, c.rope_base);
    if (!c.with_v) continue;
    const double vscale = j < c.sinks ? c.sink_value_scale : 1.0;
    for (int e = 0; e < d; ++e)
      out.v(j, kv, e) = static_cast<float>(
          vscale * (project(wv, e, hj, m) + value_mean[e] + (vis ? vision_mean[e] : 0.0)));
  }
}

// Query head h at every position.
void synth_query_head(const LayerSetting& ls, int h, LayerTensors& out) {
  const SynthConfig& c = ls.c;
  const Geometry& g = ls.g;
  const int T = ls.info.total_len(), P = ls.info.prompt_len, d = c.head_dim, m = c.hidden_dim,
            content_dims = 2 * g.noise_pairs;
  const double noise_q = c.noise / std::sqrt(2.0 * std::max(1, g.noise_pairs));
  Rng head_rng(mix_seed(c.seed, ls.sample, 0xEAD, h));  // head traits persist across layers
  const double pref = (2 * head_rng.uniform() - 1) * c.head_preference;
  // Heads read the saliency plane along nearby directions (a shared phase, spread by the head's
  // own share): the tokens one head finds salient, most heads do.
  const double shared_phase =
      6.283185307179586 * Rng(mix_seed(c.seed, ls.sample, 0xEAD, ~0ull)).uniform();
  const double phase0 =
      shared_phase + (2 * head_rng.uniform() - 1) * M_PI * (1 - c.saliency_head_share);
  const std::vector<double> wq = projection(mix_seed(c.seed, ls.layer, h, 0x0E7), content_dims, m);
  for (int i = 0; i < T; ++i) {
    const double* hi = &ls.hidden[static_cast<std::size_t>(i) * m];
    float* q = &out.q(i, h, 0);
    const int t = std::max(0, i - P + 1);  // decode step index + 1 (0 in the prompt)
    const double decay = c.vision_decay * std::min(1.0, static_cast<double>(t) / c.gen_decay_steps);
    const double phase = phase0 + c.saliency_drift * t;
    const double s = ls.gamma * ls.qscale;
    for (int f = 0; f < g.content_first; ++f)
      q[f] = static_cast<float>(s * c.locality * ls.spectrum[f]);
    q[g.sink] = static_cast<float>(s * ls.sink / c.key_modality_norm);
    q[g.vision] = static_cast<float>(s * (c.vision_offset + pref - decay) / c.key_modality_norm);
    q[g.text] = static_cast<float>(s * -pref / c.key_modality_norm);
    q[g.sal1] = static_cast<float>(s * ls.spread * std::cos(phase));
    q[g.sal2] = static_cast<float>(s * ls.spread * std::sin(phase));
    for (int n = 0; n < g.noise_pairs; ++n) {
      q[g.content_first + n] = static_cast<float>(s * noise_q * project(wq, 2 * n, hi, m));
      q[g.content_first + n + g.pairs] =
          static_cast<float>(s * noise_q * project(wq, 2 * n + 1, hi, m));
    }
    rotate(q, d, ls.mrope_section, ls.info, i, c.rope_base);
  }
}

}  // namespace

LayerTensors synth_layer(const SynthConfig& c, int sample, int layer) {
  c.validate();
  const LayerSetting setting(c, sample, layer);
  const std::size_t T = setting.info.total_len(), d = c.head_dim;
  LayerTensors out;
  out.layer = layer;
  out.q = xt::zeros<float>({T, std::size_t(c.heads), d});
  out.k = xt::zeros<float>({T, std::size_t(c.kv_heads), d});
  if (c.with_v) out.v = xt::zeros<float>({T, std::size_t(c.kv_heads), d});
  for (int kv = 0; kv < c.kv_heads; ++kv) synth_kv_head(setting, kv, out);
  for (int h = 0; h < c.heads; ++h) synth_query_head(setting, h, out);
  return out;
}

void synth_write(const SynthConfig& c, const std::string& path,
                 const std::function<void(int, int)>& progress) {
  c.validate();
  TraceInfo info;
  info.model = c.model;
  info.num_layers = c.layers;
  info.num_heads = c.heads;
  info.num_kv_heads = c.kv_heads;
  info.head_dim = c.head_dim;
  info.rope_theta = c.rope_base;
  if (c.mrope) info.mrope_section = qwen2vl_mrope_section(c.head_dim);
  TraceWriter w(path, info, c.write);
  const int total = c.samples * c.layers;
  for (int s = 0; s < c.samples; ++s) {
    const SampleInfo si = synth_sample_info(c, s);
    w.write_sample(si);
    for (int l = 0; l < c.layers; ++l) {
      w.write_layer(si, synth_layer(c, s, l));
      if (progress) progress(s * c.layers + l + 1, total);
    }
  }
  w.close();
}

}  // namespace kvsim
