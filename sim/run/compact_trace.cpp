#include "sim/run/compact_trace.hpp"

#include <cstdio>
#include <stdexcept>
#include <xtensor/xview.hpp>

#include "core/layer_attention.hpp"
#include "core/partial_files.hpp"
#include "core/sample_stats.hpp"
#include "traces/kvtrace_writer.hpp"

namespace kvsim {

int compact_first_row(const SampleInfo& sample, int window) {
  const int question = question_length(sample);
  const int context = sample.prompt_len - question;
  const int start = std::max(0, context - window);
  return start / kPrefillBlockRows * kPrefillBlockRows;
}

SampleInfo compact_sample(SampleInfo sample, int window) {
  const int question = question_length(sample);
  sample.compact_first_row = compact_first_row(sample, window);
  sample.compact_context_len = question > 0 ? sample.prompt_len - question : 0;
  return sample;
}

namespace {

// The window statistics of the widths `trace` lists (LayerAttention::window_group_sums and
// last_row_head_mean, its own code and products) of `att`'s prompt, into `part`.
void take_window_stats(const TraceInfo& trace, const LayerAttention& att,
                       StoredPromptStats::Prompt& part) {
  const std::vector<int>& widths = trace.compact_window_widths;
  if (widths.empty()) return;
  for (int w : widths) {
    std::vector<double>& sums = part.window_group_sums[w];
    for (int g = 0; g < trace.num_kv_heads; ++g) {
      const std::vector<double> one = att.window_group_sums(g, w);
      sums.insert(sums.end(), one.begin(), one.end());
    }
  }
  part.last_row_head_mean = att.last_row_head_mean();
}

// The same of the context (the sample's first `context` positions taken as the prompt): its
// window's blocks against its own keys. `full` is moved through the computation and back.
void add_context_window_stats(const TraceInfo& trace, const SampleInfo& sample, int context,
                              LayerTensors& full, int threads, StoredPromptStats::Prompt& part) {
  if (trace.compact_window_widths.empty() || context == 0) return;
  const AttentionNeeds needs{.window_group_sums = trace.compact_window_widths,
                             .last_row_head_mean = true};
  LayerAttention att(LayerAttention::PromptOnly{}, trace,
                     context_only(sample, sample.prompt_len - context), std::move(full), needs,
                     threads);
  take_window_stats(trace, att, part);
  full = att.release_tensors();
}

// The statistics LayerAttention keeps of the sample's prompt and, when `context` > 0, of its
// first `context` positions (the context before its question), from one pass over the prompt:
// the same bytes as a LayerAttention of each. `full` is moved through the computation and back.
void add_prompt_parts(const TraceInfo& trace, const SampleInfo& sample, int context,
                      LayerTensors& full, int threads, StoredPromptStats& stats) {
  const AttentionNeeds needs{.prefill_column_sums = true,
                             .window_group_sums = trace.compact_window_widths,
                             .last_row_head_mean = !trace.compact_window_widths.empty(),
                             .text_query_layers = trace.num_layers,
                             .prefill_column_sums_rounded = true};
  LayerAttention att(LayerAttention::PromptOnly{.prefix = context}, trace, sample, std::move(full),
                     needs, threads);
  const int H = trace.num_heads;
  const auto part = [H](int P, auto column_sums, auto column_sums_rounded, const float* text_sums,
                        const float* text_max) {
    StoredPromptStats::Prompt p;
    p.column_sums.reserve(static_cast<std::size_t>(H) * P);
    p.column_sums_rounded.reserve(static_cast<std::size_t>(H) * P);
    for (int h = 0; h < H; ++h) {
      p.column_sums.insert(p.column_sums.end(), column_sums(h), column_sums(h) + P);
      p.column_sums_rounded.insert(p.column_sums_rounded.end(), column_sums_rounded(h),
                                   column_sums_rounded(h) + P);
    }
    p.text_column_sums.assign(text_sums, text_sums + P);
    p.text_column_max.assign(text_max, text_max + P);
    return p;
  };
  stats.by_prompt_len[sample.prompt_len] = part(
      sample.prompt_len, [&](int h) { return att.prefill_column_sums(h); },
      [&](int h) { return att.prefill_column_sums_rounded(h); }, att.text_query_column_sums(),
      att.text_query_column_max());
  take_window_stats(trace, att, stats.by_prompt_len[sample.prompt_len]);
  if (context > 0)
    stats.by_prompt_len[context] = part(
        context, [&](int h) { return att.prefix_column_sums(h); },
        [&](int h) { return att.prefix_column_sums_rounded(h); },
        att.prefix_text_query_column_sums(), att.prefix_text_query_column_max());
  full = att.release_tensors();
}

// The full cache's results at the sample's decode steps (StoredPromptStats::Decode), as a
// replay's LayerAttention computes them (the same code and products, so the same bytes). `full`
// is moved through the computation and back; nothing without values or decode steps.
void add_decode_results(const TraceInfo& trace, const SampleInfo& sample, LayerTensors& full,
                        int threads, StoredPromptStats& stats) {
  if (sample.gen_len == 0 || !full.has_v()) return;
  LayerAttention att(trace, sample, std::move(full), AttentionNeeds{}, threads);
  const std::size_t rows = static_cast<std::size_t>(sample.gen_len) * trace.num_heads;
  StoredPromptStats::Decode& d = stats.decode;
  d.prompt_len = sample.prompt_len;
  d.kv_heads = trace.num_kv_heads;
  d.output.assign(att.full_output(0, 0), att.full_output(0, 0) + rows * trace.head_dim);
  d.value_norm.resize(rows);
  d.mass.resize(rows);
  for (int t = 0; t < sample.gen_len; ++t)
    for (int h = 0; h < trace.num_heads; ++h) {
      d.value_norm[static_cast<std::size_t>(t) * trace.num_heads + h] = att.full_value_norm(t, h);
      d.mass[static_cast<std::size_t>(t) * trace.num_heads + h] = att.decode_mass(t, h);
    }
  full = att.release_tensors();
}

}  // namespace

StoredPromptStats prompt_stats_of_layer(const TraceInfo& trace, const SampleInfo& sample,
                                        LayerTensors& full, bool entropies, int threads) {
  if (full.stored) throw std::logic_error("prompt statistics of a layer that is already compact");
  StoredPromptStats stats;
  const int question = question_length(sample);
  add_prompt_parts(trace, sample, question > 0 ? sample.prompt_len - question : 0, full, threads,
                   stats);
  if (question > 0)
    add_context_window_stats(trace, sample, sample.prompt_len - question, full, threads,
                             stats.by_prompt_len[sample.prompt_len - question]);
  stats.has_entropies = entropies;
  if (entropies) stats.entropies = entropy_array(layer_entropies(trace, sample, full, threads));
  return stats;
}

LayerTensors compact_layer(const TraceInfo& trace, const SampleInfo& compact, LayerTensors full,
                           bool entropies, int threads) {
  auto stats = std::make_shared<StoredPromptStats>(
      prompt_stats_of_layer(trace, compact, full, entropies, threads));
  stats->layer = full.layer;
  add_decode_results(trace, compact, full, threads, *stats);
  const std::size_t first = static_cast<std::size_t>(compact.compact_first_row);
  LayerTensors out;
  out.layer = full.layer;
  out.q = xt::view(full.q, xt::range(first, full.q.shape(0)), xt::all(), xt::all());
  out.k = std::move(full.k);
  out.v = std::move(full.v);
  out.q_first_row = compact.compact_first_row;
  out.stored = std::move(stats);
  return out;
}

void write_compact_trace(const TraceReader& in, const std::string& out_path,
                         const CompactOptions& options,
                         const std::function<void(long layers_done)>& progress) {
  if (in.info().compact()) throw std::invalid_argument(in.path() + " is already a compact trace");
  if (options.window < 1)
    throw std::invalid_argument("--window " + std::to_string(options.window) +
                                ": must be at least 1");
  for (std::size_t i = 0; i < options.window_widths.size(); ++i) {
    const int w = options.window_widths[i];
    if (w < 1 || w > options.window || (i > 0 && w <= options.window_widths[i - 1]))
      throw std::invalid_argument("--window-sums: widths must ascend from 1 to --window " +
                                  std::to_string(options.window) + ", not " + std::to_string(w));
  }
  TraceInfo info = in.info();
  info.compact_window = options.window;
  info.compact_window_widths = options.window_widths;
  info.compact_entropies = options.entropies;
  const std::vector<std::string>& names = in.sample_names();
  const DType dtype = in.read_sample(names.front()).dtype;
  // Created first by plain I/O, so that a place that cannot be written is named with the
  // system's reason (HDF5 gives none).
  std::fclose(open_partial(out_path));
  TraceWriter writer(partial(out_path), info, WriteOptions{.dtype = dtype});
  LayerTensors layer;
  long done = 0;
  for (const std::string& name : names) {
    const SampleInfo original = in.read_sample(name);
    const SampleInfo sample = compact_sample(original, options.window);
    if (sample.dtype != dtype)
      throw std::invalid_argument(in.path() + ": sample '" + name + "' is " +
                                  dtype_name(sample.dtype) + " where '" + names.front() + "' is " +
                                  dtype_name(dtype) + ": a compact trace holds one dtype");
    writer.write_sample(sample);
    int rows = 0, cols = 0;
    const std::vector<float> logits = in.read_sample_matrix(sample, "logits", rows, cols);
    if (!logits.empty()) writer.write_sample_matrix(sample, "logits", rows, cols, logits.data());
    for (int l = 0; l < info.num_layers; ++l) {
      in.read_layer_into(original, l, layer);
      writer.write_layer(sample, compact_layer(info, sample, std::move(layer), options.entropies,
                                               options.threads));
      layer = LayerTensors{};
      if (progress) progress(++done);
    }
  }
  writer.close();
  publish(out_path);
}

}  // namespace kvsim
