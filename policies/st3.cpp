// st3: Progressive Visual Token Pruning + Visual Token Annealing
// (paper 003_8a726b4968cab955, Methodology, Eq. 3 and 7-9, Alg. 1 and 3, Tables 3 and 6).
//
// PVTP (prefill, Eq. 3, Alg. 1): layers 0-2 keep every visual token. Layer 3 keeps the top
// G = |V| - N of the visual tokens still present, ranked by the previous layer's last prompt
// token attention (head-averaged), with N = P·|V_0| (P = 50%, after FastV); then every S layers
// (layers 3 + S, 3 + 2S, ... < L) N = R·|V_0| more are pruned the same way. Pruned tokens are
// gone from that layer and every deeper one.
// VTA (decode), default reading `annealing = alg3` (Alg. 3, the KV-cache implementation): only
// the pruning layers l >= 3 with (l - 3) mod S = 0 anneal, and the layers of their block (up to
// the next pruning layer) share the set, as PVTP's layers between two prunings share their
// visual tokens. Before the forward pass that feeds generated token O (O = 1, 2, ...), the
// block's visual cache is cut to its best ⌊|C[l]|·D⌋ in T[l] order, D = β(O), so sizes
// compound: |C| → ⌊⌊|C|·β(1)⌋·β(2)⌋ ... T[l] is the pruning ranking (Topk by the previous
// layer's last-prompt-token attention, Alg. 3 line 6). β(O) = cos(O·π/(2τ)) for O < τ and 0
// after (Eq. 8; Alg. 3 line 17 omits the truncation, where cos turns negative); Table 6's
// alternatives: linear β = 1 - O/τ, exponential β = exp(-O/σ).
// `annealing = per_layer` is Eq. 7's reading: every layer, layers 0-2 included, keeps the top
// ⌊|V^{l,0}| · β^t⌋ of its visual entries at generation t (not compounding), ranked by the
// layer's own last-prompt-token attention (the paper slices C_v[:n] of a cache it keeps in Top
// order).
// Defaults: S = 7, R = 12.25%, P = 50% (Table 3, LLaVA-1.5-7B, C = 1%), cosine τ = 50 (Tables 6
// and 9). The paper recommends τ above the longest generation (Sec. ablation on VTA): set it
// from the run's generation length (the demo uses τ = G + 1).
//
// Readings chosen: Eq. 9 counts floor((L-3)/S) pruning layers, but Table 3's rows (S = 1,
// R = 1.75%, C = 1% on 32 layers) need floor((L-4)/S): pruning happens at layers 3 + kS < L.
// Percentages are of the image tokens of the prompt before pruning, rounded down (N is a count
// of pruned tokens). With pvtp = false, T[l] ranks every visual token (R = 0).
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
        tau_(p.get_float("tau")),
        sigma_(p.get_float("sigma")),
        pvtp_(p.get_bool("pvtp")),
        vta_(p.get_bool("vta")),
        per_layer_(p.get_string("annealing") == "per_layer") {
    parse_heredity(p.get_string("heredity"));  // validated here, applied by the engine
    for (int j = 0; j < s.prompt_len; ++j)
      if (s.modality[j] != 0) visual_.push_back(j);
    original_visual_ = static_cast<int>(visual_.size());
  }

  void on_prefill(const LayerView& view, KvCache& cache) override {
    const int l = view.layer();
    const bool pruning_layer = l >= first_layer_ && (l - first_layer_) % stride_ == 0;
    if (pvtp_ && pruning_layer) {
      const double ratio = l == first_layer_ ? first_ratio_ : ratio_;
      const int pruned = static_cast<int>(std::floor(ratio * original_visual_ + 1e-9));
      visual_ = top_positions(visual_, previous_scores_,
                              std::max(0, static_cast<int>(visual_.size()) - pruned));
    }
    if (pruning_layer) block_ = ranked_best_first(visual_, previous_scores_);  // T[l]
    previous_scores_ = last_token_attention(view);  // ranks the next layer's pruning (Eq. 3)
    Layer& st = layers_[l];
    if (per_layer_) {
      st.ranked = ranked_best_first(visual_, previous_scores_);
      st.anneals = true;
    } else {
      st.ranked = block_;
      st.anneals = l >= first_layer_;
    }
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

  // The visual entries kept for generated token `generation`: Alg. 3 shrinks the current size by
  // β (compounding); Eq. 7 takes β of the layer's initial size.
  void anneal(const LayerView& view, KvCache& cache, Layer& st, int generation) const {
    if (!st.anneals) return;
    if (generation == 1) st.initial = st.current;
    const int base = per_layer_ ? st.initial : st.current;
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
  bool pvtp_, vta_, per_layer_;
  std::vector<int> visual_;  // visual positions still present at the current layer
  std::vector<int> block_;   // T[l] of the last pruning layer: its visual positions, best first
  int original_visual_ = 0;
  std::vector<double> previous_scores_;
  std::map<int, Layer> layers_;
};

const PolicyRegistration reg({
    .name = "st3",
    .summary = "Progressive visual token pruning every S layers from layer 3, then visual token "
               "annealing of each layer's visual cache while decoding.",
    .provenance = "ST3 (paper 003), Eq. 3 and 7-9, Table 3 (LLaVA-1.5-7B) and Table 6",
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
               {"tau", ParamType::kFloat, "50", "VTA horizon τ (cosine, linear)", 1e-9, 1e9},
               {"sigma", ParamType::kFloat, "20", "VTA decay constant σ (exponential)", 1e-9, 1e9},
               {"pvtp", ParamType::kBool, "true", "progressive visual token pruning at prefill"},
               {"vta", ParamType::kBool, "true", "visual token annealing while decoding"},
               {"annealing",
                ParamType::kChoice,
                "alg3",
                "alg3: pruning layers (and their blocks) shrink |C| by beta each step, "
                "compounding (Alg. 3); per_layer: every layer keeps |V^{l,0}|*beta^t (Eq. 7)",
                0,
                0,
                {"alg3", "per_layer"}},
               {"heredity", ParamType::kString, "",
                "QK heredity (Eq. 6): SOURCE:FIRST-LAST[,...], e.g. 7:8-10; empty: off"}},
    .needs = {.prefill_column_sums = false, .prefill_window = 1},
    .lookahead = false,
    .merges = false,
    .needs_for = {},
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
