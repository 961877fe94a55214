// text_only: the image-free reference. At the end of the prefill every image and video entry is
// evicted and the text is kept; decoding appends. Unlike a prompt without its image (the
// no-image control), the text that follows the media has attended to it during the prefill, so
// its keys and values still carry what it read: the row says how much of an answer survives on
// that alone. Every budgeted policy should do at least as well at a budget above the text's size.
#include "policies/policy.hpp"

namespace kvsim {
namespace {

class TextOnly final : public Policy {
 public:
  void on_prefill(const LayerView& view, KvCache& cache) override {
    const VisibleModality modality = view.modality();
    cache.evict_positions_if([&](std::int32_t pos) {
      return modality[pos] != static_cast<std::uint8_t>(Modality::kText);
    });
  }
  void on_decode(const LayerView&, const StepAttention&, KvCache&) override {}
};

const PolicyRegistration reg({
    .name = "text_only",
    .summary = "The image-free reference: evicts every image and video entry after the prefill "
               "and keeps the text (sizes itself: no budget).",
    .provenance = "kvsim",
    .params = {},
    .create = [](const ParamSet&, const SampleInfo&) { return std::make_unique<TextOnly>(); },
});

}  // namespace
}  // namespace kvsim
