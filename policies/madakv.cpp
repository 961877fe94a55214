// madakv: Modality Preference Adaptation + Hierarchical Compression Compensation
// (paper 001_94695719419aacf3, Sec. 3.3, Eq. 6-11, Table 3 ablation).
//
// At the end of each layer's prefill, per KV head h:
//   ψ(i) = Σ_{j ∈ proxy} α_{j→i}: attention from the last `proxy` prompt tokens     (Eq. 7)
//   w_v = Σ_{i visual} ψ(i), w_t = Σ_{i text} ψ(i)                                     (Eq. 6)
//   φ_v = w_v / (w_v + w_t) · φ^l, φ_t = w_t / (w_v + w_t) · φ^l                      (Eq. 8)
// and the top φ_v visual and top φ_t text tokens by ψ are kept (MPA). Then (HCC)
//   k_v, k_t = the fewest visual / text tokens whose ψ reaches θ·w_v / θ·w_t           (Eq. 9)
//   K^l = Σ_h (k_v + k_t - φ^l)                                                         (Eq. 10)
//   φ^{l+1} = φ^l - K^l / (L - l)   (1-based l, i.e. the layers left after this one)     (Eq. 11)
// with φ^0 = budget. Decoding appends without eviction.
//
// Readings chosen (the paper leaves them open): proxy = the last 8 prompt tokens ("a few");
// θ = 0.9 (Sec. 3.2: "20% of tokens capture nearly 90%"); with GQA, ψ sums the query heads of a
// KV head and the h of Eq. 10 runs over KV heads; φ^l is rounded to a whole number of entries in
// [1, P], φ_v = round(share · φ^l) and φ_t = φ^l - φ_v, and a modality with fewer tokens than its
// share passes the rest to the other; the layer keeps φ^l per head as Eq. 8 says, and Eq. 10-11
// only move the next layers' budgets (`compensation = mean` divides K^l by the number of heads,
// since the literal sum moves budgets by H times a per-head quantity). Read literally, a layer
// whose θ-sparsity exceeds its budget shrinks every later budget without itself keeping more, so
// on diffuse attention budgets collapse towards one entry; `hcc_keep = need` is the other
// reading of "the current layer has exceeded its budget": the layer keeps its Eq. 9 sets and the
// later layers pay for it. mpa = false keeps the top φ^l (or k_v + k_t) of all tokens by ψ;
// hcc = false keeps φ^l = budget in every layer (Table 3).
#include <algorithm>
#include <cmath>

#include "policies/policy.hpp"
#include "policies/selection.hpp"

namespace kvsim {
namespace {

class MadaKV final : public Policy {
 public:
  MadaKV(const ParamSet& p, const SampleInfo& s)
      : budget_(resolve_budget(p, s.prompt_len, "madakv")),
        proxy_(static_cast<int>(p.get_int("proxy"))),
        theta_(p.get_float("theta")),
        mpa_(p.get_bool("mpa")),
        hcc_(p.get_bool("hcc")),
        mean_compensation_(p.get_string("compensation") == "mean"),
        keep_need_(p.get_string("hcc_keep") == "need"),
        phi_(budget_) {}

  void on_prefill(const LayerView& view, KvCache& cache) override {
    const int P = view.prompt_len();
    const int phi = std::clamp(static_cast<int>(std::lround(phi_)), 1, P);
    double overflow = 0;  // Σ_h (k_v + k_t - φ^l)
    for (int g = 0; g < cache.kv_heads(); ++g) {
      const std::vector<double> psi = proxy_importance(view, g);
      std::vector<int> vis, txt;
      std::vector<std::uint8_t> is_text(P);
      for (int j = 0; j < P; ++j) {
        is_text[j] = view.modality()[j] == 0;
        (is_text[j] ? txt : vis).push_back(j);
      }
      const double wv = sum_of(psi, vis), wt = sum_of(psi, txt);
      const int kv = fewest_reaching(psi, vis, theta_ * wv),
                kt = fewest_reaching(psi, txt, theta_ * wt);
      overflow += kv + kt - phi;
      if (hcc_ && keep_need_)  // the layer spends what Eq. 9 says it needs; later layers pay
        cache.keep_only(
            g, mpa_ ? keep_with_quotas(psi, is_text, kt, kv) : keep_top_scores(psi, kv + kt));
      else if (P > phi)
        cache.keep_only(g, mpa_ ? modality_split(psi, is_text, vis, txt, wv, wt, phi)
                                : keep_top_scores(psi, phi));
    }
    if (mean_compensation_) overflow /= cache.kv_heads();
    const int layers_left = view.num_layers() - view.layer() - 1;
    if (hcc_ && layers_left > 0) phi_ -= overflow / layers_left;
  }

  void on_decode(const LayerView&, const StepAttention&, KvCache&) override {}

 private:
  // Eq. 7, per KV head: attention from the proxy rows, summed over its query heads.
  std::vector<double> proxy_importance(const LayerView& view, int g) const {
    const LayerAttention& att = view.attention();
    const int rows = std::min(proxy_, att.prefill_window()), group = view.group_size();
    std::vector<double> psi(view.prompt_len(), 0.0);
    for (int r = 0; r < group; ++r)
      for (int w = att.prefill_window() - rows; w < att.prefill_window(); ++w) {
        const float* row = att.prefill_window_row(g * group + r, w);
        for (int j = 0; j < view.prompt_len(); ++j) psi[j] += row[j];
      }
    return psi;
  }

  static double sum_of(const std::vector<double>& psi, const std::vector<int>& idx) {
    double s = 0;
    for (int i : idx) s += psi[i];
    return s;
  }

  // Eq. 9: the size of the smallest subset whose ψ reaches `target` (the top of the ranking).
  static int fewest_reaching(const std::vector<double>& psi, const std::vector<int>& idx,
                             double target) {
    std::vector<double> s;
    for (int i : idx) s.push_back(psi[i]);
    std::sort(s.rbegin(), s.rend());
    double acc = 0;
    for (std::size_t n = 0; n < s.size(); ++n)
      if ((acc += s[n]) >= target - 1e-12) return static_cast<int>(n + 1);
    return static_cast<int>(s.size());
  }

  // Eq. 8: per-modality budgets from the head's preference, each filled by ψ.
  static std::vector<std::uint8_t> modality_split(const std::vector<double>& psi,
                                                  const std::vector<std::uint8_t>& is_text,
                                                  const std::vector<int>& vis,
                                                  const std::vector<int>& txt, double wv, double wt,
                                                  int phi) {
    const double share = wv + wt > 0 ? wv / (wv + wt) : 0.5;
    int nv = static_cast<int>(std::lround(share * phi));
    nv = std::min<int>(nv, vis.size());
    int nt = std::min<int>(phi - nv, txt.size());
    nv = std::min<int>(phi - nt, vis.size());  // a short modality passes its surplus on
    return keep_with_quotas(psi, is_text, nt, nv);
  }

  int budget_, proxy_;
  double theta_;
  bool mpa_, hcc_, mean_compensation_, keep_need_;
  double phi_;  // φ^l of the next layer to prefill
};

const PolicyRegistration reg({
    .name = "madakv",
    .summary = "Per-head modality budgets from proxy-token preference, with inter-layer "
               "compression compensation from modality sparsity.",
    .provenance = "MadaKV (paper 001), Sec. 3.3 Eq. 6-11, Table 3",
    .params = {budget_param(),
               {"proxy", ParamType::kInt, "8", "proxy tokens: the last prompt tokens (Eq. 7)", 1,
                1e9},
               {"theta", ParamType::kFloat, "0.9", "sparsity threshold θ (Eq. 9)", 0, 1},
               {"mpa", ParamType::kBool, "true", "modality preference adaptation (Eq. 6-8)"},
               {"hcc", ParamType::kBool, "true",
                "hierarchical compression compensation (Eq. 9-11)"},
               {"compensation",
                ParamType::kChoice,
                "sum",
                "K^l as the sum over heads (Eq. 10) or their mean",
                0,
                0,
                {"sum", "mean"}},
               {"hcc_keep",
                ParamType::kChoice,
                "budget",
                "what a layer keeps under HCC: its budget φ^l split by Eq. 8, or its need, the "
                "Eq. 9 sets (k_v visual + k_t text), with later layers paying the difference",
                0,
                0,
                {"budget", "need"}}},
    .needs = {},
    .lookahead = false,
    .merges = false,
    .needs_for =
        [](const ParamSet& p) {
          return AttentionNeeds{.prefill_column_sums = false,
                                .prefill_window = static_cast<int>(p.get_int("proxy"))};
        },
    .create = [](const ParamSet& p, const SampleInfo& s) -> std::unique_ptr<Policy> {
      return std::make_unique<MadaKV>(p, s);
    },
});

}  // namespace
}  // namespace kvsim
