// full: never evicts. The reference every other policy is measured against.
#include "policies/policy.hpp"

namespace kvsim {
namespace {

class FullCache final : public Policy {
 public:
  void on_prefill(const LayerView&, KvCache&) override {}
  void on_decode(const LayerView&, const StepAttention&, KvCache&) override {}
};

const PolicyRegistration reg({
    .name = "full",
    .summary = "Full cache: keeps every entry (the reference for all metrics).",
    .provenance = "kvsim",
    .params = {},
    .create = [](const ParamSet&, const SampleInfo&) { return std::make_unique<FullCache>(); },
    .keeps_everything = true,
});

}  // namespace
}  // namespace kvsim
