// st3: Progressive Visual Token Pruning + Visual Token Annealing
// (the ST3 paper, Methodology, Eq. 3 and 7-9, Alg. 1 and 3, Tables 3 and 6).
//
// PVTP (prefill, Eq. 3, Alg. 1): layers 0-2 keep every visual token. From layer 3, every S layers
// (3, 3 + S, 3 + 2S, ... < L) the visual tokens still present are cut to the top of the previous
// layer's last-prompt-token attention (head-averaged); pruned tokens are gone from that layer and
// every deeper one. Sizes follow Eq. 9: after the k-th pruning layer (k = 0, 1, ...) the layer
// keeps ⌊|V_0| · (1 - P - k·R)⌋ visual tokens (P = 50% at layer 3, after FastV). The cumulative
// share is Eq. 9's; the paper never rounds a count, so kvsim rounds the kept count down, as Alg.
// 1's Topk((1 - R)·|V|) would convert it: 576 image tokens with Table 3's C = 1% row leave ⌊5.76⌋
// = 5. Rounding each layer's pruned count instead (⌊R·|V_0|⌋ each time) drifts: it left 8.
//
// VTA (decode, Eq. 7-8): before the forward pass that feeds generated token O (O = 1, 2, ...), an
// annealing layer keeps the best ⌊|V^{l,0}| · β(O)⌋ of its visual entries, |V^{l,0}| the count PVTP
// left it (Eq. 7: C^{l,t} = C^{l,t-1}[: |V^{l,0}| · β^t], "a fraction of the initial count").
// β(O) = cos(O·π/(2τ)) for O < τ and 0 after (Eq. 8; Alg. 3 line 17 omits the truncation, where
// cos turns negative); Table 6's alternatives: linear 1 - O/τ, exponential exp(-O/σ).
// Which layers anneal, and in which order, follow Alg. 3: the pruning layers (l >= 3,
// (l - 3) mod S = 0), in T[l] order (the pruning ranking, Topk by the previous layer's attention,
// line 6); the layers of a pruning layer's block share its set, as PVTP's layers between two
// prunings share their visual tokens.
// The readings the text leaves open are parameters, each independent of the others:
// - `anneal_size = current` is Alg. 3 lines 18-19 read literally (|C[l]| · D of the current
//   size, compounding: Π cos reaches 0 at about 0.45 τ, against Eq. 7 and the ablation's "lower
//   annealing rate in the initial generation process"); default `initial` (Eq. 7).
// - `anneal_layers = all` anneals layers 0-2 too (Eq. 7 is written for every l); default
//   `pruning` (Alg. 3 line 16).
// - `anneal_rank = own` ranks each layer's visual entries by its own last-prompt-token attention
//   (Eq. 7 slices a cache kept in Top order); default `pruning` (T[l], Alg. 3 line 18). Layers
//   before the first pruning layer have no T[l] and always rank by their own attention.
// τ: Tables 6 and 9 (the VTA ablation on LLaVA-1.5-7B) find τ = 50 best on all three caption
// sets with one τ, so the default is 50, the value behind the paper's results. The same ablation
// advises "τ greater than the preset maximum generation length"; `tau = auto` is that reading,
// max_new_tokens + 1 (the run's generation limit, known before decoding; LLaVA-1.5's evaluation
// scripts use 128, which gives 129). A number overrides both.
// Defaults: S = 7, R = 12.25%, P = 50% (Table 3, LLaVA-1.5-7B, C = 1%).
//
// Readings chosen: Eq. 9 counts floor((L-3)/S) pruning layers, but Table 3's rows (S = 1,
// R = 1.75%, C = 1% on 32 layers) need floor((L-4)/S): pruning happens at layers 3 + kS < L.
// With pvtp = false, T[l] ranks every visual token (R = 0).
// QK heredity (Eq. 6, Table 4) is the `heredity` option, e.g. "7:8-10": layers 8 to 10 attend with
// Softmax(Q^7 K^7ᵀ) applied to their own values (the engine attends with the source layer's q/k
// and measures against the layer's own full-cache output); it is off by default, as in Table 3.
#include <algorithm>
#include <cmath>
#include <map>

#include "policies/policy.hpp"
#include "policies/scorers.hpp"
#include "policies/selection.hpp"

namespace kvsim {
namespace {

// "S:A-B[,S:A-B...]": layers A..B inherit layer S's queries and keys (S < A <= B). Returns the
// map lazy layer -> source layer.
std::map<int, int> parse_heredity(const std::string& text) {
  std::map<int, int> out;
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t end = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, end - start);
    int src = 0, first = 0, last = 0;
    char tail = 0;
    const int n = std::sscanf(item.c_str(), "%d:%d-%d%c", &src, &first, &last, &tail);
    const bool single = n == 2 && item.find('-') == std::string::npos;  // "S:A" is "S:A-A"
    if (single) last = first;
    if ((!single && n != 3) || src < 0 || first <= src || last < first)
      throw std::invalid_argument(
          "st3: parameter 'heredity' = '" + text +
          "': expected "
          "SOURCE:FIRST-LAST[,...] with SOURCE < FIRST <= LAST, e.g. 7:8-10");
    for (int l = first; l <= last; ++l) out[l] = src;
    start = end + 1;
  }
  return out;
}

class St3 final : public Policy {
 public:
  St3(const ParamSet& p, const SampleInfo& s)
      : stride_(static_cast<int>(p.get_int("S"))),
        ratio_(p.get_float("R") / 100),
        first_ratio_(p.get_float("P") / 100),
        first_layer_(static_cast<int>(p.get_int("first_layer"))),
        schedule_(p.get_string("schedule")),
        tau_(p.get_string("tau") == "auto" ? static_cast<double>(p.get_int("max_new_tokens") + 1)
                                           : p.get_float("tau")),
        sigma_(p.get_float("sigma")),
        pvtp_(p.get_bool("pvtp")),
        vta_(p.get_bool("vta")),
        all_layers_(p.get_string("anneal_layers") == "all"),
        from_initial_(p.get_string("anneal_size") == "initial"),
        own_rank_(p.get_string("anneal_rank") == "own") {
    parse_heredity(p.get_string("heredity"));  // validated here, applied by the engine
    for (int j = 0; j < s.prompt_len; ++j)
      if (s.modality[j] != 0) visual_.push_back(j);
    original_visual_ = static_cast<int>(visual_.size());
  }

  void on_prefill(const LayerView& view, KvCache& cache) override {
    const int l = view.layer();
    const bool pruning_layer = l >= first_layer_ && (l - first_layer_) % stride_ == 0;
    if (pvtp_ && pruning_layer) {
      visual_ = top_positions(visual_, previous_scores_, eq9_kept(prunings_++));
    }
    if (pruning_layer) block_ = ranked_best_first(visual_, previous_scores_);  // T[l]
    previous_scores_ = last_token_attention(view);  // ranks the next layer's pruning (Eq. 3)
    Layer& st = layers_[l];
    const bool before_first = l < first_layer_;
    st.ranked = own_rank_ || before_first ? ranked_best_first(visual_, previous_scores_) : block_;
    st.anneals = all_layers_ || !before_first;
    st.current = static_cast<int>(visual_.size());
    keep_visual(view, cache, visual_);
    if (vta_) anneal(view, cache, st, 1);
  }

  void on_decode(const LayerView& view, const StepAttention& att, KvCache& cache) override {
    if (vta_) anneal(view, cache, layers_[view.layer()], att.step + 2);
  }

 private:
  struct Layer {
    std::vector<int> ranked;  // visual positions after PVTP, best first
    int current = 0;          // visual entries the layer holds: |V^{l,0}|, then |C[l]|
    int initial = 0;          // |V^{l,0}|
    bool anneals = false;
  };

  // Eq. 9: the visual tokens left after the k-th pruning layer, ⌊|V_0| (1 - P - k R)⌋ (>= 0).
  int eq9_kept(int k) const {
    const double share = 1 - first_ratio_ - k * ratio_;
    return std::max(0, static_cast<int>(std::floor(original_visual_ * share + 1e-9)));
  }

  static std::vector<int> ranked_best_first(std::vector<int> positions,
                                            const std::vector<double>& scores) {
    std::stable_sort(positions.begin(), positions.end(), [&](int a, int b) {
      const double sa = scores[a], sb = scores[b];
      return sa != sb ? sa > sb : a > b;  // best first, ties to the newer
    });
    return positions;
  }

  // Eq. 8 and Table 6: the share of |V^{l,0}| kept after `generated` output tokens.
  double beta(int generated) const {
    if (schedule_ == "exponential") return std::exp(-generated / sigma_);
    if (generated >= tau_) return 0;
    if (schedule_ == "linear") return 1 - generated / tau_;
    return std::cos(generated * M_PI / (2 * tau_));
  }

  // The visual entries kept for generated token `generation`: Eq. 7 takes β of the layer's
  // initial size; `anneal_size = current` shrinks the current size by β (compounding).
  void anneal(const LayerView& view, KvCache& cache, Layer& st, int generation) const {
    if (!st.anneals) return;
    if (generation == 1) st.initial = st.current;
    const int base = from_initial_ ? st.initial : st.current;
    st.current = static_cast<int>(std::floor(base * beta(generation) + 1e-9));
    std::vector<int> keep(st.ranked.begin(),
                          st.ranked.begin() + std::min<int>(st.current, st.ranked.size()));
    std::sort(keep.begin(), keep.end());
    keep_visual(view, cache, keep);
  }

  // Drops every visual entry whose position is not in `kept` (sorted).
  static void keep_visual(const LayerView& view, KvCache& cache, const std::vector<int>& kept) {
    const auto& mod = view.modality();
    cache.evict_positions_if([&](int pos) {
      return mod[pos] != 0 && !std::binary_search(kept.begin(), kept.end(), pos);
    });
  }

  int stride_;
  double ratio_, first_ratio_;
  int first_layer_;
  std::string schedule_;
  double tau_, sigma_;
  bool pvtp_, vta_, all_layers_, from_initial_, own_rank_;
  std::vector<int> visual_;  // visual positions still present at the current layer
  std::vector<int> block_;   // T[l] of the last pruning layer: its visual positions, best first
  int original_visual_ = 0;
  int prunings_ = 0;  // pruning layers passed
  std::vector<double> previous_scores_;
  std::map<int, Layer> layers_;
};

const PolicyRegistration reg({
    .name = "st3",
    .summary = "Progressive visual token pruning every S layers from layer 3, then visual token "
               "annealing of each layer's visual cache while decoding.",
    .provenance = "ST3: Spatial-Temporal Visual Token Trimming (Zhuang et al.), Eq. 3 and 7-9, "
                  "Alg. 3, Table 3 (LLaVA-1.5-7B) and Table 6",
    .params = {{"S", ParamType::kInt, "7", "pruning stride in layers", 1, 1e9},
               {"R", ParamType::kFloat, "12.25",
                "visual tokens pruned at each strided layer, % of |V|", 0, 100},
               {"P", ParamType::kFloat, "50",
                "visual tokens pruned at the first pruning layer, % of |V|", 0, 100},
               {"first_layer", ParamType::kInt, "3",
                "first pruning layer (layers before it keep all)", 1, 1e9},
               {"schedule",
                ParamType::kChoice,
                "cosine",
                "VTA decay (Table 6)",
                0,
                0,
                {"cosine", "linear", "exponential"}},
               {"tau",
                ParamType::kFloat,
                "50",
                "VTA horizon τ (cosine, linear): 50, best in Tables 6 and 9; auto = "
                "max_new_tokens + 1, above the run's generation limit as the VTA ablation advises",
                1e-9,
                1e9,
                {"auto"}},
               {"max_new_tokens", ParamType::kInt, "128",
                "the run's generation limit, known before decoding (sets tau = auto)", 1, 1e9},
               {"sigma", ParamType::kFloat, "20", "VTA decay constant σ (exponential)", 1e-9, 1e9},
               {"pvtp", ParamType::kBool, "true", "progressive visual token pruning at prefill"},
               {"vta", ParamType::kBool, "true", "visual token annealing while decoding"},
               {"anneal_layers",
                ParamType::kChoice,
                "pruning",
                "pruning: the pruning layers and their blocks anneal (Alg. 3); all: every layer, "
                "0-2 included",
                0,
                0,
                {"pruning", "all"}},
               {"anneal_size",
                ParamType::kChoice,
                "initial",
                "initial: keep |V^{l,0}|*beta (Eq. 7); current: keep |C|*beta, compounding (Alg. 3 "
                "lines 18-19 read literally)",
                0,
                0,
                {"initial", "current"}},
               {"anneal_rank",
                ParamType::kChoice,
                "pruning",
                "pruning: T[l], the pruning layer's ranking (Alg. 3); own: each layer's own "
                "last-prompt-token attention",
                0,
                0,
                {"pruning", "own"}},
               {"heredity", ParamType::kString, "",
                "QK heredity (Eq. 6): SOURCE:FIRST-LAST[,...], e.g. 7:8-10; empty: off"}},
    .needs = {.prefill_column_sums = false, .last_row_head_mean = true},
    .create = [](const ParamSet& p, const SampleInfo& s) -> std::unique_ptr<Policy> {
      return std::make_unique<St3>(p, s);
    },
    .attention_source =
        [](const ParamSet& p, int layer) {
          const auto map = parse_heredity(p.get_string("heredity"));
          const auto it = map.find(layer);
          return it == map.end() ? layer : it->second;
        },
});

}  // namespace
}  // namespace kvsim
