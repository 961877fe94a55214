#include <cstdio>

#include "core/partial_files.hpp"
#include "sim/cli/cli.hpp"
#include "sim/run/output_guard.hpp"
#include "sim/run/progress.hpp"
#include "traces/synth.hpp"

namespace kvsim::cli {

Runner add_synth(CLI::App& app) {
  app.description(
      "Write a synthetic multimodal kvtrace v1 file whose attention has the structure observed "
      "in real MLLMs: attention sinks, local text attention, image blocks attended densely in "
      "early layers and sparsely in deep ones, vision share decaying with generated length, "
      "heads preferring one modality, similar adjacent layers, rotary positions; q, k and v "
      "projected from per-token hidden states (neighbouring image patches alike, keys and values "
      "alike together). Defaults give "
      "the LLaVA-1.5-7B shape (32 layers, 32 heads, d = 128, 640-token prompt with 576 image "
      "tokens, 64 generated tokens). Deterministic for a seed.");
  app.footer(
      "Examples:\n  kvsim synth --out demo.h5      the LLaVA-1.5-7B-shaped demo trace (528 MiB)\n  "
      "kvsim synth --out small.h5 --layers 4 --heads 8 --kv-heads 8 --head-dim 64 --media-tokens "
      "144 --gen-tokens 16\n  kvsim synth --out video.h5 --layers 2 --heads 28 --kv-heads 4 "
      "--video --mrope --media-count 32 --media-tokens 256 --separator-tokens 0   a Qwen2-VL-7B-"
      "shaped video trace, 8.3k tokens");
  auto c = std::make_shared<SynthConfig>();
  auto out = std::make_shared<std::string>();
  auto dtype = std::make_shared<std::string>("float16");
  auto no_v = std::make_shared<bool>(false);
  auto force = std::make_shared<bool>(false);
  app.add_option("-o,--out", *out, "Output kvtrace file")->required();
  app.add_flag("--force", *force, "Replace an existing kvtrace file at --out");
  app.add_option("--model", c->model, "Value of the 'model' attribute")->capture_default_str();
  app.add_option("--layers", c->layers, "Attention layers L")->capture_default_str();
  app.add_option("--heads", c->heads, "Query heads H")->capture_default_str();
  app.add_option("--kv-heads", c->kv_heads, "KV heads (< heads for GQA)")->capture_default_str();
  app.add_option("--head-dim", c->head_dim, "Head dimension d (even, >= 16)")
      ->capture_default_str();
  app.add_option("--samples", c->samples, "Samples in the file")->capture_default_str();
  app.add_option("--seed", c->seed, "Random seed")->capture_default_str();
  app.add_option("--dtype", *dtype, "float16 or float32")
      ->check(CLI::IsMember({"float16", "float32"}))
      ->capture_default_str();
  app.add_flag("--no-v", *no_v, "Omit values (no output-error metrics)");
  app.add_option("--gzip", c->write.gzip_level,
                 "gzip level 1-9 (0: uncompressed, the default: "
                 "gzip shrinks float16 to ~0.88 and slows reads 6-15x)")
      ->capture_default_str();
  app.add_flag("--shuffle", c->write.shuffle, "Byte-shuffle filter (implies chunked)");
  app.add_flag("--chunked", c->write.chunked, "Chunked storage (64 tokens per chunk)");
  app.add_option("--system-tokens", c->system_tokens, "System prompt tokens before the media")
      ->capture_default_str();
  app.add_option("--media-count", c->media_count, "Images (or video frames)")
      ->capture_default_str();
  app.add_option("--media-tokens", c->media_tokens, "Tokens per image/frame")
      ->capture_default_str();
  app.add_flag("--video", c->video, "Media are video frames (modality 2)");
  app.add_flag("--mrope", c->mrope,
               "Qwen2-VL's multimodal rotary positions (temporal, height, width ids; frames "
               "without separators form one video): q and k rotated by them, recorded as "
               "position_ids and mrope_section");
  app.add_option("--separator-tokens", c->separator_tokens, "Text tokens between media")
      ->capture_default_str();
  app.add_option("--user-tokens", c->user_tokens, "User instruction tokens after the media")
      ->capture_default_str();
  app.add_option("--gen,--gen-tokens", c->gen_tokens,
                 "Generated tokens G (--gen, as in kvsim live)")
      ->capture_default_str();
  app.add_option("--rope-base", c->rope_base, "Rotary base")->capture_default_str();
  app.add_option("--sinks", c->sinks, "Attention-sink positions")->capture_default_str();
  app.add_option("--sink-strength", c->sink_strength, "Sink logit bonus")->capture_default_str();
  app.add_option("--locality", c->locality, "Logit bonus of the nearest keys (rotary kernel)")
      ->capture_default_str();
  app.add_option("--locality-width", c->locality_width,
                 "Rotary spectrum e-folding, in pairs (smaller: more local)")
      ->capture_default_str();
  app.add_option("--vision-locality", c->vision_locality,
                 "Locality of vision keys relative to text")
      ->capture_default_str();
  app.add_option("--vision-offset", c->vision_offset, "Mean logit of vision keys relative to text")
      ->capture_default_str();
  app.add_option("--head-preference", c->head_preference, "Spread of per-head modality preference")
      ->capture_default_str();
  app.add_option("--saliency-first", c->saliency_first, "Vision saliency spread, first layer")
      ->capture_default_str();
  app.add_option("--saliency-last", c->saliency_last, "Vision saliency spread, last layer")
      ->capture_default_str();
  app.add_option("--sharpness-first", c->sharpness_first, "Logit factor, first layer")
      ->capture_default_str();
  app.add_option("--sharpness-last", c->sharpness_last, "Logit factor, last layer")
      ->capture_default_str();
  app.add_option("--layer-correlation", c->layer_correlation,
                 "Saliency correlation of adjacent layers")
      ->capture_default_str();
  app.add_option("--vision-decay", c->vision_decay, "Vision logit drop over --gen-decay-steps")
      ->capture_default_str();
  app.add_option("--gen-decay-steps", c->gen_decay_steps,
                 "Generated tokens over which vision decays")
      ->capture_default_str();
  app.add_option("--saliency-drift", c->saliency_drift,
                 "Radians per decode step the salient set rotates")
      ->capture_default_str();
  app.add_option("--noise", c->noise, "Logit noise std")->capture_default_str();
  app.add_option("--hidden-dim", c->hidden_dim,
                 "Width of the per-token hidden states q, k and v are projected from")
      ->capture_default_str();
  app.add_option("--image-regions", c->image_regions,
                 "Regions per image (patches of one region are near-duplicates)")
      ->capture_default_str();
  app.add_option("--region-share", c->region_share,
                 "Share of an image token's state from its region prototype")
      ->capture_default_str();
  app.add_option("--smooth-share", c->smooth_share,
                 "Share from a spatially smooth field (the rest is the patch's own detail)")
      ->capture_default_str();
  app.add_option("--smooth-length", c->smooth_length,
                 "Correlation length of the smooth field, in patches")
      ->capture_default_str();
  app.add_option("--frame-correlation", c->frame_correlation,
                 "Video: correlation of consecutive frames' states")
      ->capture_default_str();
  app.add_option("--saliency-head-share", c->saliency_head_share,
                 "Share of a head's vision saliency common to all heads")
      ->capture_default_str();
  app.add_option("--key-rank", c->key_rank,
                 "Rank of the key projection of the hidden state (values see all of it)")
      ->capture_default_str();
  app.add_option("--key-modality-norm", c->key_modality_norm,
                 "Norm of the modality direction in every key (logits unchanged)")
      ->capture_default_str();
  app.add_option("--value-mean", c->value_mean,
                 "Norm of the value mean shared by a layer's tokens, relative to the content part")
      ->capture_default_str();
  app.add_option(
         "--vision-value-mean", c->vision_value_mean,
         "Norm of a value mean shared by the vision tokens only, relative to the content part")
      ->capture_default_str();
  app.add_option("--sink-value-scale", c->sink_value_scale, "Factor on the sinks' values")
      ->capture_default_str();
  return [=] {
    c->write.dtype = *dtype == "float16" ? DType::kFloat16 : DType::kFloat32;
    c->with_v = !*no_v;
    c->validate();
    check_outputs({{*out, "--out", OutputKind::trace}}, {}, *force);
    Progress progress(static_cast<long>(c->samples) * c->layers, "synth");
    synth_write(*c, begin_partial(*out), [&](int, int) { progress.advance(); });
    progress.finish();
    publish(*out);
    std::printf("wrote %s: %d sample(s), %d layers, %d heads (%d KV), d = %d, P = %d, G = %d, %s\n",
                out->c_str(), c->samples, c->layers, c->heads, c->kv_heads, c->head_dim,
                c->prompt_len(), c->gen_tokens, dtype->c_str());
    return 0;
  };
}

}  // namespace kvsim::cli
