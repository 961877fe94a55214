// Multimodal rotary positions (M-RoPE, Qwen2-VL: Wang et al. 2024, arXiv 2409.12191, Sec. 2.1;
// transformers' models/qwen2_vl/modeling_qwen2_vl.py, get_rope_index and
// apply_multimodal_rotary_pos_emb). Each token has three position ids (temporal, height, width);
// the rotary pairs are split into three sections, and pair f rotates by the id of its section's
// axis. Text tokens carry one id on all three axes, so on text M-RoPE is plain RoPE.
#pragma once

#include <cstdint>
#include <vector>

#include "traces/kvtrace.hpp"

namespace kvsim {

// The axis (0 temporal, 1 height, 2 width) of rotary pair f (dimensions f and f + d/2) under
// `section`, the pairs per axis in order (transformers splits cos/sin by mrope_section on each
// half of the rotate_half layout, so pair f's axis is the section holding f).
int mrope_axis(const std::vector<int>& section, int pair);

// Qwen2-VL's sections for head dimension d: [16, 24, 24] at d = 128 (its config's
// rope_scaling.mrope_section), and in proportion elsewhere (d/8, 3d/16, the rest).
std::vector<int> qwen2vl_mrope_section(int head_dim);

// The position ids [3, T] (axis-major) that Qwen2-VL's get_rope_index gives a token layout: text
// continues one past the largest id so far on all axes; a vision item starting at id s puts
// token (t, r, c) of its t x h x w grid at (s + t, s + r, s + c). Items are the runs of one
// media_id; consecutive video frames with no text between form one video, a frame per temporal
// step (Qwen2-VL merges two frames per step; a trace records the merged grid). A frame of n
// tokens is taken as h x w with h the largest divisor of n up to sqrt(n).
std::vector<std::int32_t> qwen2vl_position_ids(const SampleInfo& sample);

// The rotary position of token `pos` on pair f: its id on the pair's axis when the sample records
// M-RoPE positions (under the trace's `mrope_section`), else pos.
inline int rotary_position(const std::vector<int>& mrope_section, const SampleInfo& sample, int pos,
                           int pair) {
  if (sample.position_ids.empty()) return pos;
  const std::size_t T = static_cast<std::size_t>(sample.total_len());
  return sample.position_ids[static_cast<std::size_t>(mrope_axis(mrope_section, pair)) * T +
                             static_cast<std::size_t>(pos)];
}

// One past the largest position id of the first `prompt_len` tokens on any axis: where the next
// token's ids start (Qwen2-VL's rope_deltas), prompt_len for plain RoPE.
int next_rotary_position(const SampleInfo& sample, int prompt_len);

}  // namespace kvsim
