// avl: A-VL, adaptive attention for large vision-language models
// (the A-VL paper, "A-VL Design", Fig. 6-7, Tables 1 and 3).
//
// Vision, per layer (Adaptive Text-Aware Vision Attention): image tokens are ranked by the last
// prompt token's attention averaged over heads (Eq. 1). The top C% are core, the top S% (S > C)
// secondary, the rest minor. Minor entries are evicted at the end of the prefill; secondary
// entries stay stored but only core entries take part in attention. Every K steps an "update
// decode" step attends all secondary entries and re-chooses the core set from that step's
// attention.
// Prefill: from the third layer on (index >= 2), only the top P% of the image tokens by the
// second layer's (index 1) last-token attention are kept, as in FastV.
// Text (Adaptive Text Attention): H2O-style cumulative scores inside a text window of T% of "the
// maximum text token length"; when the window overflows, the lowest-scoring entries of its older
// half are evicted. Which length the text means is not said, and it decides whether T acts:
// - `text_window = seen` (default): T% of the text that exists at the hook, the prompt's text
//   plus the tokens generated so far, rounded up. It is causal, it is how H2O's own code sizes
//   its budgets (FMInference/H2O h2o_hf/utils_hh/modify_llama.py: a ratio of the current key
//   length), and T then acts on short answers as Table 3's T = 50 row shows (the stored cache
//   falls from 50% to 48% and three scores move).
// - `limit`: T% of the prompt's text + max_new_tokens (the run's generation limit, 128 in
//   LLaVA-1.5's evaluation scripts): kvsim's earlier default. On a prompt with little text and a
//   short answer the window is never reached, so T = 50 gives exactly T = 100's results.
// - `prompt`: T% of the prompt's text, fixed at the prefill.
// Defaults: the last LLaVA-1.5-7B row of Table 3 (S 45, C 30, K 3, P 90, T 50); C = S, P = 100
// and T = 100 switch the components off as the table's other rows do.
//
// Readings chosen: S% and C% count the layer's image tokens before any pruning, rounded up;
// update decode runs at steps K, 2K, ... (the core set is fresh after the prefill); vision sets
// are per layer (Eq. 1 averages the heads) while text eviction is per KV head, as in H2O; text
// scores include the attention received during the prefill (H2O does); video counts as vision.
#include <algorithm>
#include <cmath>
#include <map>

#include "policies/policy.hpp"
#include "policies/scorers.hpp"
#include "policies/selection.hpp"

namespace kvsim {
namespace {

int percent_of(double pct, int n) {
  return static_cast<int>(std::ceil(pct / 100.0 * n - 1e-9));
}

class Avl final : public Policy {
 public:
  Avl(const ParamSet& p, const SampleInfo& s)
      : secondary_pct_(p.get_float("S")),
        core_pct_(p.get_float("C")),
        update_every_(static_cast<int>(p.get_int("K"))),
        prefill_pct_(p.get_float("P")),
        text_pct_(p.get_float("T")),
        window_reading_(p.get_string("text_window")),
        prompt_len_(s.prompt_len) {
    if (core_pct_ > secondary_pct_)
      throw std::invalid_argument("avl: parameter 'C' = " + p.get_string("C") +
                                  " must not exceed 'S' = " + p.get_string("S"));
    for (int i = 0; i < s.prompt_len; ++i) prompt_text_ += s.modality[i] == 0;
    // `limit`: the prompt's text plus the most tokens the run may generate, a configuration value
    // known before decoding (not the trace's realised generation length, the future).
    if (window_reading_ == "limit")
      generation_limit_ = static_cast<int>(p.get_int("max_new_tokens"));
  }

  void on_prefill(const LayerView& view, KvCache& cache) override {
    const int P = view.prompt_len();
    const auto& mod = view.modality();
    std::vector<double> score = last_token_attention(view);
    std::vector<int> images;
    for (int j = 0; j < P; ++j)
      if (mod[j] != 0) images.push_back(j);
    if (view.layer() == 1 && prefill_pct_ < 100)
      prefill_kept_ = top_positions(images, score, percent_of(prefill_pct_, images.size()));
    std::vector<int> available = images;
    if (view.layer() >= 2 && prefill_pct_ < 100) available = prefill_kept_;
    const int n_images = static_cast<int>(images.size());
    Layer& st = layers_[view.layer()];
    st.secondary = top_positions(available, score, percent_of(secondary_pct_, n_images));
    st.core = top_positions(st.secondary, score, percent_of(core_pct_, n_images));
    st.text_scores.assign(cache.kv_heads(), std::vector<double>(prompt_len_, 0.0));
    const int group = view.group_size();
    for (int g = 0; g < cache.kv_heads(); ++g) {
      std::vector<std::uint8_t> keep(cache.size(g), 1);
      for (int e = 0; e < cache.size(g); ++e) {
        const int pos = cache.position(g, e);
        if (mod[pos] != 0)
          keep[e] = std::binary_search(st.secondary.begin(), st.secondary.end(), pos);
      }
      cache.keep_only(g, keep);
      for (int r = 0; r < group; ++r) {
        const float* col = view.prefill_column_sums(g * group + r);
        for (int j = 0; j < P; ++j) st.text_scores[g][j] += col[j];
      }
      trim_text(st, cache, g, mod, text_window(-1));
    }
    set_attended(st, cache, mod, /*all_secondary=*/false);
  }

  void on_decode(const LayerView& view, const StepAttention& att, KvCache& cache) override {
    const auto& mod = view.modality();
    Layer& st = layers_[view.layer()];
    const bool update_step = att.step > 0 && att.step % update_every_ == 0;
    if (update_step) {  // re-choose the core set from this step's head-averaged attention
      std::vector<double> score(view.visible_len(), 0.0);
      const int heads = att.group * cache.kv_heads();
      for (int g = 0; g < cache.kv_heads(); ++g)
        for (int r = 0; r < att.group; ++r) {
          const float* p = att.head(g, r, cache.size(g));
          for (int e = 0; e < cache.size(g); ++e) score[cache.position(g, e)] += p[e] / heads;
        }
      int n_images = 0;
      for (int j = 0; j < view.prompt_len(); ++j) n_images += mod[j] != 0;
      st.core = top_positions(st.secondary, score, percent_of(core_pct_, n_images));
    }
    for (int g = 0; g < cache.kv_heads(); ++g) {
      const int n = cache.size(g);
      st.text_scores[g].resize(view.visible_len(), 0.0);  // the positions that exist so far
      for (int r = 0; r < att.group; ++r) {
        const float* p = att.head(g, r, n);
        for (int e = 0; e < n; ++e)
          if (mod[cache.position(g, e)] == 0) st.text_scores[g][cache.position(g, e)] += p[e];
      }
      trim_text(st, cache, g, mod, text_window(att.step));
    }
    const bool next_is_update = (att.step + 1) % update_every_ == 0;
    set_attended(st, cache, mod, next_is_update);
  }

 private:
  struct Layer {
    std::vector<int> secondary, core;              // image positions, sorted
    std::vector<std::vector<double>> text_scores;  // [kv head][position]
  };

  // The text entries the window holds after decode step `step` (-1: the prefill). `seen`: T% of
  // the text that exists, the prompt's and the step + 1 generated tokens; `limit`: of the prompt's
  // text + max_new_tokens; `prompt`: of the prompt's text. Computed per hook, so one instance
  // replaying layer after layer carries nothing from one layer's decoding to the next's prefill.
  int text_window(int step) const {
    const int generated = window_reading_ == "seen" ? step + 1 : generation_limit_;
    return percent_of(text_pct_, prompt_text_ + generated);
  }

  void trim_text(const Layer& st, KvCache& cache, int g, const VisibleModality& mod,
                 int window) const {
    std::vector<int> text;  // entry indices, oldest first
    for (int e = 0; e < cache.size(g); ++e)
      if (mod[cache.position(g, e)] == 0) text.push_back(e);
    const int excess = static_cast<int>(text.size()) - window;
    if (excess <= 0) return;
    // Evict from the older half of the window: the newest floor(W/2) text entries are protected.
    const int candidates = static_cast<int>(text.size()) - window / 2;
    std::vector<double> s(candidates);
    for (int i = 0; i < candidates; ++i) s[i] = st.text_scores[g][cache.position(g, text[i])];
    const auto keep = keep_top_scores(s, candidates - excess);
    std::vector<int> evict;
    for (int i = 0; i < candidates; ++i)
      if (!keep[i]) evict.push_back(text[i]);
    cache.evict(g, evict);
  }

  static void set_attended(const Layer& st, KvCache& cache, const VisibleModality& mod,
                           bool all_secondary) {
    for (int g = 0; g < cache.kv_heads(); ++g)
      for (int e = 0; e < cache.size(g); ++e) {
        const int pos = cache.position(g, e);
        if (mod[pos] != 0)
          cache.set_attended(
              g, e, all_secondary || std::binary_search(st.core.begin(), st.core.end(), pos));
      }
  }

  double secondary_pct_, core_pct_;
  int update_every_;
  double prefill_pct_, text_pct_;
  std::string window_reading_;
  int prompt_len_, prompt_text_ = 0;
  int generation_limit_ = 0;       // max_new_tokens with `limit`
  std::vector<int> prefill_kept_;  // image positions kept for layers >= 2
  std::map<int, Layer> layers_;
};

const PolicyRegistration reg({
    .name = "avl",
    .summary = "Core / secondary / minor image caches chosen per layer by the last prompt token, "
               "periodic update decode, FastV-style prefill pruning, H2O text window.",
    .provenance = "A-VL: Adaptive Attention for Large Vision-Language Models (Zhang et al.), A-VL "
                  "Design, Tables 1 and 3 (LLaVA-1.5-7B)",
    .params = {{"S", ParamType::kFloat, "45",
                "secondary image tokens kept, % of the layer's image tokens", 0, 100},
               {"C", ParamType::kFloat, "30", "core image tokens attended, % (C <= S)", 0, 100},
               {"K", ParamType::kInt, "3", "update decode every K steps", 1, 1e9},
               {"P", ParamType::kFloat, "90",
                "image tokens kept from the third layer on, % (100: off)", 0, 100},
               {"T", ParamType::kFloat, "50",
                "text cache window, % of the text length `text_window` names (100: off)", 0, 100},
               {"text_window",
                ParamType::kChoice,
                "seen",
                "the text length T is a share of: seen (the text that exists at the hook: "
                "prompt text + tokens generated so far), limit (prompt text + max_new_tokens) or "
                "prompt (the prompt's text)",
                0,
                0,
                {"seen", "limit", "prompt"}},
               {"max_new_tokens", ParamType::kInt, "128",
                "the run's maximum generation length, known before decoding (LLaVA-1.5's "
                "llava/eval/model_vqa_loader.py default); sizes the text window with "
                "text_window = limit",
                1, 1e9}},
    .needs = {.prefill_column_sums = true, .last_row_head_mean = true},
    .create = [](const ParamSet& p, const SampleInfo& s) -> std::unique_ptr<Policy> {
      return std::make_unique<Avl>(p, s);
    },
});

}  // namespace
}  // namespace kvsim
