// Metric definitions (each cites the paper and figure it reproduces):
// - ε-sparsity (HAE Eq. 7, App. A.1): share of prompt attention entries p_ij <= ε. "causal" counts
//   the causal entries j <= i only; "masked" is the paper's code reading over the full P x P
//   matrix, where the masked entries (zeros) count as sparse. Split by the key's modality.
// - Concentration (MadaKV Sec. 3.2, A-VL Sec. 3): smallest share of a modality's prompt tokens
// whose
//   cumulative attention (column sums of the prompt attention) holds x of that modality's mass.
// - Cumulative-attention variance (HAE Fig. 2): population variance of the column sums over text
//   keys and over vision keys.
// - Modality share (MadaKV Fig. 2b): share of the prompt attention mass on text and vision keys.
// - Entropy (MEDA Fig. 2): mean row entropy of the prompt attention, and E_CM (Eq. 4-6), both
//   head-averaged (core/sample_stats.hpp).
// - Layer cosine (ST3 Eq. 4-5, Fig. 3): cosine of the last prompt token's head-averaged attention
//   over the prompt between every pair of layers.
// - PPCI (A-VL Eq. 2, Fig. 4-5) over the image tokens of the head-averaged attention: of each
// layer's
//   last prompt token vs layer 0's, and of each decode step vs step 0 within a layer (the same
//   quantity as ST3's top-k overlap, Eq. 10).
// - Segment share (ST3 Fig. 4b, A-VL Fig. 1): head-averaged decode attention mass on system, image,
//   user-instruction and generated tokens at every step.
// - DAP agreement (HAE Sec. 4.4, Fig. 4): for each r, of the vision tokens Dual-Attention Pruning
//   (Eq. 1-3, α) selects in layer 0, the share it also selects in layer l (NaN when none).
#include "analysis/attention_stats.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <set>
#include <stdexcept>

#include "analysis/key_similarity.hpp"
#include "core/layer_attention.hpp"
#include "core/partial_files.hpp"
#include "core/sample_stats.hpp"

namespace kvsim {

double ppci(const std::vector<double>& a, const std::vector<double>& b, double p) {
  const int n = static_cast<int>(a.size());
  if (n == 0) return NAN;
  const int k = std::max(1, static_cast<int>(std::ceil(p * n - 1e-9)));
  auto top = [&](const std::vector<double>& v) {
    std::vector<int> idx(n);
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(),
                     [&](int x, int y) { return v[x] != v[y] ? v[x] > v[y] : x > y; });
    return std::set<int>(idx.begin(), idx.begin() + k);
  };
  const auto ta = top(a), tb = top(b);
  int common = 0;
  for (int i : ta) common += tb.count(i);
  return static_cast<double>(common) / k;
}

double concentration(std::vector<double> values, double share) {
  if (values.empty()) return 0;
  std::sort(values.rbegin(), values.rend());
  const double total = std::accumulate(values.begin(), values.end(), 0.0);
  double acc = 0;
  for (std::size_t i = 0; i < values.size(); ++i)
    if ((acc += values[i]) >= share * total - 1e-12) return (i + 1.0) / values.size();
  return 1.0;
}

double cosine_similarity(const std::vector<double>& a, const std::vector<double>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    ab += a[i] * b[i], aa += a[i] * a[i], bb += b[i] * b[i];
  return aa > 0 && bb > 0 ? ab / std::sqrt(aa * bb) : NAN;
}

double population_variance(const std::vector<double>& v) {
  if (v.empty()) return NAN;
  const double mean = std::accumulate(v.begin(), v.end(), 0.0) / v.size();
  double s = 0;
  for (double x : v) s += (x - mean) * (x - mean);
  return s / v.size();
}

namespace {

std::vector<double> pick(const std::vector<double>& v, const std::vector<int>& idx) {
  std::vector<double> out;
  for (int i : idx) out.push_back(v[i]);
  return out;
}

// HAE Eq. 1-3 on one layer's head-averaged text-query statistics.
std::set<int> dap_selection(const LayerAttention& att, const std::vector<int>& vision, double r,
                            double alpha) {
  const float* sum = att.text_query_column_sums();
  const float* max = att.text_query_column_max();
  double total = 0;
  for (int j : vision) total += sum[j];
  std::set<int> out;
  for (int j : vision)
    if (sum[j] < r * total && max[j] < alpha) out.insert(j);
  return out;
}

// Per-head metrics of the prompt attention: sparsity, concentration, variance, modality share.
void head_metrics(const LayerAttention& att, const std::vector<int> (&keys)[2],
                  const StatsOptions& o, int l, SampleAttentionStats& s) {
  const int P = att.prompt_len(), H = att.num_heads(),
            nx = static_cast<int>(o.concentration.size());
  for (int h = 0; h < H; ++h) {
    const std::size_t lh = static_cast<std::size_t>(l) * H + h;
    const float* col = att.prefill_column_sums(h);
    std::vector<double> colsum(col, col + P);
    double below_all = 0, causal_all = 0, masked_all = 0, mass_all = 0;
    double mass[2] = {0, 0};
    for (int m = 0; m < 2; ++m) {
      double causal = 0, masked = 0;
      for (int j : keys[m]) causal += P - j, masked += j;
      const double below = att.sparse_entries(h, m);
      s.sparsity_causal[lh * 3 + 1 + m] = causal > 0 ? below / causal : NAN;
      s.sparsity_masked[lh * 3 + 1 + m] =
          keys[m].empty() ? NAN : (below + masked) / (static_cast<double>(P) * keys[m].size());
      below_all += below, causal_all += causal, masked_all += masked;
      const auto values = pick(colsum, keys[m]);
      for (int x = 0; x < nx; ++x)
        s.concentration[(lh * nx + x) * 2 + m] =
            keys[m].empty() ? NAN : concentration(values, o.concentration[x]);
      s.cumulative_variance[lh * 2 + m] = population_variance(values);
      mass[m] = std::accumulate(values.begin(), values.end(), 0.0);
      mass_all += mass[m];
    }
    s.sparsity_causal[lh * 3] = below_all / causal_all;
    s.sparsity_masked[lh * 3] = (below_all + masked_all) / (static_cast<double>(P) * P);
    for (int m = 0; m < 2; ++m) s.modality_share[lh * 2 + m] = mass[m] / mass_all;
  }
}

// Head-averaged decode attention of step t over all T positions.
std::vector<double> decode_mean(const LayerAttention& att, int t) {
  std::vector<double> m(att.total_len(), 0.0);
  for (int h = 0; h < att.num_heads(); ++h) {
    const float* p = att.decode_probs(t, h);
    for (int j = 0; j < att.total_len(); ++j) m[j] += p[j] / att.num_heads();
  }
  return m;
}

// Every statistic's array, NaN until computed.
SampleAttentionStats allocate_stats(int L, int H, int G, const StatsOptions& o) {
  const std::size_t nx = o.concentration.size(), np = o.ppci.size(), nr = o.dap_r.size(),
                    nq = o.key_quantiles.size();
  SampleAttentionStats s;
  s.layers = L, s.heads = H, s.steps = G;
  s.sparsity_causal.assign(static_cast<std::size_t>(L) * H * 3, NAN);
  s.sparsity_masked = s.sparsity_causal;
  s.concentration.assign(static_cast<std::size_t>(L) * H * nx * 2, NAN);
  s.cumulative_variance.assign(static_cast<std::size_t>(L) * H * 2, NAN);
  s.modality_share = s.cumulative_variance;
  s.entropy.assign(L, NAN);
  s.cross_modal_entropy.assign(L, NAN);
  s.entropy_mean_of_heads.assign(L, NAN);
  s.cross_modal_entropy_mean_of_heads.assign(L, NAN);
  s.layer_cosine.assign(static_cast<std::size_t>(L) * L, NAN);
  s.ppci_layers.assign(np * L, NAN);
  s.ppci_steps.assign(np * L * G, NAN);
  s.segment_share.assign(static_cast<std::size_t>(L) * G * 4, NAN);
  s.dap_agreement.assign(nr * L, NAN);
  s.key_nearest_cosine.assign(static_cast<std::size_t>(L) * 2 * nq, NAN);
  s.key_value_correlation.assign(static_cast<std::size_t>(L) * 2, NAN);
  return s;
}

// Layer l's entropies (HAE Eq. 3, 4) and key geometry, from its tensors alone.
void layer_geometry(const TraceInfo& info, const SampleInfo& sample, const LayerTensors& tensors,
                    int l, const StatsOptions& o, SampleAttentionStats& s) {
  const LayerEntropies e = layer_entropies(info, sample, tensors, o.threads);
  s.entropy[l] = e.full_of_mean;
  s.cross_modal_entropy[l] = e.cross_modal_unmasked_of_mean;  // Eq. 4 has no causal mask
  s.entropy_mean_of_heads[l] = e.full_mean_of_heads;
  s.cross_modal_entropy_mean_of_heads[l] = e.cross_modal_unmasked_mean_of_heads;
  const KeySimilarity ks = key_similarity(info, sample, tensors, o.threads);
  const std::size_t nq = o.key_quantiles.size();
  for (int m = 0; m < 2; ++m) {
    for (std::size_t x = 0; x < nq; ++x)
      s.key_nearest_cosine[(static_cast<std::size_t>(l) * 2 + m) * nq + x] =
          quantile(ks.nearest[m], o.key_quantiles[x]);
    s.key_value_correlation[static_cast<std::size_t>(l) * 2 + m] = ks.key_value_correlation[m];
  }
}

// Layer l's decode steps: each step's PPCI against the first over the image keys, and the
// share of its attention on the system prompt, the images, the user's text and the answer.
void decode_metrics(const LayerAttention& att, const SampleInfo& sample,
                    const std::vector<int>& images, int l, const StatsOptions& o,
                    SampleAttentionStats& s) {
  const int L = s.layers, G = s.steps, P = sample.prompt_len;
  const int np = static_cast<int>(o.ppci.size());
  std::vector<double> step0;
  for (int t = 0; t < G; ++t) {
    const auto m = decode_mean(att, t);
    const auto img = pick(m, images);
    if (t == 0) step0 = img;
    for (int x = 0; x < np; ++x)
      s.ppci_steps[(static_cast<std::size_t>(x) * L + l) * G + t] = ppci(step0, img, o.ppci[x]);
    double* seg = &s.segment_share[(static_cast<std::size_t>(l) * G + t) * 4];
    std::fill(seg, seg + 4, 0.0);
    for (int j = 0; j <= P + t; ++j) {
      const int k = j >= P ? 3 : sample.modality[j] != 0 ? 1 : sample.segment[j] == 0 ? 0 : 2;
      seg[k] += m[j];
    }
  }
}

// Layer l's DAP selection at every r, and its agreement with layer 0's (`dap0`, set at l = 0).
void dap_metrics(const LayerAttention& att, const std::vector<int>& images, int l,
                 const StatsOptions& o, std::vector<std::set<int>>& dap0, SampleAttentionStats& s) {
  for (std::size_t r = 0; r < o.dap_r.size(); ++r) {
    const auto sel = dap_selection(att, images, o.dap_r[r], o.dap_alpha);
    if (l == 0) dap0[r] = sel;
    int common = 0;
    for (int j : dap0[r]) common += sel.count(j);
    s.dap_agreement[r * s.layers + l] =
        dap0[r].empty() ? NAN : static_cast<double>(common) / dap0[r].size();
  }
}

}  // namespace

SampleAttentionStats compute_attention_stats(const TraceReader& reader, const SampleInfo& sample,
                                             const StatsOptions& o,
                                             const std::function<void()>& on_layer) {
  const TraceInfo& info = reader.info();
  if (info.compact())
    throw std::invalid_argument(reader.path() +
                                " is a compact trace: the attention statistics (ε-sparsity, "
                                "key and value geometry of every prompt row) need every prompt "
                                "query; compute them on the full trace");
  const int L = info.num_layers, H = info.num_heads, P = sample.prompt_len;
  const int np = static_cast<int>(o.ppci.size());
  SampleAttentionStats s = allocate_stats(L, H, sample.gen_len, o);
  std::vector<int> keys[2], images;  // prompt keys by modality (0 text, 1 vision)
  for (int j = 0; j < P; ++j) keys[sample.modality[j] != 0].push_back(j);
  images = keys[1];
  const AttentionNeeds needs{.prefill_column_sums = true,
                             .prefill_window = 1,
                             .text_query_layers = L,
                             .sample_entropies = false,
                             .sparsity_epsilon = o.epsilon};
  std::vector<std::vector<double>> last_rows(L);  // head-averaged last prompt row per layer
  std::vector<std::set<int>> dap0(o.dap_r.size());
  LayerTensors tensors;
  for (int l = 0; l < L; ++l) {
    reader.read_layer_into(sample, l, tensors);
    layer_geometry(info, sample, tensors, l, o, s);
    LayerAttention att(info, sample, std::move(tensors), needs, o.threads);
    head_metrics(att, keys, o, l, s);
    last_rows[l].assign(P, 0.0);
    for (int h = 0; h < H; ++h) {
      const float* row = att.prefill_window_row(h, 0);
      for (int j = 0; j < P; ++j) last_rows[l][j] += row[j] / H;
    }
    for (int x = 0; x < np; ++x)
      s.ppci_layers[static_cast<std::size_t>(x) * L + l] =
          ppci(pick(last_rows[0], images), pick(last_rows[l], images), o.ppci[x]);
    decode_metrics(att, sample, images, l, o, s);
    dap_metrics(att, images, l, o, dap0, s);
    tensors = att.release_tensors();
    if (on_layer) on_layer();
  }
  for (int a = 0; a < L; ++a)
    for (int b = 0; b < L; ++b)
      s.layer_cosine[static_cast<std::size_t>(a) * L + b] =
          cosine_similarity(last_rows[a], last_rows[b]);
  return s;
}

namespace {

void write_array(hid_t group, const char* name, const std::vector<double>& data,
                 std::vector<hsize_t> dims, const std::string& doc, const std::string& path) {
  H5Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
  H5Handle d(H5Dcreate2(group, name, H5T_IEEE_F64LE, space.get(), H5P_DEFAULT,
                        h5_untimed_plist(H5P_DATASET_CREATE).get(), H5P_DEFAULT));
  if (!d.valid() || (!data.empty() && H5Dwrite(d.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL,
                                               H5P_DEFAULT, data.data()) < 0))
    throw TraceError(path + ": cannot write dataset '" + name + "': " + hdf5_last_error());
  h5_write_string_attr(d.get(), "doc", doc);
}

std::string join(const std::vector<double>& v) {
  std::string s;
  char buf[32];
  for (double x : v) {
    std::snprintf(buf, sizeof buf, "%g", x);
    s += (s.empty() ? "" : ",") + std::string(buf);
  }
  return s;
}

}  // namespace

std::vector<StatsDataset> stats_datasets(const SampleAttentionStats& s, const StatsOptions& o) {
  const std::size_t L = s.layers, H = s.heads, G = s.steps, nx = o.concentration.size(),
                    np = o.ppci.size(), nr = o.dap_r.size(), nq = o.key_quantiles.size();
  return {
      {"sparsity_causal",
       &s.sparsity_causal,
       {L, H, 3},
       "[layer, head, all|text keys|vision keys]: share of causal prompt entries <= epsilon"},
      {"sparsity_masked",
       &s.sparsity_masked,
       {L, H, 3},
       "[layer, head, all|text|vision]: same over the full P x P matrix, masked zeros counted "
       "(HAE code)"},
      {"concentration",
       &s.concentration,
       {L, H, nx, 2},
       "[layer, head, share (attr concentration), text|vision]: fraction of tokens holding that "
       "share of the modality's cumulative attention"},
      {"cumulative_variance",
       &s.cumulative_variance,
       {L, H, 2},
       "[layer, head, text|vision]: variance of the prompt-attention column sums"},
      {"modality_share",
       &s.modality_share,
       {L, H, 2},
       "[layer, head, text|vision]: share of the prompt attention mass"},
      {"entropy",
       &s.entropy,
       {L},
       "[layer]: mean row entropy of the head-averaged prompt attention (nats)"},
      {"cross_modal_entropy",
       &s.cross_modal_entropy,
       {L},
       "[layer]: MEDA E_CM (Eq. 4-6) of the head-averaged attention (nats)"},
      {"key_nearest_cosine",
       &s.key_nearest_cosine,
       {L, 2, nq},
       "[layer, text|vision key, quantile (attr key_quantiles)]: cosine of each prompt key to its "
       "most similar other prompt key of its KV head, pooled over KV heads"},
      {"key_value_correlation",
       &s.key_value_correlation,
       {L, 2},
       "[layer, text|vision]: Pearson correlation of key cosine and value cosine over pairs of "
       "prompt positions of that modality, pooled over KV heads"},
      {"entropy_mean_of_heads",
       &s.entropy_mean_of_heads,
       {L},
       "[layer]: mean over heads of each head's mean row entropy (nats)"},
      {"cross_modal_entropy_mean_of_heads",
       &s.cross_modal_entropy_mean_of_heads,
       {L},
       "[layer]: mean over heads of each head's E_CM (nats)"},
      {"layer_cosine",
       &s.layer_cosine,
       {L, L},
       "[layer, layer]: cosine of the last prompt token's head-averaged attention (ST3 Eq. 5)"},
      {"ppci_layers",
       &s.ppci_layers,
       {np, L},
       "[p (attr ppci), layer]: PPCI of image tokens vs layer 0, last prompt token (A-VL Eq. 2)"},
      {"ppci_steps",
       &s.ppci_steps,
       {np, L, G},
       "[p, layer, decode step]: PPCI of image tokens vs decode step 0 (A-VL Fig. 5, ST3 Eq. 10)"},
      {"segment_share",
       &s.segment_share,
       {L, G, 4},
       "[layer, decode step, system|image|user|generated]: head-averaged decode attention mass"},
      {"dap_agreement",
       &s.dap_agreement,
       {nr, L},
       "[r (attr dap_r), layer]: share of layer 0's DAP-selected vision tokens also selected in "
       "the layer (NaN: none in layer 0)"},
  };
}

void write_attention_stats(
    const std::string& path, const TraceReader& reader, const StatsOptions& o,
    const std::vector<std::pair<std::string, SampleAttentionStats>>& samples) {
  silence_hdf5_errors();
  const std::string tmp = begin_partial(path);
  {
    H5Handle f(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, h5_untimed_plist(H5P_FILE_CREATE).get(),
                         H5P_DEFAULT));
    if (!f.valid()) throw TraceError(path + ": cannot create file: " + hdf5_last_error());
    h5_write_string_attr(f.get(), "kind", "kvsim-stats");
    h5_write_string_attr(f.get(), "kvsim_version", KVSIM_VERSION);
    h5_write_string_attr(f.get(), "trace", reader.path());
    h5_write_string_attr(f.get(), "model", reader.info().model);
    h5_write_float_attr(f.get(), "epsilon", o.epsilon);
    h5_write_string_attr(f.get(), "concentration", join(o.concentration));
    h5_write_string_attr(f.get(), "ppci", join(o.ppci));
    h5_write_string_attr(f.get(), "dap_r", join(o.dap_r));
    h5_write_float_attr(f.get(), "dap_alpha", o.dap_alpha);
    h5_write_string_attr(f.get(), "key_quantiles", join(o.key_quantiles));
    for (const auto& [name, s] : samples) {
      H5Handle g = h5_require_group(f.get(), "samples/" + name);
      for (const StatsDataset& d : stats_datasets(s, o)) {
        const std::vector<hsize_t> dims(d.shape.begin(), d.shape.end());
        write_array(g.get(), d.name, *d.data, dims, d.doc, path);
      }
    }
    if (H5Fflush(f.get(), H5F_SCOPE_GLOBAL) < 0)
      throw TraceError(tmp + ": write failed: " + hdf5_last_error());
  }
  publish(path);
}

namespace {

// The mean of values[(l·heads + h)·stride + offset] over layers [first, last) and every head,
// NaN left out (NaN when nothing is left).
double band_mean(const std::vector<double>& values, int heads, int stride, int offset, int first,
                 int last) {
  double sum = 0;
  int n = 0;
  for (int l = first; l < last; ++l)
    for (int h = 0; h < heads; ++h) {
      const double v = values[(static_cast<std::size_t>(l) * heads + h) * stride + offset];
      if (std::isnan(v)) continue;
      sum += v;
      ++n;
    }
  return n ? sum / n : NAN;
}

// "mean [min, max]" over the samples' values (NaN left out), or "-".
std::string across_samples(const std::vector<double>& values) {
  double sum = 0, lo = INFINITY, hi = -INFINITY;
  int n = 0;
  for (double v : values) {
    if (std::isnan(v)) continue;
    sum += v;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
    ++n;
  }
  if (!n) return "-";
  char text[64];
  if (n == 1)
    std::snprintf(text, sizeof text, "%.3f", sum);
  else
    std::snprintf(text, sizeof text, "%.3f [%.3f, %.3f]", sum / n, lo, hi);
  return text;
}

}  // namespace

std::string stats_digest(const std::vector<std::pair<std::string, SampleAttentionStats>>& samples,
                         double epsilon) {
  if (samples.empty()) return "";
  const int layers = samples.front().second.layers, heads = samples.front().second.heads;
  const int bands = std::min(3, layers);
  char line[256];
  std::snprintf(line, sizeof line, "%-10s  %-26s  %s\n", "layers", "prompt sparsity (<= eps)",
                "prompt attention on vision keys");
  std::string out = line;
  for (int b = 0; b < bands; ++b) {
    const int first = layers * b / bands, last = layers * (b + 1) / bands;
    std::vector<double> sparsity, vision;
    for (const auto& [name, s] : samples) {
      sparsity.push_back(band_mean(s.sparsity_causal, heads, 3, 0, first, last));
      vision.push_back(band_mean(s.modality_share, heads, 2, 1, first, last));
    }
    const std::string range = last - first == 1
                                  ? std::to_string(first)
                                  : std::to_string(first) + "-" + std::to_string(last - 1);
    std::snprintf(line, sizeof line, "%-10s  %-26s  %s\n", range.c_str(),
                  across_samples(sparsity).c_str(), across_samples(vision).c_str());
    out += line;
  }
  std::snprintf(line, sizeof line,
                "(eps = %g; means over each band's layers and heads; %zu sample(s)%s)\n", epsilon,
                samples.size(), samples.size() > 1 ? ": their mean [min, max]" : "");
  return out + line;
}

}  // namespace kvsim
