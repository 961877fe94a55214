// streamingllm: attention sinks plus a sliding window (Xiao et al., "Efficient Streaming Language
// Models with Attention Sinks", ICLR 2024, Sec. 3.2): keep the first `sinks` positions and the
// budget - sinks most recent, after the prefill and after every decode step.
// `compress = prefill` is how kvpress (presses/streaming_llm_press.py, n_sink = 4) and
// KVCache-Factory (pyramidkv_utils.py StreamingLLMKVCluster; run_longbench.py sets the window to
// B - 4, so it too keeps 4 sinks) run it: the prompt is compressed once, then decoding appends.
#include <stdexcept>

#include "policies/merging.hpp"
#include "policies/policy.hpp"
#include "policies/selection.hpp"

namespace kvsim {
namespace {

class StreamingLlm final : public Policy {
 public:
  StreamingLlm(const ParamSet& p, const SampleInfo& s)
      : budget_(resolve_budget(p, s.prompt_len, "streamingllm")),
        sinks_(p.get_int("sinks")),
        prefill_only_(p.get_string("compress") == "prefill"),
        merge_(
            read_prompt_merge(p, "streamingllm", prefill_only_ ? nullptr : "compress = prefill")) {
    check_question_once(p, "streamingllm", !prefill_only_);
    if (budget_ <= sinks_)
      throw std::invalid_argument(
          "streamingllm: budget (" + std::to_string(budget_) +
          " entries) must exceed parameter 'sinks' = " + std::to_string(sinks_));
  }
  void on_prefill(const LayerView& view, KvCache& cache) override { trim(cache, &view); }
  void on_decode(const LayerView&, const StepAttention&, KvCache& cache) override {
    if (!prefill_only_) trim(cache);
  }
  int capacity(int, int) const override { return prefill_only_ ? -1 : budget_; }

 private:
  // Keeps the sinks and the newest; at the prefill (`prefill` set) the others may merge.
  void trim(KvCache& cache, const LayerView* prefill = nullptr) const {
    for (int g = 0; g < cache.kv_heads(); ++g) {
      if (cache.size(g) <= budget_) continue;
      const auto keep = sink_and_recent_mask(cache.size(g), sinks_, budget_ - sinks_);
      if (prefill)
        keep_or_merge(*prefill, cache, g, keep, merge_);
      else
        cache.keep_only(g, keep);
    }
  }
  int budget_;
  int sinks_;
  bool prefill_only_;
  std::optional<MergeKind> merge_;
};

const PolicyRegistration reg({
    .name = "streamingllm",
    .summary = "Attention sinks + sliding window: the first `sinks` positions and the most recent.",
    .provenance = "Xiao et al. 2024, StreamingLLM, Sec. 3.2",
    .params = {budget_param(),
               budget_rounding_param(false),
               {"sinks", ParamType::kInt, "4", "initial positions always kept", 0, 1e9},
               prompt_merge_param()},
    .switches = {.compress = true, .caches = true, .question = true},
    .merges_for = merges_by_param,
    .create = [](const ParamSet& p, const SampleInfo& s) -> std::unique_ptr<Policy> {
      return std::make_unique<StreamingLlm>(p, s);
    },
});

}  // namespace
}  // namespace kvsim
