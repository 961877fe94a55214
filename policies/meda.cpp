// meda: Multimodal Entropy-guided Dynamic Allocation with KV merging
// (the MEDA paper, Sec. 3.2-3.3 and 4.4).
//
// Layer budgets (Eq. 4-7): E_CM^l = -(E_TV^l + E_VT^l), the cross-modal attention entropy of the
// prompt (text queries over vision keys, vision queries over text keys) of the attention
// averaged over the layer's query heads ("A is average attention across multi-heads", Sec. 3.2).
// Eq. 4 is a plain softmax, A_TV = Softmax(Q_T K_V^T / sqrt(D)), with no causal mask: a text query
// sees every vision key of the prompt, later ones included, and the released code computes it the
// same way (`cross_modal_mask = causal` restricts each row to earlier keys, kvsim's earlier
// reading, which leaves the text before the first image without a row). Then
//   S_l = α_l · S,  α_l = softmax_l(E_CM) · L · ρ,
// with S the prompt length and ρ the compression ratio; kvsim's `budget` is ρ·S (so `10%` is
// ρ = 0.1, Table 1). Nothing in the paper says what happens when α_l leaves [0, 1] (App. A.3 only
// says the strategy "respects the general cache size and compression constraints"), so the
// default is the released code's (Dynamic-MLLMs/.../v433_modeling_dynamic_llama.py,
// LlamaModel.forward: torch.clamp(weights * layer_nums * rho, min=0.01, max=1.0)): each layer's
// ratio is clamped to [1%, 100%] of the prompt and a capped layer's surplus is dropped; sizes are
// rounded down, as its int(len · ratio), and a layer keeps at least one entry. The 1% floor can
// lift the layers' total above L · budget (the released code lets it); kvsim holds the budget:
// the excess comes out of the layers above the floor, in proportion to what each holds above it
// (hold_layer_total in selection.hpp). `surplus = redistribute` is kvsim's earlier rule: the
// share a capped layer cannot take goes to the other layers in proportion to their softmax
// weights, whole entries by largest remainder, so that Σ_l S_l = L · budget exactly
// (allocate_layer_budgets); a layer whose share falls below one entry is held at one, so none is
// emptied.
// Selection (Eq. 8-10): A_s = column sums of the prompt attention (summed over the KV head's
// query heads); text entries get + max(A_s) (Eq. 9); keep the M most recent entries and the top
// N of the others, M : N = 3 : 1 (Sec. 4.4, following LOOK-M), M = floor(recent_ratio · S_l).
// Merging (Eq. 11-12): every unselected entry joins the kept entry whose key is most
// cosine-similar (similarities against the kept keys as they were before merging), and each kept
// entry becomes the average of itself and its members, keys and values alike. Attention then uses
// the merged keys and values. Decoding appends without eviction.
//
// Readings chosen: `head_average = entropy` is the other reading of "head-averaged" (the mean of
// the heads' own entropies, which the attention's sharper heads pull down); each modality's term
// is the mean over the query rows that have at least one causally valid key of the other
// modality (the paper's 1/|T| and 1/|V| count every token, but a text token before the first
// image has no cross-modal row); video counts as vision; a key of zero norm has cosine 0 with
// every key; equal similarities merge into the newer kept entry. `entropy = full` and
// `compress_at = first_decode` are the released code's readings (entropy of the full attention
// map; compression at the first decode step, which then attends the full cache and whose token
// joins the recent window). `allocation = uniform` and `merge = false` are the ablations.
#include <algorithm>
#include <cmath>

#include "policies/merging.hpp"
#include "policies/policy.hpp"
#include "policies/selection.hpp"

namespace kvsim {
namespace {

class Meda final : public Policy {
 public:
  Meda(const ParamSet& p, const SampleInfo& s)
      : budget_(resolve_budget(p, s.prompt_len, "meda")),
        recent_ratio_(p.get_float("recent_ratio")),
        full_entropy_(p.get_string("entropy") == "full"),
        head_mean_(p.get_string("head_average") == "entropy"),
        at_first_decode_(p.get_string("compress_at") == "first_decode"),
        uniform_(p.get_string("allocation") == "uniform"),
        causal_cross_modal_(p.get_string("cross_modal_mask") == "causal"),
        redistribute_(p.get_string("surplus") == "redistribute"),
        merge_(p.get_bool("merge")) {}

  void on_prefill(const LayerView& view, KvCache& cache) override {
    priority_.clear();
    if (!at_first_decode_) compress(view, cache);
  }

  void on_decode(const LayerView& view, const StepAttention& att, KvCache& cache) override {
    if (at_first_decode_ && att.step == 0) compress(view, cache);
  }
  // The text-prior order it kept by (`decode = cap` evicts by it).
  const std::vector<double>* eviction_scores(int, int g) const override {
    return g < static_cast<int>(priority_.size()) ? &priority_[g] : nullptr;
  }

 private:
  // Eq. 7: this layer's entries, its ratio clamped to [1%, 100%] (the released code), or its share
  // of L · budget with capped layers' surplus redistributed.
  int layer_budget(const LayerView& view) const {
    const int P = view.prompt_len();
    if (uniform_) return std::min(P, budget_);
    const auto& layers = view.sample_stats().layers;
    std::vector<double> e;
    for (const LayerEntropies& le : layers) e.push_back(allocation_entropy(le));
    const double mx = *std::max_element(e.begin(), e.end());
    std::vector<double> weight;  // softmax_l(E), shifted by the maximum
    double sum = 0;
    for (double x : e) sum += weight.emplace_back(std::exp(x - mx));
    const long total = static_cast<long>(e.size()) * budget_;
    // Every layer keeps at least one entry (redistribute), or the released clamp's 1% of the
    // prompt and at least one (drop).
    if (redistribute_) return allocate_layer_budgets(weight, total, P, 1)[view.layer()];
    const double rho = static_cast<double>(budget_) / P;
    const int floor = std::max(1, static_cast<int>(std::floor(0.01 * P + 1e-9)));
    std::vector<int> sizes;
    for (double w : weight) {
      const double ratio = std::clamp(w / sum * e.size() * rho, 0.01, 1.0);
      sizes.push_back(std::max(floor, static_cast<int>(std::floor(ratio * P + 1e-9))));
    }
    // The floor can lift the layers above L · budget: the budget holds, the excess taken from
    // the layers above the floor (hold_layer_total).
    hold_layer_total(sizes, total, floor);
    return sizes[view.layer()];
  }

  double allocation_entropy(const LayerEntropies& le) const {
    if (full_entropy_) return head_mean_ ? le.full_mean_of_heads : le.full_of_mean;
    if (causal_cross_modal_)
      return head_mean_ ? le.cross_modal_mean_of_heads : le.cross_modal_of_mean;
    return head_mean_ ? le.cross_modal_unmasked_mean_of_heads : le.cross_modal_unmasked_of_mean;
  }

  void compress(const LayerView& view, KvCache& cache) {
    priority_.assign(cache.kv_heads(), {});
    const int S = layer_budget(view), P = view.prompt_len(), group = view.group_size();
    const int recent = static_cast<int>(std::floor(recent_ratio_ * S + 1e-9));
    for (int g = 0; g < cache.kv_heads(); ++g) {
      const int n = cache.size(g);
      if (n <= S) continue;
      std::vector<double> score(n, 0.0);  // Eq. 8, prompt entries; later tokens score 0
      for (int r = 0; r < group; ++r) {
        const float* col = view.prefill_column_sums(g * group + r);
        for (int e = 0; e < n; ++e)
          if (cache.position(g, e) < P) score[e] += col[cache.position(g, e)];
      }
      // Eq. 9 adds max(A_s) to every text score, which puts each text entry at or above every
      // vision entry: the shared text-prior selector (exact ties go to the text entry).
      std::vector<std::uint8_t> is_text(n);
      for (int e = 0; e < n; ++e) is_text[e] = view.modality()[cache.position(g, e)] == 0;
      const auto forced = sink_and_recent_mask(n, 0, recent);
      const auto keep = keep_text_prior(score, is_text, S, forced);  // Eq. 9-10
      const std::vector<double> order = text_prior_priority(score, is_text, forced);
      priority_[g].assign(cache.position(g, n - 1) + 1, kUnscored);
      for (int e = 0; e < n; ++e) priority_[g][cache.position(g, e)] = order[e];
      if (merge_)
        merge_unselected(view, cache, g, keep, MergeKind::kAverage);  // Eq. 11-12
      else
        cache.keep_only(g, keep);
    }
  }

  std::vector<std::vector<double>> priority_;  // [kv head][position]: the order it kept by
  int budget_;
  double recent_ratio_;
  bool full_entropy_, head_mean_, at_first_decode_, uniform_, causal_cross_modal_, redistribute_,
      merge_;
};

const PolicyRegistration reg({
    .name = "meda",
    .summary = "Cross-modal-entropy layer budgets, text-prior selection with a recent window, "
               "and average merging of every unselected entry into its most similar kept key.",
    .provenance = "MEDA: Dynamic KV Cache Allocation for Multimodal Long-Context Inference (Wan et "
                  "al.), Sec. 3.2-3.3 Eq. 4-12, Sec. 4.4",
    .params = {budget_param("10%"),
               budget_rounding_param(false),
               {"recent_ratio", ParamType::kFloat, "0.75",
                "share of a layer's budget kept as the recent window M (M : N = 3 : 1)", 0, 1},
               {"entropy",
                ParamType::kChoice,
                "cross_modal",
                "layer-allocation entropy: cross_modal (paper) or full (released code)",
                0,
                0,
                {"cross_modal", "full"}},
               {"head_average",
                ParamType::kChoice,
                "attention",
                "entropy of the head-averaged attention (paper) or mean of the heads' entropies",
                0,
                0,
                {"attention", "entropy"}},
               {"compress_at",
                ParamType::kChoice,
                "prefill",
                "prefill (paper) or first_decode (released code)",
                0,
                0,
                {"prefill", "first_decode"}},
               {"allocation",
                ParamType::kChoice,
                "entropy",
                "entropy-guided layer budgets, or uniform (ablation)",
                0,
                0,
                {"entropy", "uniform"}},
               {"cross_modal_mask",
                ParamType::kChoice,
                "none",
                "cross-modal attention of Eq. 4: none (every key of the other modality, as "
                "printed and released) or causal (earlier keys only)",
                0,
                0,
                {"none", "causal"}},
               {"surplus",
                ParamType::kChoice,
                "drop",
                "a layer whose Eq. 7 share leaves [1%, 100%] of the prompt: drop (clamped, the "
                "released code) or redistribute (to the other layers, the total kept)",
                0,
                0,
                {"drop", "redistribute"}},
               {"merge", ParamType::kBool, "true", "merge unselected entries (false: evict them)"}},
    .switches = {.decode = true},
    .merges = true,
    .needs_for =
        [](const ParamSet& p) {
          return AttentionNeeds{.prefill_column_sums = true,
                                .sample_entropies = p.get_string("allocation") == "entropy"};
        },
    .create = [](const ParamSet& p, const SampleInfo& s) -> std::unique_ptr<Policy> {
      return std::make_unique<Meda>(p, s);
    },
});

}  // namespace
}  // namespace kvsim
