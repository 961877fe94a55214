// tova: Token Omission Via Attention (Oren et al. 2024, "Transformers are Multi-State RNNs",
// Sec. 4): whenever the cache exceeds its budget, the entry with the lowest attention from the
// current query, averaged over the layer's heads, is dropped. At the end of the prefill the
// current query is the last prompt token, so the top B entries by its attention stay. One set
// per layer (the paper averages over heads), ties evict the older.
// `compress = prefill` is kvpress's TOVAPress (presses/tova_press.py): the prompt is compressed
// once by the last prompt token's head-averaged attention, that token itself always kept (kvpress
// pads its score with the maximum), then decoding appends.
#include "policies/policy.hpp"
#include "policies/scorers.hpp"
#include "policies/selection.hpp"

namespace kvsim {
namespace {

class Tova final : public Policy {
 public:
  Tova(const ParamSet& p, const SampleInfo& s)
      : budget_(resolve_budget(p, s.prompt_len, "tova")),
        prefill_only_(p.get_string("compress") == "prefill") {
    check_question_once(p, "tova", !prefill_only_);
  }

  void on_prefill(const LayerView& view, KvCache& cache) override {
    std::vector<double> score = last_token_attention(view);
    if (prefill_only_) score[view.prompt_len() - 1] = kUnscored;  // kvpress keeps it
    keep_best(cache, score);
  }

  void on_decode(const LayerView& view, const StepAttention& att, KvCache& cache) override {
    if (prefill_only_) return;
    std::vector<double> score(view.visible_len(), 0.0);
    const int heads = att.group * cache.kv_heads();
    for (int g = 0; g < cache.kv_heads(); ++g)
      for (int r = 0; r < att.group; ++r) {
        const float* p = att.head(g, r, cache.size(g));
        for (int e = 0; e < cache.size(g); ++e) score[cache.position(g, e)] += p[e] / heads;
      }
    keep_best(cache, score);
  }

  int capacity(int, int) const override { return prefill_only_ ? -1 : budget_; }

 private:
  void keep_best(KvCache& cache, const std::vector<double>& score_by_position) const {
    for (int g = 0; g < cache.kv_heads(); ++g) {
      if (cache.size(g) <= budget_) continue;
      std::vector<double> s(cache.size(g));
      for (int e = 0; e < cache.size(g); ++e) s[e] = score_by_position[cache.position(g, e)];
      cache.keep_only(g, keep_top_scores(s, budget_));
    }
  }
  int budget_;
  bool prefill_only_;
};

const PolicyRegistration reg({
    .name = "tova",
    .summary = "Evicts the entry the current query attends least (head-averaged), every step.",
    .provenance = "Oren et al. 2024, TOVA, Sec. 4",
    .params = {budget_param(), budget_rounding_param(false)},
    .switches = {.compress = true, .question = true},
    .needs = {.prefill_column_sums = false, .last_row_head_mean = true},
    .create = [](const ParamSet& p, const SampleInfo& s) -> std::unique_ptr<Policy> {
      return std::make_unique<Tova>(p, s);
    },
});

}  // namespace
}  // namespace kvsim
