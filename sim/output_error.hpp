// The output errors of one policy in one layer, batched: instead of one weighted sum of value rows
// per decode step and query head (a scalar loop over the retained entries), the weights of a block
// of steps are scattered into a [rows, union of their attended positions] matrix and multiplied by
// the gathered values in one GEMM. No policy reads these metrics, so they can wait until the
// layer's last step; consecutive steps of an evicting policy attend nearly the same positions, so
// the union is barely wider than one step's set (1.05-1.12x for the five baselines of the demo).
#pragma once

#include <cstdint>
#include <vector>

#include "sim/layer_attention.hpp"

namespace kvsim {

struct StepMetrics;

class DeferredOutputError {
 public:
  // `att` supplies the attended probabilities, `ref` the full-cache outputs and the values.
  DeferredOutputError(const LayerAttention& att, const LayerAttention& ref)
      : att_(att), ref_(ref), heads_(ref.num_kv_heads()) {}

  // Step `step`, KV head g attended the n positions (ascending); query head r of the group
  // renormalises the full-cache probabilities by inverse_weights[r]. ref2 = Σ_r ‖o_r‖² and
  // vnorm2 = Σ_r (Σ_j p_j ‖v_j‖)² of the full cache.
  void add(int step, int g, const std::int32_t* positions, int n, const double* inverse_weights,
           double ref2, double vnorm2);
  // Sets output_rel_error and output_value_error of every recorded (step, KV head) in
  // steps[g][step] (merged entries never get here: their values are not the trace's).
  void finish(std::vector<std::vector<StepMetrics>>& steps) const;

 private:
  struct Row {
    int step = 0, n = 0;
    std::size_t positions = 0, inverse_weights = 0;  // offsets of n positions, group weights
    double ref2 = 0, vnorm2 = 0;
  };
  struct Head {
    std::vector<Row> rows;
    std::vector<std::int32_t> positions;
    std::vector<double> inverse_weights;
  };
  void finish_block(int g, const Row* rows, int count,
                    std::vector<std::vector<StepMetrics>>& steps) const;

  const LayerAttention& att_;
  const LayerAttention& ref_;
  std::vector<Head> heads_;
};

}  // namespace kvsim
