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
#include "traces/synth.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

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
  Rng rng(mix_seed(c.seed, index, 0xD0C));
  for (int i = 0; i < s.total_len(); ++i)
    s.token_ids.push_back(is_vision(s.modality[i]) ? 32000 : static_cast<int>(rng.next() % 32000));
  return s;
}

namespace {

// Vision saliency fields s1, s2 per (kv head, position) at `layer`: AR(1) over layers from an
// i.i.d. standard normal field at layer 0, so each layer is reproducible on its own.
std::vector<double> saliency_fields(const SynthConfig& c, int sample, int layer, int T) {
  const std::size_t n = static_cast<std::size_t>(c.kv_heads) * T * 2;
  std::vector<double> z(n);
  Rng r0(mix_seed(c.seed, sample, 0x5A1, 0));
  for (auto& x : z) x = r0.gaussian();
  const double rho = c.layer_correlation, innov = std::sqrt(1.0 - rho * rho);
  for (int l = 1; l <= layer; ++l) {
    Rng r(mix_seed(c.seed, sample, 0x5A1, l));
    for (auto& x : z) x = rho * x + innov * r.gaussian();
  }
  return z;
}

void rotate(float* x, int d, int position, double base) {
  const int half = d / 2;
  for (int f = 0; f < half; ++f) {
    const double theta = position * std::pow(base, -2.0 * f / d);
    const double cs = std::cos(theta), sn = std::sin(theta);
    const double a = x[f], b = x[f + half];
    x[f] = static_cast<float>(a * cs - b * sn);
    x[f + half] = static_cast<float>(a * sn + b * cs);
  }
}

}  // namespace

LayerTensors synth_layer(const SynthConfig& c, int sample, int layer) {
  c.validate();
  const SampleInfo info = synth_sample_info(c, sample);
  const int T = info.total_len(), P = info.prompt_len, d = c.head_dim;
  const int H = c.heads, Hkv = c.kv_heads;
  const Geometry g(d);
  const double gamma = lerp_layer(c.sharpness_first, c.sharpness_last, layer, c.layers);
  const double spread = lerp_layer(c.saliency_first, c.saliency_last, layer, c.layers);
  const double sink = c.sink_strength * std::min(1.0, layer / 2.0 + 0.2);
  const double qscale = std::sqrt(static_cast<double>(d));  // cancels the trace's scale 1/sqrt(d)

  // Rotary spectrum shared by queries and keys: weight on fast pairs (local attention).
  std::vector<double> spectrum(g.content_first);
  double norm = 0;
  for (int f = 0; f < g.content_first; ++f) norm += spectrum[f] = std::exp(-f / c.locality_width);
  for (auto& s : spectrum) s = std::sqrt(s / norm);

  const std::vector<double> sal = saliency_fields(c, sample, layer, T);
  LayerTensors out;
  out.layer = layer;
  out.q = xt::zeros<float>({std::size_t(T), std::size_t(H), std::size_t(d)});
  out.k = xt::zeros<float>({std::size_t(T), std::size_t(Hkv), std::size_t(d)});
  if (c.with_v) out.v = xt::zeros<float>({std::size_t(T), std::size_t(Hkv), std::size_t(d)});

  for (int kv = 0; kv < Hkv; ++kv) {
    Rng rng(mix_seed(c.seed, sample, layer * 4096 + kv, 0xCE7));
    for (int j = 0; j < T; ++j) {
      float* k = &out.k(j, kv, 0);
      const bool vis = is_vision(info.modality[j]);
      // Sinks draw attention by content alone: the rotary kernel's aliasing at long range would
      // otherwise make their share swing from step to step.
      const double w = j < c.sinks ? 0.0 : vis ? std::sqrt(c.vision_locality) : 1.0;
      for (int f = 0; f < g.content_first; ++f) k[f] = static_cast<float>(spectrum[f] * w);
      k[g.sink] = j < c.sinks ? 1.0f : 0.0f;
      k[g.vision] = vis ? 1.0f : 0.0f;
      k[g.text] = vis ? 0.0f : 1.0f;
      if (vis) {
        const std::size_t idx = (static_cast<std::size_t>(kv) * T + j) * 2;
        k[g.sal1] = static_cast<float>(sal[idx]);
        k[g.sal2] = static_cast<float>(sal[idx + 1]);
      }
      for (int n = 0; n < g.noise_pairs; ++n) {
        k[g.content_first + n] = static_cast<float>(rng.gaussian());
        k[g.content_first + n + g.pairs] = static_cast<float>(rng.gaussian());
      }
      rotate(k, d, j, c.rope_base);
      if (c.with_v)
        for (int e = 0; e < d; ++e) out.v(j, kv, e) = static_cast<float>(rng.gaussian());
    }
  }

  const double noise_q = c.noise / std::sqrt(2.0 * std::max(1, g.noise_pairs));
  for (int h = 0; h < H; ++h) {
    Rng head_rng(mix_seed(c.seed, sample, 0xEAD, h));  // head traits persist across layers
    const double pref = (2 * head_rng.uniform() - 1) * c.head_preference;
    const double phase0 = 6.283185307179586 * head_rng.uniform();
    Rng rng(mix_seed(c.seed, sample, layer * 4096 + h, 0x0E7));
    for (int i = 0; i < T; ++i) {
      float* q = &out.q(i, h, 0);
      const int t = std::max(0, i - P + 1);  // decode step index + 1 (0 in the prompt)
      const double decay =
          c.vision_decay * std::min(1.0, static_cast<double>(t) / c.gen_decay_steps);
      const double phase = phase0 + c.saliency_drift * t;
      const double s = gamma * qscale;
      for (int f = 0; f < g.content_first; ++f)
        q[f] = static_cast<float>(s * c.locality * spectrum[f]);
      q[g.sink] = static_cast<float>(s * sink);
      q[g.vision] = static_cast<float>(s * (c.vision_offset + pref - decay));
      q[g.text] = static_cast<float>(s * -pref);
      q[g.sal1] = static_cast<float>(s * spread * std::cos(phase));
      q[g.sal2] = static_cast<float>(s * spread * std::sin(phase));
      for (int n = 0; n < g.noise_pairs; ++n) {
        q[g.content_first + n] = static_cast<float>(s * noise_q * rng.gaussian());
        q[g.content_first + n + g.pairs] = static_cast<float>(s * noise_q * rng.gaussian());
      }
      rotate(q, d, i, c.rope_base);
    }
  }
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
