// Synthetic multimodal kvtrace files whose attention has the structure the papers in
// five papers kvsim implements observe in real MLLMs (see the knob list below and docs/synthetic.md).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>

#include "traces/kvtrace_writer.hpp"

namespace kvsim {

struct SynthConfig {
  // Shape (defaults: LLaVA-1.5-7B).
  std::string model = "synthetic-llava-1.5-7b";
  int layers = 32;
  int heads = 32;
  int kv_heads = 32;
  int head_dim = 128;
  int samples = 1;
  std::uint64_t seed = 1;
  bool with_v = true;
  WriteOptions write;

  // Prompt layout: [system][media 1][sep][media 2]...[user] then gen_tokens generated.
  int system_tokens = 35;
  int media_count = 1;
  int media_tokens = 576;  // per image / frame (576 = LLaVA-1.5 CLIP-336 grid)
  bool video = false;      // media are video frames (modality 2) rather than images
  // Rotate q and k by Qwen2-VL's multimodal rotary positions (traces/mrope.hpp) instead of the
  // token index, and record them (position_ids, mrope_section); consecutive video frames with no
  // separator form one video.
  bool mrope = false;
  int separator_tokens = 2;
  int user_tokens = 29;
  int gen_tokens = 64;

  // Attention structure, in logit units before the per-layer sharpness factor.
  double rope_base = 10000.0;       // rotary base; content lives in the slowest pairs
  int sinks = 2;                    // first positions that act as attention sinks
  double sink_strength = 5.0;       // logit bonus of a sink key (ramps up over layers 0-2)
  double locality = 4.0;            // logit bonus of a key at distance 0 (rotary kernel)
  double locality_width = 8.0;      // e-folding of the rotary spectrum, in frequency pairs
  double vision_locality = 0.0;     // locality of vision keys relative to text keys
  double vision_offset = -2.0;      // mean logit of vision keys relative to text keys
  double head_preference = 1.5;     // per-head modality preference spread (+ vision, - text)
  double saliency_first = 1.2;      // spread of vision saliency logits in the first layer
  double saliency_last = 3.0;       // ... in the last layer (dense early, concentrated deep)
  double sharpness_first = 0.6;     // factor on all logits in the first layer
  double sharpness_last = 1.5;      // ... in the last layer
  double layer_correlation = 0.95;  // AR(1) correlation of saliency between adjacent layers
  double vision_decay = 1.5;        // vision logit drop after gen_decay_steps generated tokens
  int gen_decay_steps = 64;
  double saliency_drift = 0.01;  // radians per decode step the salient set rotates
  double noise = 0.3;            // std of the logit noise

  // Hidden states: q, k and v are projections of one per-token hidden state (plus the named
  // terms above), so similar keys have similar values. Image tokens lie on a grid; each belongs
  // to one of `image_regions` regions (near-duplicate patches of one object or background), and
  // its state mixes the region's prototype, a spatially smooth field and its own detail, with
  // these shares of the variance (the detail gets 1 - region - smooth).
  int hidden_dim = 64;
  int image_regions = 12;
  double region_share = 0.55;
  double smooth_share = 0.30;
  double smooth_length = 2.0;        // correlation length of the smooth field, in patches
  double frame_correlation = 0.9;    // video: correlation of consecutive frames' states
  double saliency_head_share = 0.8;  // share of a head's saliency common to every head
  int key_rank = 8;                  // rank of the key projection of h (keys are low-rank)
  double key_modality_norm = 4.0;    // norm of the modality direction every key carries
  double value_mean = 1.0;           // norm of the shared value mean / norm of the content part
  double vision_value_mean = 0.0;    // norm of the vision tokens' own value mean, the same scale
  double sink_value_scale = 0.2;     // sinks' values are small (they absorb attention, not content)

  int prompt_len() const {
    return system_tokens + media_count * media_tokens +
           std::max(media_count - 1, 0) * separator_tokens + user_tokens;
  }
  void validate() const;  // throws std::invalid_argument naming the knob
};

// Metadata of synthetic sample `index` (modality, segment, media_id, token_ids).
SampleInfo synth_sample_info(const SynthConfig& c, int index);

// Generates one layer of one sample (deterministic for (seed, sample, layer)).
LayerTensors synth_layer(const SynthConfig& c, int sample, int layer);

// Writes the whole trace, calling progress(done, total) after each layer.
void synth_write(const SynthConfig& c, const std::string& path,
                 const std::function<void(int, int)>& progress = {});

}  // namespace kvsim
