// madakv: Modality Preference Adaptation + Hierarchical Compression Compensation
// (the MadaKV paper, Sec. 3.3, Eq. 6-11, Table 3 ablation).
//
// At the end of each layer's prefill, per KV head h:
//   ψ(i) = Σ_{j ∈ proxy} α_{j→i}: attention from the last `proxy` prompt tokens     (Eq. 7)
//   w_v = Σ_{i visual} ψ(i), w_t = Σ_{i text} ψ(i)                                     (Eq. 6)
//   k_v, k_t = the fewest visual / text tokens whose ψ reaches θ·w_v / θ·w_t           (Eq. 9)
// The head keeps b^{l,h} entries, split by Eq. 8 — the top round(w_v/(w_v+w_t)·b) visual and the
// rest text tokens by ψ (MPA) — and decoding appends without eviction.
//
// HCC, default reading (`hcc_reading = scaled`). The paper says HCC "ensures that the overall
// cache budget is maintained" while it "dynamically adjusts the eviction ratio based on the
// complexity of modality information", that a positive K^l means "the current layer has exceeded
// its budget" and a negative one that it "has a saved budget"; its results show HCC helping
// (Table 3), MadaKV ahead most below 10% (Sec. 4.3, Fig. 4) and memory in step with the budget
// (Table 2: 0.41 GiB at 20%, 0.16 GiB at 5%). So Eq. 9's needs set the *shape* of the allocation
// and the budget its *level*: every head's need n^{l,h} = k_v + k_t is scaled by one factor s
// for the whole sample so that the heads keep b^{l,h} = s·n^{l,h}, Σ b = L·H·B (in whole entries,
// each in [1, P]: a head at a bound is held there and s recomputed for the rest; the fractions go
// by largest remainder, ties to the lower layer and head). Eq. 10-11 are then applied unchanged
// with b^{l,h} as what a head spends:
//   K^l = (1/H) Σ_h (b^{l,h} - φ^l)                                                   (Eq. 10)
//   φ^{l+1} = φ^l - K^l / (L - l)   (l 1-based: the number of layers left after this one)  (Eq. 11)
// φ^1 = B, so φ^l is the budget not yet spent shared evenly by layers l..L, K^l what layer l spent
// beyond it, and the ledger never runs dry: layers with concentrated attention give entries to
// diffuse ones, and the total is the budget at every θ. θ only shapes the allocation (which
// layers and heads are diffuse); under `conserve` it also sets the total (docs/methods.md).
// The needs of every layer must be known before the first is cut: they come from the column sums
// of every layer's last `proxy` prompt rows (SampleStats::window_sums), which replay computes in a
// first pass and a live model has once its prefill has run; ψ is read from the same sums.
// With GQA, ψ sums the query heads of a KV head and the h of Eq. 10 runs over KV heads.
//
// Other readings of Eq. 10-11 (`hcc_reading`), kept because each changes results:
//   conserve      a head spends its unscaled need out of the budget not yet spent (L·H·B at layer
//                 0; one entry per later head set aside); when what is left cannot cover a
//                 layer's needs its heads share the shortfall. θ then sets the total: at θ = 0.9
//                 the synthetic demo's needs are 1.85x the 20% budget, layers 0-9 spend them and
//                 layers 11-31 keep 1 entry per head (a note says where the budget ran dry);
//   conserve_capped  conserve with a head capped at (1 + max_overspend)·φ^l entries and the last
//                 layer spending everything left (at small θ several times the budget);
//   literal       the layer keeps φ^l per head (Eq. 8 as printed), K^l = Σ_h (k_v + k_t - φ^l)
//                 charges the need, H times a per-head quantity, to later layers: budgets
//                 collapse towards one entry whenever θ-sparsity exceeds the budget (the layer
//                 never spent the surplus it is charged for), so the budget is not maintained;
//   literal_mean  the same with K^l divided by H;
//   need          each layer keeps its Eq. 9 sets whatever φ^l is: the budget plays no part.
// Other readings chosen: proxy = the last 8 prompt tokens ("a few"); θ = 0.9 (Sec. 3.2: "20% of
// tokens capture nearly 90%"); budgets are whole entries in [1, P]; a modality with fewer tokens
// than its share passes the rest to the other. mpa = false keeps the top b^{l,h} of all tokens by
// ψ; hcc = false keeps φ^l = budget in every layer (Table 3).
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
        max_overspend_(p.get_float("max_overspend")),
        mpa_(p.get_bool("mpa")),
        hcc_(p.get_bool("hcc")),
        reading_(p.get_string("hcc_reading")),
        phi_(budget_) {}

  void on_prefill(const LayerView& view, KvCache& cache) override {
    const int P = view.prompt_len(), heads = cache.kv_heads();
    if (ledger() && view.layer() == 0) {
      unspent_ = static_cast<long>(view.num_layers()) * heads * std::min(budget_, P);
      if (reading_ == "scaled") scaled_ = scaled_spending(view, heads, unspent_);
    }
    std::vector<Head> hs(heads);
    for (int g = 0; g < heads; ++g)
      hs[g] = analyse_head(view, proxy_importance(view, view.layer(), g));
    const std::vector<int> keep = kept_per_head(view, hs);
    psi_.resize(heads);
    for (int g = 0; g < heads; ++g) {
      if (keep[g] < P) cache.keep_only(g, select(hs[g], keep[g]));
      psi_[g] = std::move(hs[g].psi);
    }
    if (view.layer() == view.num_layers() - 1) note_dry_layers(view.num_layers());
  }

  void on_decode(const LayerView&, const StepAttention&, KvCache&) override {}
  // Proxy-token importance ψ (Eq. 7), which it selects by (`decode = cap` evicts by it).
  const std::vector<double>* eviction_scores(int, int g) const override {
    return g < static_cast<int>(psi_.size()) ? &psi_[g] : nullptr;
  }

 private:
  std::vector<std::vector<double>> psi_;  // [kv head][prompt position] of the last prefill

  struct Head {
    std::vector<double> psi;
    std::vector<std::uint8_t> is_text;
    std::vector<int> vis, txt;
    double wv = 0, wt = 0;
    int kv = 0, kt = 0;  // Eq. 9
    int need() const { return kv + kt; }
  };

  // The readings that spend out of a ledger of unspent entries (Eq. 11 as a running balance).
  bool ledger() const {
    return hcc_ && (reading_ == "scaled" || reading_.rfind("conserve", 0) == 0);
  }
  // The scaled reading reads ψ of every layer from the sample statistics, before any cut.
  bool reads_sample_stats() const { return hcc_ && reading_ == "scaled"; }

  Head analyse_head(const LayerView& view, std::vector<double> psi) const {
    Head h;
    h.psi = std::move(psi);
    h.is_text.resize(view.prompt_len());
    for (int j = 0; j < view.prompt_len(); ++j) {
      h.is_text[j] = view.modality()[j] == 0;
      (h.is_text[j] ? h.txt : h.vis).push_back(j);
    }
    h.wv = sum_of(h.psi, h.vis);
    h.wt = sum_of(h.psi, h.txt);
    h.kv = fewest_reaching(h.psi, h.vis, theta_ * h.wv);
    h.kt = fewest_reaching(h.psi, h.txt, theta_ * h.wt);
    return h;
  }

  // Entries each KV head keeps in this layer, and the next layer's φ (Eq. 10-11).
  std::vector<int> kept_per_head(const LayerView& view, const std::vector<Head>& hs) {
    const int P = view.prompt_len(), heads = static_cast<int>(hs.size());
    if (!hcc_) return std::vector<int>(heads, std::min(P, budget_));
    if (ledger()) {
      std::vector<int> spend(heads);
      for (int g = 0; g < heads; ++g)
        spend[g] = reading_ == "scaled" ? scaled_[view.layer()][g] : hs[g].need();
      return conserving_budgets(view, spend);
    }
    const int phi = std::clamp(static_cast<int>(std::lround(phi_)), 1, P);
    double overflow = 0;  // Σ_h (k_v + k_t - φ^l)
    std::vector<int> keep(heads, phi);
    for (int g = 0; g < heads; ++g) {
      overflow += hs[g].need() - phi;
      if (reading_ == "need") keep[g] = hs[g].need();
    }
    if (reading_ == "literal_mean") overflow /= heads;
    const int layers_left = view.num_layers() - view.layer() - 1;
    if (layers_left > 0) phi_ -= overflow / layers_left;
    return keep;
  }

  // scaled: every layer's Eq. 9 needs, scaled by one factor to the sample's budget `total`.
  std::vector<std::vector<int>> scaled_spending(const LayerView& view, int heads,
                                                long total) const {
    const int L = view.num_layers();
    std::vector<int> need;
    for (int l = 0; l < L; ++l)
      for (int g = 0; g < heads; ++g)
        need.push_back(analyse_head(view, proxy_importance(view, l, g)).need());
    const std::vector<int> flat = scale_to_total(need, total, view.prompt_len());
    std::vector<std::vector<int>> out(L);
    for (int l = 0; l < L; ++l)
      out[l].assign(flat.begin() + l * heads, flat.begin() + (l + 1) * heads);
    return out;
  }

  // b_i = s·need_i in whole entries with Σ b = total and 1 <= b <= P: a head beyond a bound is
  // held there and s recomputed for the others (one bound binds: s < 1 can only reach 1, s > 1
  // only P, as 1 <= need <= P); the fractions go by largest remainder, ties to the lower index.
  static std::vector<int> scale_to_total(const std::vector<int>& need, long total, int P) {
    const std::size_t n = need.size();
    std::vector<double> share(n);
    std::vector<int> bound(n, 0);  // 0: scaled, else the bound it is held at
    for (bool changed = true; changed;) {
      changed = false;
      double free_need = 0, free_total = static_cast<double>(total);
      for (std::size_t i = 0; i < n; ++i) bound[i] ? free_total -= bound[i] : free_need += need[i];
      const double s = free_need > 0 ? free_total / free_need : 0;
      for (std::size_t i = 0; i < n; ++i) {
        if (bound[i]) continue;
        share[i] = s * need[i];
        if (share[i] > P || share[i] < 1) bound[i] = share[i] > P ? P : 1, changed = true;
      }
    }
    std::vector<int> out(n);
    long given = 0;
    for (std::size_t i = 0; i < n; ++i)
      given += out[i] = bound[i] ? bound[i] : static_cast<int>(std::floor(share[i] + 1e-9));
    std::vector<std::size_t> order(n);
    for (std::size_t i = 0; i < n; ++i) order[i] = i;
    const auto frac = [&](std::size_t i) { return bound[i] ? -1.0 : share[i] - out[i]; };
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return frac(a) > frac(b); });
    for (std::size_t k = 0; given < total && k < n; ++k)
      if (out[order[k]] < P) ++out[order[k]], ++given;
    return out;
  }

  // The ledger readings: heads spend `spend` out of the budget not yet spent (L·H·B at layer 0);
  // φ^l = unspent / (H · layers left including this one) is Eq. 11's φ^l.
  std::vector<int> conserving_budgets(const LayerView& view, const std::vector<int>& spend) {
    const int P = view.prompt_len(), heads = static_cast<int>(spend.size());
    const long later = static_cast<long>(view.num_layers() - view.layer() - 1) * heads;
    const bool capped = reading_ == "conserve_capped";
    int cap = P;
    if (capped) {
      const double phi = static_cast<double>(unspent_) / (heads + later);
      cap = static_cast<int>(
          std::clamp(std::floor((1 + max_overspend_) * phi + 1e-9), 1.0, static_cast<double>(P)));
    }
    std::vector<int> keep(heads);
    long total = 0;
    for (int g = 0; g < heads; ++g) total += keep[g] = std::clamp(spend[g], 1, cap);
    // One entry is set aside for every head of every later layer; conserve_capped also makes the
    // later layers able to spend what is left (at most P each), so its last layer spends it all.
    const long most = unspent_ - later;
    const long least = capped ? std::max<long>(unspent_ - later * P, heads) : heads;
    const long target =
        std::clamp(total, least, std::min<long>(most, static_cast<long>(heads) * P));
    if (target < total) dry_layers_.push_back(view.layer());
    share_difference(keep, target - total, P);
    for (int k : keep) unspent_ -= k;
    return keep;
  }

  // Says where a ledger ran dry: the layers that kept less than their Eq. 9 needs.
  void note_dry_layers(int layers) {
    if (dry_layers_.empty()) return;
    note("madakv: with hcc_reading = " + reading_ + " the budget ran dry at layer " +
         std::to_string(dry_layers_.front()) + ": " + std::to_string(dry_layers_.size()) + " of " +
         std::to_string(layers) +
         " layers kept less than their Eq. 9 needs (hcc_reading = scaled keeps every layer's "
         "share of the budget)");
  }

  // Adds `diff` entries (or removes -diff) as evenly as possible over the heads, within [1, P].
  static void share_difference(std::vector<int>& keep, long diff, int P) {
    while (diff != 0) {
      int movable = 0;
      for (int k : keep) movable += diff > 0 ? k < P : k > 1;
      if (movable == 0) return;
      const long each = std::max<long>(1, std::labs(diff) / movable);
      for (int& k : keep) {
        if (diff == 0) break;
        const long room = diff > 0 ? P - k : k - 1;
        const long step = std::min({each, room, std::labs(diff)});
        k += static_cast<int>(diff > 0 ? step : -step);
        diff += diff > 0 ? -step : step;
      }
    }
  }

  // Eq. 8: the head's n entries split by its modality preference (MPA), or the top n by ψ.
  // The `need` reading keeps the Eq. 9 sets themselves.
  std::vector<std::uint8_t> select(const Head& h, int n) const {
    if (!mpa_) return keep_top_scores(h.psi, n);
    if (hcc_ && reading_ == "need") return keep_with_quotas(h.psi, h.is_text, h.kt, h.kv);
    return modality_split(h.psi, h.is_text, h.vis, h.txt, h.wv, h.wt, n);
  }

  // Eq. 7, per KV head of layer l: attention from the proxy rows, summed over its query heads —
  // from the layer's view, or from the sample statistics (every layer) under `scaled`.
  std::vector<double> proxy_importance(const LayerView& view, int l, int g) const {
    if (!reads_sample_stats()) return view.window_group_sums(g, proxy_);
    const int P = view.prompt_len(), group = view.group_size();
    std::vector<double> psi(P, 0.0);
    for (int r = 0; r < group; ++r) {
      const double* sums = view.sample_stats().window_column_sums(proxy_, l, g * group + r, P);
      for (int j = 0; j < P; ++j) psi[j] += sums[j];
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
  double theta_, max_overspend_;
  bool mpa_, hcc_;
  std::string reading_;
  double phi_;        // φ^l of the next layer to prefill (literal readings)
  long unspent_ = 0;  // entries not yet kept, summed over layers and heads (ledger readings)
  std::vector<std::vector<int>> scaled_;  // [layer][kv head]: b^{l,h} (scaled)
  std::vector<int> dry_layers_;           // layers that kept less than their needs
};

const PolicyRegistration reg({
    .name = "madakv",
    .summary = "Per-head modality budgets from proxy-token preference, with inter-layer "
               "compression compensation from modality sparsity.",
    .provenance = "MadaKV: Adaptive Modality-Perception KV Cache Eviction (Li, Jiang et al.), Sec. "
                  "3.3 Eq. 6-11, Table 3",
    .params =
        {budget_param(),
         budget_rounding_param(false),
         {"proxy", ParamType::kInt, "8", "proxy tokens: the last prompt tokens (Eq. 7)", 1, 1e9},
         {"theta", ParamType::kFloat, "0.9", "sparsity threshold θ (Eq. 9)", 0, 1},
         {"mpa", ParamType::kBool, "true", "modality preference adaptation (Eq. 6-8)"},
         {"hcc", ParamType::kBool, "true", "hierarchical compression compensation (Eq. 9-11)"},
         {"hcc_reading",
          ParamType::kChoice,
          "scaled",
          "reading of Eq. 10-11: scaled (every layer's Eq. 9 needs scaled by one factor to "
          "the budget, L*H*B in all, then Eq. 10-11 as a ledger), conserve (heads keep their "
          "unscaled need out of what is left, later layers pay or gain, the total is at most "
          "L*H*B), conserve_capped (the same "
          "with a head capped at (1 + max_overspend) * phi^l and the last layer spending "
          "all that is left), literal (keep phi, charge the sum of the needs), literal_mean "
          "(the same divided by H), need (keep the Eq. 9 sets, no budget)",
          0,
          0,
          {"scaled", "conserve", "conserve_capped", "literal", "literal_mean", "need"}},
         {"max_overspend", ParamType::kFloat, "1",
          "conserve_capped: a head keeps at most (1 + max_overspend) * phi^l entries", 0, 1e9}},
    .switches = {.decode = true},
    .needs_for =
        [](const ParamSet& p) {
          const int proxy = static_cast<int>(p.get_int("proxy"));
          if (p.get_bool("hcc") && p.get_string("hcc_reading") == "scaled")
            return AttentionNeeds{.sample_window_sums = {proxy}};
          return AttentionNeeds{.window_group_sums = {proxy}};
        },
    .create = [](const ParamSet& p, const SampleInfo& s) -> std::unique_ptr<Policy> {
      return std::make_unique<MadaKV>(p, s);
    },
});

}  // namespace
}  // namespace kvsim
