// expected_attention: kvpress's ExpectedAttentionPress (NVIDIA/kvpress,
// kvpress/presses/expected_attention_press.py; Devoto et al. 2025, "Expected Attention: KV Cache
// Compression by Estimating Attention from Future Queries Distribution", arXiv 2510.00636): each
// prompt key is scored by the attention that queries at the next `future_positions` positions are
// expected to pay it, the queries modelled as a Gaussian fitted to the prompt's own (scorers.hpp
// documents the score). Each KV head keeps its B best, the `sinks` first positions always among
// them; decoding appends without eviction, as kvpress's prefill presses do (`decode` changes
// that: policies/decode_mode.cpp).
//
// kvpress fits the Gaussian to hidden states times q_proj.weight, before the rotary embedding;
// a trace stores queries after it, so the rotation is undone with the trace's rope_theta at each
// token's rotary positions: its index, or on a trace with M-RoPE position ids (Qwen2-VL,
// traces/mrope.hpp) its id on each pair's axis. The future queries sit at the positions after the
// prompt's largest id, as Qwen2-VL's decoding places them (rope_deltas); kvpress's press
// (written for plain RoPE) takes positions P.., which is the same on a plain trace. Scaled RoPE
// variants are not undone. On models with a query bias (Qwen2) kvpress's mean omits the bias and
// kvsim's includes it; the covariance is the same.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "policies/policy.hpp"
#include "policies/scorer_policy.hpp"
#include "policies/scorers.hpp"
#include "policies/selection.hpp"

namespace kvsim {

std::vector<ParamSpec> expected_attention_params() {
  return {
      {"future_positions", ParamType::kInt, "512",
       "expected attention: future query positions whose rotations are averaged "
       "(n_future_positions)",
       1, 1e9},
      {"sinks", ParamType::kInt, "4",
       "expected attention: first positions left out of the query statistics and always kept "
       "(n_sink)",
       0, 1e9},
      {"covariance", ParamType::kBool, "true",
       "expected attention: add the queries' covariance term (use_covariance)"},
      {"vnorm", ParamType::kBool, "true",
       "expected attention: multiply the scores by the value norms (use_vnorm)"},
      {"epsilon", ParamType::kFloat, "0", "expected attention: added to the scores before vnorm", 0,
       1e18},
      {"rope_theta", ParamType::kFloat, "0",
       "expected attention: rotary base of the stored queries; 0 reads the trace's rope_theta", 0,
       1e18},
  };
}

ExpectedAttentionScoring read_expected_attention(const ParamSet& p) {
  return {static_cast<int>(p.get_int("future_positions")),
          static_cast<int>(p.get_int("sinks")),
          p.get_bool("covariance"),
          p.get_bool("vnorm"),
          p.get_float("epsilon"),
          p.get_float("rope_theta")};
}

namespace {

// The rotation of RoPE at angle a per pair f (dimensions f and f + d/2), as transformers'
// apply_rotary_pos_emb: x'_f = x_f cos a - x_{f+h} sin a, x'_{f+h} = x_{f+h} cos a + x_f sin a.
void rotate(const double* c, const double* s, const double* x, double* out, int d) {
  const int h = d / 2;
  for (int f = 0; f < h; ++f) {
    out[f] = c[f] * x[f] - s[f] * x[f + h];
    out[f + h] = c[f] * x[f + h] + s[f] * x[f];
  }
}

// Per query head: μ̄ = R̄ μ and Σ̄ = R̄ Σ R̄ᵀ of the un-rotated queries at positions sinks .. P-1.
struct QueryGaussian {
  std::vector<double> mean;  // [d]
  std::vector<double> cov;   // [d, d], empty without the covariance term
};

// The rotations involved, per pair f: the inverse rotation of each query position sinks .. P-1
// at its rotary position on the pair (cos, -sin), and R̄, the mean over the next n positions
// (P .. P + n - 1 on a plain trace) of cos·I + sin·J.
struct Rotations {
  int pairs = 0;
  std::vector<double> cos, minus_sin;  // [position - first_position, pair]
  std::vector<double> mean_cos, mean_sin;
  Rotations(const LayerView& view, double theta, int first_position, int future) {
    const int d = view.head_dim(), prompt_len = view.prompt_len();
    pairs = d / 2;
    std::vector<double> inv_freq(pairs);
    for (int f = 0; f < pairs; ++f) inv_freq[f] = std::pow(theta, -2.0 * f / d);
    for (int i = first_position; i < prompt_len; ++i)
      for (int f = 0; f < pairs; ++f) {
        const int position = view.rotary_position(i, f);
        cos.push_back(std::cos(position * inv_freq[f]));
        minus_sin.push_back(-std::sin(position * inv_freq[f]));
      }
    mean_cos.assign(pairs, 0.0);
    mean_sin.assign(pairs, 0.0);
    const int next = view.next_rotary_position();
    for (int p = next; p < next + future; ++p)
      for (int f = 0; f < pairs; ++f) {
        mean_cos[f] += std::cos(p * inv_freq[f]) / future;
        mean_sin[f] += std::sin(p * inv_freq[f]) / future;
      }
  }
};

QueryGaussian query_gaussian(const LayerView& view, int head, const ExpectedAttentionScoring& s,
                             const Rotations& rot) {
  const int P = view.prompt_len(), d = view.head_dim(), n = P - s.sinks;
  std::vector<double> rows(static_cast<std::size_t>(n) * d), x(d);
  for (int i = s.sinks; i < P; ++i) {
    const std::size_t at = static_cast<std::size_t>(i - s.sinks) * rot.pairs;
    const float* q = view.query(i, head);
    for (int e = 0; e < d; ++e) x[e] = q[e];
    rotate(&rot.cos[at], &rot.minus_sin[at], x.data(),
           &rows[static_cast<std::size_t>(i - s.sinks) * d], d);
  }
  QueryGaussian out{std::vector<double>(d, 0.0), {}};
  std::vector<double> mu(d, 0.0);
  for (int r = 0; r < n; ++r)
    for (int e = 0; e < d; ++e) mu[e] += rows[static_cast<std::size_t>(r) * d + e] / n;
  const double* cbar = rot.mean_cos.data();
  const double* sbar = rot.mean_sin.data();
  rotate(cbar, sbar, mu.data(), out.mean.data(), d);
  if (!s.covariance) return out;
  for (int r = 0; r < n; ++r)
    for (int e = 0; e < d; ++e) rows[static_cast<std::size_t>(r) * d + e] -= mu[e];
  std::vector<double> cov(static_cast<std::size_t>(d) * d, 0.0);
  cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d, d, n, 1.0 / n, rows.data(), d,
              rows.data(), d, 0.0, cov.data(), d);
  // R̄ Σ R̄ᵀ: rotate every column, then every row.
  std::vector<double> col(d), tmp(static_cast<std::size_t>(d) * d);
  for (int b = 0; b < d; ++b) {
    for (int a = 0; a < d; ++a) x[a] = cov[a * d + b];
    rotate(cbar, sbar, x.data(), col.data(), d);
    for (int a = 0; a < d; ++a) tmp[a * d + b] = col[a];
  }
  out.cov.resize(static_cast<std::size_t>(d) * d);
  for (int a = 0; a < d; ++a) rotate(cbar, sbar, &tmp[a * d], &out.cov[a * d], d);
  return out;
}

}  // namespace

namespace {

void check_scoring(const LayerView& view, const ExpectedAttentionScoring& s, double theta,
                   const std::string& policy) {
  if (theta <= 1)
    throw std::invalid_argument(policy +
                                ": the trace has no rope_theta attribute (kvtrace-v1.md); set "
                                "parameter 'rope_theta' to the model's rotary base");
  if (view.prompt_len() <= s.sinks)
    throw std::invalid_argument(
        policy + ": the prompt (" + std::to_string(view.prompt_len()) +
        " tokens) must be longer than parameter 'sinks' = " + std::to_string(s.sinks));
  if (s.value_norm && !view.has_values())
    throw std::invalid_argument(policy +
                                ": vnorm = true needs the trace's values (or set vnorm "
                                "= false)");
}

// The softmax over the n keys after the sinks (rows of `keys`, d wide) of one query head's
// expected logits z_j = s μ̄·k_j + s²/2 k_jᵀ Σ̄ k_j, into z; `kcov` is scratch.
void expected_softmax(const QueryGaussian& gauss, const std::vector<double>& keys, int n, int d,
                      double scale, std::vector<double>& z, std::vector<double>& kcov) {
  cblas_dgemv(CblasRowMajor, CblasNoTrans, n, d, scale, keys.data(), d, gauss.mean.data(), 1, 0.0,
              z.data(), 1);
  if (!gauss.cov.empty()) {
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d, d, 1.0, keys.data(), d,
                gauss.cov.data(), d, 0.0, kcov.data(), d);
    for (int j = 0; j < n; ++j) {
      double quad = 0;
      for (int e = 0; e < d; ++e)
        quad +=
            kcov[static_cast<std::size_t>(j) * d + e] * keys[static_cast<std::size_t>(j) * d + e];
      z[j] += scale * scale / 2 * quad;
    }
  }
  const double zmax = *std::max_element(z.begin(), z.end());
  double sum = 0;
  for (double& x : z) sum += (x = std::exp(x - zmax));
  for (double& x : z) x /= sum;
}

}  // namespace

std::vector<std::vector<double>> expected_attention_scores(const LayerView& view,
                                                           const ExpectedAttentionScoring& s,
                                                           const std::string& policy) {
  const int P = view.prompt_len(), d = view.head_dim(), group = view.group_size();
  const double theta = s.rope_theta > 0 ? s.rope_theta : view.rope_theta();
  check_scoring(view, s, theta, policy);
  const Rotations rot(view, theta, s.sinks, s.future_positions);
  const int n = P - s.sinks;
  std::vector<std::vector<double>> scores(view.num_kv_heads(), std::vector<double>(P, 0.0));
  std::vector<double> keys(static_cast<std::size_t>(n) * d), z(n), kcov(keys.size());
  double top = -INFINITY;
  for (int g = 0; g < view.num_kv_heads(); ++g) {
    for (int j = 0; j < n; ++j) {
      const float* k = view.key(s.sinks + j, g);
      for (int e = 0; e < d; ++e) keys[static_cast<std::size_t>(j) * d + e] = k[e];
    }
    for (int r = 0; r < group; ++r) {
      expected_softmax(query_gaussian(view, g * group + r, s, rot), keys, n, d, view.scale(), z,
                       kcov);
      for (int j = 0; j < n; ++j) scores[g][s.sinks + j] += z[j] / group;
    }
    for (int j = s.sinks; j < P; ++j) {
      if (s.value_norm) {
        const float* v = view.value(j, g);
        double v2 = 0;
        for (int e = 0; e < d; ++e) v2 += double(v[e]) * v[e];
        scores[g][j] = (scores[g][j] + s.epsilon) * std::sqrt(v2);
      }
      top = std::max(top, scores[g][j]);
    }
  }
  for (auto& head : scores)
    for (int j = 0; j < s.sinks; ++j) head[j] = top;
  return scores;
}

namespace {

const PolicyRegistration reg(scorer_policy(
    {
        .name = "expected_attention",
        .summary = "Keeps the prompt entries future queries are expected to attend most, the "
                   "queries modelled as a Gaussian (kvpress's ExpectedAttentionPress).",
        .provenance = "Devoto et al. 2025 (arXiv 2510.00636); NVIDIA/kvpress "
                      "kvpress/presses/expected_attention_press.py (ExpectedAttentionPress)",
        .params = concat({budget_param(), budget_rounding_param(false)},
                         expected_attention_params()),
        .switches = {.decode = true, .question = true},
        .needs = {.prompt_queries = true},
    },
    [](const ParamSet& p, const SampleInfo&, int) {
      return PromptScorer{.score = [scoring = read_expected_attention(p)](const LayerView& view) {
        return expected_attention_scores(view, scoring, "expected_attention");
      }};
    }));

}  // namespace
}  // namespace kvsim
