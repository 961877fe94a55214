// hae: Hierarchical Adaptive Eviction (the HAE paper, Sec. 2.2, Fig. 1, Table 5).
//
// Prefill — Dual-Attention Pruning (DAP), first layer only, indices broadcast to every layer:
//   A_j = Σ_{i ∈ text queries} A_{i,j}                                   (Eq. 1)
//   a visual token j is evicted when A_j < r · Σ_{j' ∈ V} A_{j'}           (Eq. 2, complement of
//   V^p)
//                           and max_{i ∈ text} A_{i,j} < α                (Eq. 3)
// Decode — Dynamic Decoding Eviction Strategy (DDES, Definition 2, Eq. 4-5):
//   Sc(j) = cumulative attention received by j (Eq. 5: this step's softmax plus β, the score
//   before it), summed over the query heads of the KV head. S_1 is the cache after the prefill
//   (l = |S_1| entries); generated tokens are appended without eviction until k = RC_size of them
//   have arrived, and then the k entries of S_1 with the lowest Sc are removed (Eq. 4:
//   S_2 = S_1 \ argmin_{C ⊂ S_1, |C| = k} Σ Sc, re-ranked at the trigger), so the cache is back to
//   l entries and becomes the next S_1. The tokens generated since the last trigger are not
//   candidates: C ⊂ S_1. (`candidates = all` lets them compete, kvsim's earlier reading: their
//   few decode steps of score then lose against prompt tokens that carry the prefill's, and on the
//   demo 11% of decode evictions hit them, 946 times the very token generated at that step.)
//   Growth: the triggering step attends l + RC_size entries; after every hook the cache holds at
//   most l + RC_size - 1 (Definition 2's l <= |S_2| < l + D, with D = RC_size).
//   `hold = budget` (kvsim's, for comparisons at equal memory) puts the recycle bin inside the
//   budget B: with k = min(RC_size, max(1, floor(B / 2))) new tokens per trigger, S_1 keeps
//   l = B - k + 1 entries, so the cache holds between l and B after every hook (the paper's
//   reading, `hold = bin`, holds up to B + RC_size - 1). k is capped at half the budget so that
//   S_1 stays at least half of it on short prompts.
//   `ddes = mark` is the recycle bin as Fig. 1's caption and Sec. 1 tell it: at every step while
//   the cache holds more unmarked entries than l, the lowest-scoring unmarked candidate is marked
//   (its rank frozen from then on) and stays attended; when the bin holds RC_size entries they
//   are evicted at once. It is a defensible reading of the figure, not of Eq. 4: a marked entry
//   is never reprieved even if it is attended later, so a flush can remove more score than the
//   k lowest (Corollary 2.1's bound, which Eq. 4 meets by construction).
//
// Readings chosen (the paper does not say):
// - A_{i,j} is the first layer's attention averaged over all query heads (the set is broadcast
//   to every head, so it is one set); text queries are the prompt's text tokens (system and
//   user), which can only see vision tokens before them (causal).
// - Eq. 3 is printed as max_j A_{j,i} < α; read as the maximum over text queries i of A_{i,j}.
// - The budget of Definition 2 is l = |S_1|, the cache size after DAP (`budget = auto`, per layer
//   and KV head). With an explicit budget below |S_1|, the end of the prefill evicts the
//   lowest-scoring entries down to it at once (the paper only defines decode-time eviction).
// - β includes the attention received during the prefill, as in H2O, which DDES follows
//   (`prompt_scores = false` counts decode attention only).
// - No recent window is protected beyond Eq. 4's own: the tokens generated since the last
//   trigger are not in S_1.
// - Table 1 compares methods "retaining 192 visual tokens": `visual_keep = N` makes DAP keep the N
//   visual tokens with the highest Eq. 1 score instead of applying the thresholds of Eq. 2-3
//   (preset `hae:table1`).
// Defaults are HAE-LLaVA's row of Table 5 (r = 0.0012, α = 0.001, RC_size = 64); `stages`
// reproduces Table 3's ablation rows (prefill: DAP only; decode: DDES only; all).
#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "policies/policy.hpp"
#include "policies/selection.hpp"

namespace kvsim {
namespace {

class Hae final : public Policy {
 public:
  Hae(const ParamSet& p, const SampleInfo& s)
      : r_(p.get_float("r")),
        alpha_(p.get_float("alpha")),
        rc_size_(static_cast<int>(p.get_int("rc_size"))),
        dap_(p.get_string("stages") != "decode"),
        ddes_(p.get_string("stages") != "prefill"),
        prompt_scores_(p.get_bool("prompt_scores")),
        mark_(p.get_string("ddes") == "mark"),
        all_candidates_(p.get_string("candidates") == "all"),
        auto_budget_(p.get_string("budget") == "auto"),
        visual_keep_(static_cast<int>(p.get_int("visual_keep"))),
        budget_(auto_budget_ ? 0 : resolve_budget(p, s.prompt_len, "hae")),
        bin_inside_(p.get_string("hold") == "budget") {
    // Table 2/3's sizes are absolute, for ~2.4k-token prompts: on a shorter one they cut nothing
    // at the prefill, which a user should hear rather than infer.
    if (!auto_budget_ && budget_ >= s.prompt_len)
      note("hae: budget = " + std::to_string(budget_) + " entries is not below the " +
           std::to_string(s.prompt_len) +
           "-token prompt: only DAP cuts the prefill, and the decoding eviction starts once a "
           "cache holds budget + rc_size = " +
           std::to_string(budget_ + rc_size_) + " entries, at the earliest " +
           std::to_string(budget_ + rc_size_ - s.prompt_len) +
           " generated tokens in (the preset's size is absolute, for the paper's longer prompts)");
  }

  void on_prefill(const LayerView& view, KvCache& cache) override {
    if (dap_ && view.layer() == 0) choose_pruned(view);
    Layer& st = layer(view.layer(), cache.kv_heads());
    cache.evict_positions_if([&](int pos) { return pruned_.count(pos) > 0; });  // broadcast
    if (!ddes_) return;
    const int group = view.group_size();
    for (int g = 0; g < cache.kv_heads(); ++g) {
      st.scores[g].assign(view.prompt_len(), 0.0);
      if (prompt_scores_)
        for (int r = 0; r < group; ++r) {
          const float* col = view.prefill_column_sums(g * group + r);
          for (int j = 0; j < view.prompt_len(); ++j) st.scores[g][j] += col[j];
        }
      const int held = auto_budget_ ? cache.size(g) : budget_;
      st.rc[g] = bin_inside_ ? std::min(rc_size_, std::max(1, held / 2)) : rc_size_;
      st.budget[g] = bin_inside_ ? held - st.rc[g] + 1 : held;
      st.s1_end[g] = view.prompt_len();
      if (cache.size(g) > st.budget[g])
        cache.keep_only(g, keep_top_scores(cache_scores(st, cache, g), st.budget[g]));
    }
  }

  void on_decode(const LayerView& view, const StepAttention& att, KvCache& cache) override {
    if (!ddes_) return;
    Layer& st = layer(view.layer(), cache.kv_heads());
    for (int g = 0; g < cache.kv_heads(); ++g) {
      st.scores[g].resize(view.visible_len(), 0.0);  // the positions that exist so far
      const int n = cache.size(g);
      for (int r = 0; r < att.group; ++r) {
        const float* p = att.head(g, r, n);
        for (int e = 0; e < n; ++e) st.scores[g][cache.position(g, e)] += p[e];  // Eq. 5
      }
      if (mark_) {
        mark_and_flush(st, cache, g, att.position);
      } else if (n - st.budget[g] >= st.rc[g]) {  // k new tokens since the last trigger: Eq. 4
        cache.keep_only(g, keep_top_scores(candidate_scores(st, cache, g), st.budget[g]));
        st.evicted_s1_end[g] = std::exchange(st.s1_end[g], att.position + 1);
      }
    }
  }

  // Sc by position; after a decode-time eviction, the tokens that were not in S_1 then read as
  // +inf, so that Corollary 2.1's check (--bounds) compares with Low_d(S_1) as Eq. 6 does.
  const std::vector<double>* eviction_scores(int layer, int g) const override {
    const auto it = layers_.find(layer);
    if (it == layers_.end() || it->second.scores[g].empty()) return nullptr;
    const Layer& st = it->second;
    if (all_candidates_ || st.evicted_s1_end[g] == 0) return &st.scores[g];
    reported_ = st.scores[g];
    for (std::size_t pos = st.evicted_s1_end[g]; pos < reported_.size(); ++pos)
      reported_[pos] = std::numeric_limits<double>::infinity();
    return &reported_;
  }

  int capacity(int layer, int g) const override {
    if (!ddes_) return -1;
    const auto it = layers_.find(layer);
    return it == layers_.end() ? -1 : it->second.budget[g] + it->second.rc[g] - 1;
  }

 private:
  struct Layer {
    std::vector<std::vector<double>> scores;  // [kv head][position]
    std::vector<std::set<int>> bin;           // marked positions per kv head
    std::vector<int> budget;                  // l = |S_1| after each trigger
    std::vector<int> rc;      // k: new tokens per trigger (RC_size, or less under hold = budget)
    std::vector<int> s1_end;  // per kv head: positions below it form S_1, the eviction candidates
    std::vector<int> evicted_s1_end;  // s1_end before the last decode-time eviction (0: none)
  };

  Layer& layer(int l, int kv_heads) {
    Layer& st = layers_[l];
    if (st.scores.empty()) {
      st.scores.resize(kv_heads);
      st.bin.resize(kv_heads);
      st.budget.resize(kv_heads);
      st.rc.resize(kv_heads);
      st.s1_end.resize(kv_heads);
      st.evicted_s1_end.resize(kv_heads);
    }
    return st;
  }

  // Eq. 1-3 on the first layer's head-averaged attention from text queries (or, with visual_keep,
  // every visual token but the visual_keep best by Eq. 1).
  void choose_pruned(const LayerView& view) {
    const auto& modality = view.modality();
    const float* sum = view.text_query_column_sums();
    const float* max = view.text_query_column_max();
    std::vector<int> visual;
    double total = 0;
    for (int j = 0; j < view.prompt_len(); ++j)
      if (modality[j] != 0) total += sum[j], visual.push_back(j);
    if (visual_keep_ > 0) {
      const std::vector<double> score(sum, sum + view.prompt_len());
      const std::vector<int> kept = top_positions(visual, score, visual_keep_);
      for (int j : visual)
        if (!std::binary_search(kept.begin(), kept.end(), j)) pruned_.insert(j);
      return;
    }
    for (int j : visual)
      if (sum[j] < r_ * total && max[j] < alpha_) pruned_.insert(j);
  }

  // Sc of the cached entries, with the tokens generated since the last trigger (not in S_1) put
  // out of reach unless `candidates = all`.
  std::vector<double> candidate_scores(const Layer& st, const KvCache& cache, int g) const {
    std::vector<double> s = cache_scores(st, cache, g);
    if (!all_candidates_)
      for (int e = 0; e < cache.size(g); ++e)
        if (cache.position(g, e) >= st.s1_end[g]) s[e] = std::numeric_limits<double>::infinity();
    return s;
  }

  static std::vector<double> cache_scores(const Layer& st, const KvCache& cache, int g) {
    std::vector<double> s(cache.size(g));
    for (int e = 0; e < cache.size(g); ++e) s[e] = st.scores[g][cache.position(g, e)];
    return s;
  }

  void mark_and_flush(Layer& st, KvCache& cache, int g, int position) const {
    auto& bin = st.bin[g];
    const int n = cache.size(g);
    while (n - static_cast<int>(bin.size()) > st.budget[g]) {
      const int pos = lowest_unmarked(st, cache, g);
      if (pos < 0) break;  // S_1 is all marked (RC_size > l)
      bin.insert(pos);
    }
    if (static_cast<int>(bin.size()) >= st.rc[g]) {  // the bin is full: empty it at once
      std::vector<int> entries;
      for (int e = 0; e < n; ++e)
        if (bin.count(cache.position(g, e))) entries.push_back(e);
      cache.evict(g, entries);
      bin.clear();
      st.evicted_s1_end[g] = std::exchange(st.s1_end[g], position + 1);
    }
  }

  int lowest_unmarked(const Layer& st, const KvCache& cache, int g) const {
    int best = -1;
    double best_score = 0;
    for (int e = 0; e < cache.size(g); ++e) {
      const int pos = cache.position(g, e);
      if (st.bin[g].count(pos) || (!all_candidates_ && pos >= st.s1_end[g])) continue;
      const double s = st.scores[g][pos];
      if (best < 0 || s < best_score) best = pos, best_score = s;  // ties: the older stays first
    }
    return best;
  }

  double r_, alpha_;
  int rc_size_;
  bool dap_, ddes_, prompt_scores_, mark_, all_candidates_, auto_budget_;
  int visual_keep_;
  int budget_;
  bool bin_inside_;
  std::set<int> pruned_;  // DAP's evicted positions, broadcast to every layer
  std::map<int, Layer> layers_;
  mutable std::vector<double> reported_;  // eviction_scores' masked copy
};

const PolicyRegistration reg({
    .name = "hae",
    .summary = "Dual-Attention Pruning of vision tokens in layer 0, broadcast to all layers, then "
               "cumulative-score eviction through a recycle bin while decoding.",
    .provenance =
        "HAE, Hierarchical Adaptive Eviction for KV Cache Management in Multimodal Language Models "
        "(anonymous, under review), Sec. 2.2 Eq. 1-5, Definition 2, Table 5 (HAE-LLaVA)",
    .params = {{"budget",
                ParamType::kSize,
                "auto",
                "KV entries per (layer, KV head) while decoding: auto = |S_1|, the size after "
                "DAP (Definition 2), or a count / percentage of the prompt",
                1,
                1e9,
                {"auto"}},
               {"r", ParamType::kFloat, "0.0012", "DAP global threshold r (Eq. 2)", 0, 1},
               {"alpha", ParamType::kFloat, "0.001", "DAP per-text-token threshold α (Eq. 3)", 0,
                1},
               {"rc_size", ParamType::kInt, "64", "recycle bin size RC_size", 1, 1e9},
               {"stages",
                ParamType::kChoice,
                "all",
                "prefill (DAP only), decode (DDES only) or all (Table 3 ablation)",
                0,
                0,
                {"prefill", "decode", "all"}},
               {"ddes",
                ParamType::kChoice,
                "eq4",
                "eq4: every RC_size new tokens evict the RC_size lowest cumulative scores, "
                "re-ranked then (Eq. 4-5); mark: mark the lowest entry each step into the "
                "recycle bin, evict the bin when full (Fig. 1)",
                0,
                0,
                {"eq4", "mark"}},
               {"prompt_scores", ParamType::kBool, "true",
                "cumulative scores include the attention received during the prefill"},
               {"candidates",
                ParamType::kChoice,
                "prior",
                "prior: Eq. 4 evicts from S_1, the entries cached at the last trigger; all: the "
                "tokens generated since compete too",
                0,
                0,
                {"prior", "all"}},
               {"visual_keep", ParamType::kInt, "0",
                "DAP keeps this many visual tokens, the best by Eq. 1 (Table 1's fair comparison "
                "retains 192); 0: the thresholds r and alpha (Eq. 2-3)",
                0, 1e9},
               {"hold",
                ParamType::kChoice,
                "bin",
                "bin (the paper: the recycle bin's RC_size - 1 entries on top of the budget) or "
                "budget (the bin inside it: at most the budget after every hook, for equal "
                "memory)",
                0,
                0,
                {"bin", "budget"}}},
    .needs_for =
        [](const ParamSet& p) {
          const std::string stages = p.get_string("stages");
          return AttentionNeeds{
              .prefill_column_sums = stages != "prefill" && p.get_bool("prompt_scores"),
              .prefill_window = 0,
              .text_query_layers = stages == "decode" ? 0 : 1};
        },
    .create = [](const ParamSet& p, const SampleInfo& s) -> std::unique_ptr<Policy> {
      return std::make_unique<Hae>(p, s);
    },
    .equal_memory = [](const ParamSet& p) -> std::map<std::string, std::string> {
      if (p.get_string("budget") == "auto")
        throw std::invalid_argument(
            "hae: equal memory needs a budget (budget = auto is the size DAP leaves, which "
            "differs by prompt): give --budget or --set hae.budget=N");
      return {{"hold", "budget"}};
    },
});

}  // namespace
}  // namespace kvsim
