#include "core/layer_attention.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <sstream>
#include <stdexcept>

#include "core/kernels/kernels.hpp"
#include "core/parallel.hpp"
#include "core/suggest.hpp"
#include "traces/half.hpp"

namespace kvsim {

void AttentionNeeds::merge(const AttentionNeeds& o) {
  prefill_column_sums |= o.prefill_column_sums;
  text_query_layers = std::max(text_query_layers, o.text_query_layers);
  sample_entropies |= o.sample_entropies;
  std::vector<int> windows = sample_window_sums;
  windows.insert(windows.end(), o.sample_window_sums.begin(), o.sample_window_sums.end());
  std::sort(windows.begin(), windows.end());
  windows.erase(std::unique(windows.begin(), windows.end()), windows.end());
  sample_window_sums = std::move(windows);
  if (o.sparsity_epsilon > 0) sparsity_epsilon = o.sparsity_epsilon;
  key_ranking |= o.key_ranking;
  prefill_window = std::max(prefill_window, o.prefill_window);
  std::vector<int> widths = window_group_sums;
  widths.insert(widths.end(), o.window_group_sums.begin(), o.window_group_sums.end());
  std::sort(widths.begin(), widths.end());
  widths.erase(std::unique(widths.begin(), widths.end()), widths.end());
  window_group_sums = std::move(widths);
  last_row_head_mean |= o.last_row_head_mean;
  prefill_column_sums_rounded |= o.prefill_column_sums_rounded;
  prompt_queries |= o.prompt_queries;
}

namespace {

bool need_flag(const std::string& name, const std::string& value) {
  if (value == "true" || value == "True" || value == "1") return true;
  if (value == "false" || value == "False" || value == "0") return false;
  throw std::invalid_argument("need '" + name + "' takes true or false, not '" + value + "'");
}

int need_count(const std::string& name, const std::string& value) {
  std::size_t used = 0;
  int n = -1;
  try {
    n = std::stoi(value, &used);
  } catch (const std::exception&) {
  }
  if (used != value.size() || n < 0)
    throw std::invalid_argument("need '" + name + "' takes a count >= 0, not '" + value + "'");
  return n;
}

double need_fraction(const std::string& name, const std::string& value) {
  std::size_t used = 0;
  double x = -1;
  try {
    x = std::stod(value, &used);
  } catch (const std::exception&) {
  }
  if (used != value.size() || !(x >= 0 && x < 1))
    throw std::invalid_argument("need '" + name + "' takes a number in [0, 1), not '" + value +
                                "'");
  return x;
}

std::vector<int> need_windows(const std::string& name, const std::string& value) {
  std::vector<int> windows;
  std::stringstream ss(value);
  for (std::string w; std::getline(ss, w, ',');)
    if (const int n = need_count(name, w); n > 0) windows.push_back(n);
  std::sort(windows.begin(), windows.end());
  windows.erase(std::unique(windows.begin(), windows.end()), windows.end());
  return windows;
}

// Every field of AttentionNeeds, by name, with how it is set from text.
struct NeedField {
  std::string name;
  std::function<void(AttentionNeeds&, const std::string& name, const std::string& value)> set;
};

const std::vector<NeedField>& need_fields() {
  using N = AttentionNeeds;
  using S = const std::string&;
  static const std::vector<NeedField> fields = {
      {"prefill_column_sums", [](N& n, S k, S v) { n.prefill_column_sums = need_flag(k, v); }},
      {"prefill_window", [](N& n, S k, S v) { n.prefill_window = need_count(k, v); }},
      {"window_group_sums", [](N& n, S k, S v) { n.window_group_sums = need_windows(k, v); }},
      {"last_row_head_mean", [](N& n, S k, S v) { n.last_row_head_mean = need_flag(k, v); }},
      {"text_query_layers", [](N& n, S k, S v) { n.text_query_layers = need_count(k, v); }},
      {"sample_entropies", [](N& n, S k, S v) { n.sample_entropies = need_flag(k, v); }},
      {"sample_window_sums", [](N& n, S k, S v) { n.sample_window_sums = need_windows(k, v); }},
      {"sparsity_epsilon", [](N& n, S k, S v) { n.sparsity_epsilon = need_fraction(k, v); }},
      {"key_ranking", [](N& n, S k, S v) { n.key_ranking = need_flag(k, v); }},
      {"prefill_column_sums_rounded",
       [](N& n, S k, S v) { n.prefill_column_sums_rounded = need_flag(k, v); }},
      {"prompt_queries", [](N& n, S k, S v) { n.prompt_queries = need_flag(k, v); }},
  };
  return fields;
}

}  // namespace

const std::vector<std::string>& attention_need_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& f : need_fields()) out.push_back(f.name);
    return out;
  }();
  return names;
}

void set_attention_need(AttentionNeeds& needs, const std::string& name, const std::string& value) {
  for (const auto& f : need_fields())
    if (f.name == name) return f.set(needs, name, value);
  std::string known;
  for (const auto& k : attention_need_names()) known += (known.empty() ? "" : ", ") + k;
  throw std::invalid_argument("unknown need '" + name + "'" +
                              did_you_mean(name, attention_need_names()) + " (known: " + known +
                              ")");
}

std::string missing_from_compact(const AttentionNeeds& needs, const TraceInfo& trace) {
  if (!trace.compact()) return "";
  const int compact_window = trace.compact_window;
  const std::string keeps =
      "it keeps the query rows of windows up to " + std::to_string(compact_window) + " rows";
  if (needs.prompt_queries)
    return "every prompt query, not statistics of them; " + keeps + ": replay the full trace";
  if (needs.sparsity_epsilon > 0)
    return "the ε-sparsity counts of the prompt, which a compact trace does not store: replay "
           "the full trace";
  if (needs.sample_entropies && !trace.compact_entropies)
    return "the prompt entropies of every layer, which this compact trace was written without "
           "(--no-entropies): compact the full trace again without it";
  if (needs.sample_entropies && trace.compact_version < 3) {
    const std::string stored =
        "this compact trace (version " + std::to_string(trace.compact_version) + ")";
    const std::string how = trace.compact_version == 1
                                ? "from products shaped otherwise, equal to about 1e-9"
                                : "with scalar exponentials, equal to about 1e-15";
    return "the prompt entropies of every layer as this kvsim computes them; " + stored +
           " stores them " + how + " and not byte for byte: compact the full trace again";
  }
  int window = needs.prefill_window;
  for (int w : needs.sample_window_sums) window = std::max(window, w);
  const std::vector<int>& stored = trace.compact_window_widths;
  for (int w : needs.window_group_sums)  // a width the trace stores needs no rows
    if (!std::binary_search(stored.begin(), stored.end(), w)) window = std::max(window, w);
  if (window > compact_window)
    return "the attention of the last " + std::to_string(window) + " prompt rows; " + keeps +
           ": compact the full trace again with --window " + std::to_string(window);
  return "";
}

float round_to_dtype(float x, DType dtype) {
  return dtype == DType::kFloat16 ? half_to_float_scalar(float_to_half_scalar(x)) : x;
}

float softmax_inplace(float* x, int n, float scale) {
  return kernels::active().softmax_inplace(x, n, scale);
}

namespace {

// out[k] = Σ_{j < first_len + k} rows[k·stride + j] (· weights[j] when given), in double, each sum
// in ascending j as a plain loop adds it: the rows' chains are interleaved, kRows at a time, so
// that the additions overlap instead of each waiting on the last (the same bytes as one row
// after another, in less time: docs/performance.md).
template <bool kWeighted>
void ascending_row_sums(const float* rows, std::size_t stride, int count, int first_len,
                        const float* weights, double* out) {
  constexpr int kRows = 8;
  for (int k0 = 0; k0 < count; k0 += kRows) {
    const int m = std::min(kRows, count - k0), common = first_len + k0;
    const float* block = rows + static_cast<std::size_t>(k0) * stride;
    double acc[kRows] = {};
    for (int j = 0; j < common; ++j)
      for (int k = 0; k < kRows; ++k)
        if (k < m) {
          const double x = block[static_cast<std::size_t>(k) * stride + j];
          acc[k] += kWeighted ? x * weights[j] : x;
        }
    for (int k = 0; k < m; ++k) {
      const float* row = block + static_cast<std::size_t>(k) * stride;
      for (int j = common; j < common + k; ++j)
        acc[k] += kWeighted ? static_cast<double>(row[j]) * weights[j] : row[j];
      out[k0 + k] = acc[k];
    }
  }
}

// The prompt rows a layer's window statistics are taken from.
int rows_needed(const AttentionNeeds& needs) {
  int rows = std::max(needs.prefill_window, needs.last_row_head_mean ? 1 : 0);
  for (int w : needs.window_group_sums) rows = std::max(rows, w);
  return rows;
}

}  // namespace

LayerAttention::LayerAttention(Shape shape, const TraceInfo& trace, const SampleInfo& sample,
                               LayerTensors tensors, const AttentionNeeds& needs)
    : sample_(sample),
      tensors_(std::move(tensors)),
      L_(trace.num_layers),
      P_(sample.prompt_len),
      G_(sample.gen_len),
      T_(sample.total_len()),
      H_(trace.num_heads),
      Hkv_(trace.num_kv_heads),
      d_(trace.head_dim),
      window_(std::min(rows_needed(needs), sample.prompt_len)),
      scale_(static_cast<float>(trace.scale)),
      rope_theta_(trace.rope_theta),
      mrope_section_(trace.mrope_section),
      want_colsums_(needs.prefill_column_sums || needs.sparsity_epsilon > 0),
      want_rounded_colsums_(needs.prefill_column_sums_rounded),
      epsilon_(needs.sparsity_epsilon) {
  allocate(needs, shape.decode);
  if (epsilon_ > 0) sparse_counts_.assign(static_cast<std::size_t>(H_) * 2, 0);
}

LayerAttention::LayerAttention(const TraceInfo& trace, const SampleInfo& sample,
                               LayerTensors tensors, const AttentionNeeds& needs, int threads)
    : LayerAttention(Shape{}, trace, sample, std::move(tensors), needs) {
  // Each head writes only its own slices; BLAS runs single-threaded inside our threads.
  openblas_set_num_threads(1);
  if (tensors_.stored)
    take_stored(needs);
  else if (tensors_.layer < needs.text_query_layers)
    compute_text_query_stats(threads);
  const StoredPromptStats::Decode* known = stored_decode();
  if (G_ > 0 && tensors_.has_v() && !known) compute_value_norms(threads);
  prefill(needs, threads);
  if (G_ > 0) {
    // A KV head's query heads in one product (each key packed once, not once per head), split
    // into as many parts as keep the threads busy when there are fewer KV heads than threads.
    const int parts = std::min(group_size(), std::max(1, (threads + Hkv_ - 1) / Hkv_));
    parallel_for(Hkv_ * parts, threads, [&](int task) {
      const int g = task / parts, part = task % parts, gs = group_size();
      const int first = g * gs + part * gs / parts, last = g * gs + (part + 1) * gs / parts;
      if (first < last) compute_decode(first, last, known == nullptr);
    });
  }
  if (known) {
    decode_mass_ = known->mass;
    full_output_ = known->output;
    full_value_norm_ = known->value_norm;
  }
  compute_output_norms();
  if (needs.key_ranking && G_ > 0) {
    ranking_.resize(static_cast<std::size_t>(G_) * Hkv_ * T_);
    rank_counts_.resize(static_cast<std::size_t>(G_) * Hkv_ * 2);
    parallel_for(Hkv_, threads, [&](int g) { rank_keys(g); });
  }
}

LayerAttention::LayerAttention(PromptOnly prompt_only, const TraceInfo& trace,
                               const SampleInfo& sample, LayerTensors tensors,
                               const AttentionNeeds& needs, int threads)
    : LayerAttention(Shape{.decode = false}, trace, sample, std::move(tensors), needs) {
  if (needs.key_ranking)
    throw std::invalid_argument("key ranking needs every decode query: replay only");
  if (prompt_only.prefix < 0 || prompt_only.prefix >= P_ ||
      (prompt_only.prefix > 0 && tensors_.stored))
    throw std::logic_error("a prompt prefix of " + std::to_string(prompt_only.prefix) +
                           " positions on a prompt of " + std::to_string(P_) +
                           (tensors_.stored ? " with stored statistics" : ""));
  prefix_ = prompt_only.prefix;
  if (prefix_ > 0 && want_colsums_) prefix_colsums_.resize(static_cast<std::size_t>(H_) * prefix_);
  if (prefix_ > 0 && want_rounded_colsums_)
    prefix_rounded_.resize(static_cast<std::size_t>(H_) * prefix_);
  openblas_set_num_threads(1);
  if (tensors_.stored)
    take_stored(needs);
  else if (tensors_.layer < needs.text_query_layers)
    compute_text_query_stats(threads);
  prefill(needs, threads);
}

void LayerAttention::prefill(const AttentionNeeds& needs, int threads) {
  // A compact trace holds the column sums; its window rows wait for a reader when it also holds
  // every window statistic the run reads (the products of the window's blocks are the most of
  // what replaying a compact trace costs: docs/performance.md).
  const bool sums = (want_colsums_ || want_rounded_colsums_) && !tensors_.stored;
  window_deferred_ = window_ > 0 && stored_serves_window(needs);
  if (sums || (window_ > 0 && !window_deferred_)) compute_prefill_heads(threads);
}

const StoredPromptStats::Prompt* LayerAttention::stored_prompt() const {
  if (!tensors_.stored) return nullptr;
  const auto& parts = tensors_.stored->by_prompt_len;
  const auto it = parts.find(P_);
  return it == parts.end() ? nullptr : &it->second;
}

bool LayerAttention::stored_serves_window(const AttentionNeeds& needs) const {
  const StoredPromptStats::Prompt* p = stored_prompt();
  if (!p || needs.prefill_window > 0) return false;
  if (needs.last_row_head_mean && p->last_row_head_mean.size() != static_cast<std::size_t>(P_))
    return false;
  for (int w : needs.window_group_sums)
    if (!stored_group_sums(w)) return false;
  return true;
}

const std::vector<double>* LayerAttention::stored_group_sums(int width) const {
  const StoredPromptStats::Prompt* p = stored_prompt();
  if (!p) return nullptr;
  const auto it = p->window_group_sums.find(width);  // the last `width` rows: all when width > P
  // [Hkv, P] of the trace's KV heads: not of a layer whose KV heads are repeated per query head
  const bool fits =
      it != p->window_group_sums.end() && it->second.size() == static_cast<std::size_t>(Hkv_) * P_;
  return fits ? &it->second : nullptr;
}

void LayerAttention::ensure_window_rows() const {
  std::call_once(*window_once_, [this] {
    if (tensors_.k.size() == 0)
      throw std::logic_error("window rows read after the layer's tensors were released");
    // The rows the constructor deferred, computed as it would have (the same products): a cache
    // of its results, hence const.
    const_cast<LayerAttention*>(this)->compute_prefill_heads(1);
  });
}

void LayerAttention::take_stored(const AttentionNeeds& needs) {
  const StoredPromptStats& stored = *tensors_.stored;
  if (epsilon_ > 0)
    throw std::logic_error(
        "the ε-sparsity counts need every prompt query: a compact trace does not store them");
  if (want_colsums_) colsums_ = stored.prompt(P_, "prefill column sums").column_sums;
  if (want_rounded_colsums_)
    rounded_colsums_ = stored.prompt(P_, "rounded prefill column sums").column_sums_rounded;
  if (tensors_.layer < needs.text_query_layers) {
    const StoredPromptStats::Prompt& p = stored.prompt(P_, "text-query statistics");
    text_colsum_ = p.text_column_sums;
    text_colmax_ = p.text_column_max;
  }
}

const StoredPromptStats::Decode* LayerAttention::stored_decode() const {
  if (!tensors_.stored || !tensors_.has_v() || G_ == 0) return nullptr;
  // Only for the layer's own tensors in the trace's shape: not a layer attending with another's
  // q/k (its values differ), nor KV heads repeated, nor the prompt split before its question.
  const StoredPromptStats::Decode& d = tensors_.stored->decode;
  const bool same = !d.empty() && tensors_.stored->layer == tensors_.layer && d.prompt_len == P_ &&
                    d.kv_heads == Hkv_ && d.mass.size() == static_cast<std::size_t>(G_) * H_;
  return same ? &d : nullptr;
}

void LayerAttention::set_token_row(int position, const float* q, const float* k, const float* v) {
  std::copy(q, q + H_ * d_, &tensors_.q(position - tensors_.q_first_row, 0, 0));
  std::copy(k, k + Hkv_ * d_, &tensors_.k(position, 0, 0));
  if (tensors_.has_v()) std::copy(v, v + Hkv_ * d_, &tensors_.v(position, 0, 0));
}

void LayerAttention::allocate(const AttentionNeeds& needs, bool decode) {
  if (want_colsums_) colsums_.assign(static_cast<std::size_t>(H_) * P_, 0.0f);
  if (want_rounded_colsums_) rounded_colsums_.assign(static_cast<std::size_t>(H_) * P_, 0.0f);
  if (!decode) return;
  // Every element is written by compute_decode (or the reference replay): left uninitialised,
  // the [H, G, T] block is touched once, not zeroed first.
  decode_probs_ = take_pooled_block(static_cast<std::size_t>(G_) * H_ * T_);
  decode_lse_.assign(static_cast<std::size_t>(G_) * H_, 0.0f);
  decode_mass_.assign(static_cast<std::size_t>(G_) * H_, 0.0);
  if (tensors_.has_v()) {
    full_output_.assign(static_cast<std::size_t>(G_) * H_ * d_, 0.0f);
    full_value_norm_.assign(static_cast<std::size_t>(G_) * H_, 0.0f);
  }
}

std::vector<int> LayerAttention::text_query_rows() const {
  std::vector<int> rows;
  for (int i = 0; i < P_; ++i)
    if (sample_.modality[i] == static_cast<std::uint8_t>(Modality::kText)) rows.push_back(i);
  return rows;
}

void LayerAttention::compute_text_query_stats(int threads) {
  // Head-averaged rows need every head's row at once: process 16 text queries at a time, each
  // head into its own buffer, then average the heads in a fixed order (deterministic).
  const std::vector<int> rows = text_query_rows();
  text_colsum_.assign(P_, 0.0f);
  text_colmax_.assign(P_, 0.0f);
  constexpr int kBlock = 16;
  std::vector<float> probs(static_cast<std::size_t>(H_) * kBlock * P_);
  // The prefix's statistics are the sums before its first text row at or after it is added.
  const std::size_t prefix_end =
      static_cast<std::size_t>(std::lower_bound(rows.begin(), rows.end(), prefix_) - rows.begin());
  const auto take_prefix = [&] {
    if (prefix_ == 0) return;
    prefix_text_colsum_.assign(text_colsum_.begin(), text_colsum_.begin() + prefix_);
    prefix_text_colmax_.assign(text_colmax_.begin(), text_colmax_.begin() + prefix_);
  };
  for (std::size_t b0 = 0; b0 < rows.size(); b0 += kBlock) {
    const int n = static_cast<int>(std::min<std::size_t>(kBlock, rows.size() - b0));
    parallel_for(H_, threads, [&](int h) {
      const int g = h / group_size();
      for (int r = 0; r < n; ++r) {
        const int i = rows[b0 + r];
        float* row = &probs[(static_cast<std::size_t>(h) * kBlock + r) * P_];
        cblas_sgemv(CblasRowMajor, CblasNoTrans, i + 1, d_, 1.0f,
                    tensors_.k.data() + static_cast<std::size_t>(g) * d_, Hkv_ * d_,
                    tensors_.query(i, h), 1, 0.0f, row, 1);
        softmax_inplace(row, i + 1, scale_);
      }
    });
    for (int r = 0; r < n; ++r) {
      const int i = rows[b0 + r];
      if (b0 + r == prefix_end) take_prefix();
      for (int j = 0; j <= i; ++j) {
        float mean = 0;
        for (int h = 0; h < H_; ++h)
          mean += probs[(static_cast<std::size_t>(h) * kBlock + r) * P_ + j];
        mean /= H_;
        text_colsum_[j] += mean;
        text_colmax_[j] = std::max(text_colmax_[j], mean);
      }
    }
  }
  if (prefix_end == rows.size()) take_prefix();
}

const float* LayerAttention::text_query_column_sums() const {
  if (text_colsum_.empty()) throw std::logic_error("text-query statistics were not requested");
  return text_colsum_.data();
}

const float* LayerAttention::text_query_column_max() const {
  if (text_colmax_.empty()) throw std::logic_error("text-query statistics were not requested");
  return text_colmax_.data();
}

void LayerAttention::allocate_window_rows() {
  // Window row r is query P - window + r: its causal part is written by whoever computes the
  // prefill, so only the masked tail is zeroed here (the block is touched once, not twice).
  window_rows_ = take_pooled_block(static_cast<std::size_t>(H_) * window_ * P_);
  for (int h = 0; h < H_; ++h)
    for (int r = 0; r < window_; ++r) {
      float* row = &window_rows_[(static_cast<std::size_t>(h) * window_ + r) * P_];
      std::fill(row + P_ - window_ + r + 1, row + P_, 0.0f);
    }
}

void LayerAttention::compute_prefill_heads(int threads) {
  if (window_ > 0) allocate_window_rows();
  // Every prompt row's product packs the keys it sees (OpenBLAS copies them into its panel
  // layout for each product): read from a contiguous copy of the group's keys rather than in
  // place, at a stride of every KV head's row, that copying is faster (the products 11-24% faster
  // on a 2-core Xeon, 64 rows against 8k-32k keys), and the panels, so the products, are the same
  // bytes. A compact trace computes a few window blocks only: its keys are read in place.
  const bool all_rows = (want_colsums_ || want_rounded_colsums_) && !tensors_.stored;
  std::vector<float> keys(all_rows ? static_cast<std::size_t>(Hkv_) * P_ * d_ : 0);
  if (all_rows)
    parallel_for(Hkv_, threads, [&](int g) {
      for (int j = 0; j < P_; ++j)
        std::copy_n(tensors_.k.data() + (static_cast<std::size_t>(j) * Hkv_ + g) * d_, d_,
                    &keys[(static_cast<std::size_t>(g) * P_ + j) * d_]);
    });
  // Heads of one KV group in turn, block by block (one product per head and block: the same
  // bytes as head after head), so that a block's keys, read by the group's previous head, come
  // from the cache. Each group is split into as many parts as keep the threads busy when there
  // are fewer KV heads than threads.
  const int parts = std::min(group_size(), std::max(1, (threads + Hkv_ - 1) / Hkv_));
  parallel_for(Hkv_ * parts, threads, [&](int task) {
    const int g = task / parts, part = task % parts, gs = group_size();
    const int first = g * gs + part * gs / parts, last = g * gs + (part + 1) * gs / parts;
    const KeyRows k =
        all_rows ? KeyRows{&keys[static_cast<std::size_t>(g) * P_ * d_], d_}
                 : KeyRows{tensors_.k.data() + static_cast<std::size_t>(g) * d_, Hkv_ * d_};
    if (first < last) compute_prefill(first, last, kPrefillBlockRows, k);
  });
}

void LayerAttention::compute_prefill(int first_head, int last_head, int block_rows, KeyRows k) {
  // A compact trace stores the sums: only the window's rows are computed, and always in the
  // blocks of block_rows counted from position 0 that a pass over every row uses (the same
  // products, so the same bytes, whatever else the run computes: a BLAS may round a row
  // differently in a product of another row count).
  const bool stored = tensors_.stored != nullptr;
  const bool every_row = (want_colsums_ || want_rounded_colsums_) && !stored;
  const int first_row = every_row ? 0 : (P_ - window_) / block_rows * block_rows;
  std::vector<float> logits(static_cast<std::size_t>(block_rows) * P_);
  for (int i0 = first_row; i0 < P_; i0 += block_rows) {
    const int rows = std::min(block_rows, P_ - i0);
    const int keys = i0 + rows;  // causal: this block sees keys [0, keys)
    for (int h = first_head; h < last_head; ++h) {
      float* colsum =
          want_colsums_ && !stored ? &colsums_[static_cast<std::size_t>(h) * P_] : nullptr;
      float* rounded = want_rounded_colsums_ && !stored
                           ? &rounded_colsums_[static_cast<std::size_t>(h) * P_]
                           : nullptr;
      if (prefix_ > i0 && prefix_ < keys) take_prefix_sums(h, i0, k, logits.data());
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, d_, 1.0f,
                  tensors_.query(i0, h), H_ * d_, k.rows, k.stride, 0.0f, logits.data(), keys);
      for (int r = 0; r < rows; ++r) {
        const int i = i0 + r;
        if (!every_row && i < P_ - window_) continue;  // a window block's rows before the window
        float* row = &logits[static_cast<std::size_t>(r) * keys];
        softmax_prefill_row(row, i + 1, colsum, rounded);
        if (epsilon_ > 0) count_sparse(h, row, i);
        if (i >= P_ - window_)
          std::copy(
              row, row + i + 1,
              &window_rows_[(static_cast<std::size_t>(h) * window_ + i - (P_ - window_)) * P_]);
      }
      if (prefix_ == keys) take_prefix_sums(h, keys, k, logits.data());
    }
  }
}

void LayerAttention::softmax_prefill_row(float* row, int n, float* colsum, float* rounded) const {
  if (colsum)
    kernels::active().softmax_accumulate(row, n, scale_, colsum);
  else
    softmax_inplace(row, n, scale_);
  if (!rounded) return;
  // float16 rounding converts whole rows (F16C where the CPU has it): the same round-to-nearest-
  // even as the scalar conversion, element by element, so the same sums.
  if (sample_.dtype == DType::kFloat16)
    add_through_half(rounded, row, n);
  else
    kernels::active().accumulate(rounded, row, n);  // float32: rounding changes nothing
}

void LayerAttention::take_prefix_sums(int h, int i0, KeyRows k, float* logits) {
  const std::size_t at = static_cast<std::size_t>(h) * P_;
  const std::size_t prefix_at = static_cast<std::size_t>(h) * prefix_;
  float* colsum = nullptr;
  float* rounded = nullptr;
  if (!prefix_colsums_.empty()) {
    colsum = &prefix_colsums_[prefix_at];
    std::copy_n(&colsums_[at], prefix_, colsum);
  }
  if (!prefix_rounded_.empty()) {
    rounded = &prefix_rounded_[prefix_at];
    std::copy_n(&rounded_colsums_[at], prefix_, rounded);
  }
  if (i0 >= prefix_) return;
  // The prefix's last block, rows [i0, prefix) against its keys [0, prefix): the product a
  // prompt of `prefix` positions computes, so the same logits to the bit.
  const int rows = prefix_ - i0;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, prefix_, d_, 1.0f,
              tensors_.query(i0, h), H_ * d_, k.rows, k.stride, 0.0f, logits, prefix_);
  for (int r = 0; r < rows; ++r) {
    float* row = logits + static_cast<std::size_t>(r) * prefix_;
    softmax_prefill_row(row, i0 + r + 1, colsum, rounded);
  }
}

void LayerAttention::rank_keys(int g) {
  const int group = group_size();
  std::vector<double> mean(T_);
  for (int t = 0; t < G_; ++t) {
    const int n = P_ + t + 1;
    std::fill(mean.begin(), mean.end(), 0.0);
    for (int r = 0; r < group; ++r) {
      const float* p = decode_probs(t, g * group + r);
      for (int j = 0; j < n; ++j) mean[j] += p[j] / group;
    }
    std::int32_t* order = &ranking_[(static_cast<std::size_t>(t) * Hkv_ + g) * T_];
    std::iota(order, order + n, 0);
    std::sort(order, order + n,
              [&](int a, int b) { return mean[a] != mean[b] ? mean[a] > mean[b] : a > b; });
    double acc = 0;
    int m90 = n;
    for (int i = 0; i < n; ++i)
      if ((acc += mean[order[i]]) >= 0.9 - 1e-12) {
        m90 = i + 1;
        break;
      }
    std::int32_t* counts = &rank_counts_[(static_cast<std::size_t>(t) * Hkv_ + g) * 2];
    counts[0] = static_cast<std::int32_t>(std::ceil(0.1 * n - 1e-9));
    counts[1] = m90;
  }
}

void LayerAttention::count_sparse(int h, const float* row, int i) {
  const auto& mod = sample_.modality;
  long* counts = &sparse_counts_[static_cast<std::size_t>(h) * 2];
  for (int j = 0; j <= i; ++j)
    if (row[j] <= epsilon_) ++counts[mod[j] != 0];
}

long LayerAttention::sparse_entries(int h, int key_vision) const {
  if (sparse_counts_.empty()) throw std::logic_error("sparsity counts were not requested");
  return sparse_counts_[static_cast<std::size_t>(h) * 2 + (key_vision ? 1 : 0)];
}

void LayerAttention::compute_value_norms(int threads) {
  value_norms_.resize(static_cast<std::size_t>(Hkv_) * T_);
  // Token by token, in blocks: v is [T, Hkv, d], so a token's KV heads are contiguous.
  constexpr int kTokens = 64;
  const auto& kernels = kernels::active();
  parallel_for((T_ + kTokens - 1) / kTokens, threads, [&](int block) {
    for (int j = block * kTokens; j < std::min(T_, (block + 1) * kTokens); ++j)
      for (int g = 0; g < Hkv_; ++g)
        value_norms_[static_cast<std::size_t>(g) * T_ + j] =
            std::sqrt(kernels.sum_of_squares(&tensors_.v(j, g, 0), d_));
  });
}

void LayerAttention::compute_output_norms() {
  full_output_norm2_.assign(full_output_.size() / std::max(d_, 1), 0.0);
  for (std::size_t row = 0; row < full_output_norm2_.size(); ++row) {
    const float* o = &full_output_[row * d_];
    double s = 0;
    for (int i = 0; i < d_; ++i) s += static_cast<double>(o[i]) * o[i];
    full_output_norm2_[row] = s;
  }
}

// Decode statistics of query heads first..last-1 (one KV head's): their G decode queries stacked
// head-major into one product with the keys, written straight into decode_probs_ ([H, G, T], so
// the rows (h, t) are contiguous at stride T), then each row's softmax and mass; with values,
// the outputs by a second stacked product. The stacked products compute each element as the
// per-head ones did (the same dot products, K blocked alike), so the bytes do not change.
void LayerAttention::compute_decode(int first, int last, bool sums_and_outputs) {
  const int g = first / group_size(), heads = last - first, rows = heads * G_;
  std::vector<float> q(static_cast<std::size_t>(rows) * d_);
  for (int i = 0; i < heads; ++i)
    for (int t = 0; t < G_; ++t)
      std::copy_n(tensors_.query(P_ + t, first + i), d_,
                  &q[(static_cast<std::size_t>(i) * G_ + t) * d_]);
  const float* k = tensors_.k.data() + static_cast<std::size_t>(g) * d_;
  float* probs = &decode_probs_[static_cast<std::size_t>(first) * G_ * T_];
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, T_, d_, 1.0f, q.data(), d_, k,
              Hkv_ * d_, 0.0f, probs, T_);
  std::vector<double> sums(G_);
  for (int h = first; h < last; ++h) {
    for (int t = 0; t < G_; ++t) {
      float* row = &decode_probs_[(static_cast<std::size_t>(h) * G_ + t) * T_];
      const int n = P_ + t + 1;
      decode_lse_[static_cast<std::size_t>(t) * H_ + h] = softmax_inplace(row, n, scale_);
      std::fill(row + n, row + T_, 0.0f);
    }
    if (!sums_and_outputs) continue;
    ascending_row_sums<false>(decode_probs(0, h), T_, G_, P_ + 1, nullptr, sums.data());
    for (int t = 0; t < G_; ++t) decode_mass_[static_cast<std::size_t>(t) * H_ + h] = sums[t];
  }
  if (full_output_.empty() || !sums_and_outputs) return;
  const float* v = tensors_.v.data() + static_cast<std::size_t>(g) * d_;
  std::vector<float> out(static_cast<std::size_t>(rows) * d_);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, d_, T_, 1.0f, probs, T_, v,
              Hkv_ * d_, 0.0f, out.data(), d_);
  const float* norms = &value_norms_[static_cast<std::size_t>(g) * T_];
  for (int h = first; h < last; ++h) {
    for (int t = 0; t < G_; ++t) {
      const std::size_t r = static_cast<std::size_t>(h - first) * G_ + t;
      std::copy_n(&out[r * d_], d_, &full_output_[(static_cast<std::size_t>(t) * H_ + h) * d_]);
    }
    ascending_row_sums<true>(decode_probs(0, h), T_, G_, P_ + 1, norms, sums.data());
    for (int t = 0; t < G_; ++t)
      full_value_norm_[static_cast<std::size_t>(t) * H_ + h] = static_cast<float>(sums[t]);
  }
}

const float* LayerAttention::prefill_column_sums(int h) const {
  if (!want_colsums_) throw std::logic_error("prefill column sums were not requested");
  return &colsums_[static_cast<std::size_t>(h) * P_];
}

const float* LayerAttention::prefix_column_sums(int h) const {
  if (prefix_colsums_.empty()) throw std::logic_error("prefix column sums were not requested");
  return &prefix_colsums_[static_cast<std::size_t>(h) * prefix_];
}

const float* LayerAttention::prefix_column_sums_rounded(int h) const {
  if (prefix_rounded_.empty())
    throw std::logic_error("rounded prefix column sums were not requested");
  return &prefix_rounded_[static_cast<std::size_t>(h) * prefix_];
}

const float* LayerAttention::prefix_text_query_column_sums() const {
  if (prefix_text_colsum_.empty())
    throw std::logic_error("prefix text-query statistics were not requested");
  return prefix_text_colsum_.data();
}

const float* LayerAttention::prefix_text_query_column_max() const {
  if (prefix_text_colmax_.empty())
    throw std::logic_error("prefix text-query statistics were not requested");
  return prefix_text_colmax_.data();
}

const float* LayerAttention::prefill_column_sums_rounded(int h) const {
  if (!want_rounded_colsums_)
    throw std::logic_error("rounded prefill column sums were not requested");
  return &rounded_colsums_[static_cast<std::size_t>(h) * P_];
}

const float* LayerAttention::prefill_window_row(int h, int r) const {
  if (r < 0 || r >= window_) throw std::logic_error("prefill window row out of range");
  if (window_deferred_) ensure_window_rows();
  return &window_rows_[(static_cast<std::size_t>(h) * window_ + r) * P_];
}

std::vector<double> LayerAttention::window_group_sums(int g, int width) const {
  if (const std::vector<double>* stored = stored_group_sums(width))
    return {stored->begin() + static_cast<std::ptrdiff_t>(g) * P_,
            stored->begin() + static_cast<std::ptrdiff_t>(g + 1) * P_};
  width = std::min(width, P_);
  if (width > window_)
    throw std::logic_error("window group sums of " + std::to_string(width) +
                           " rows where the layer keeps " + std::to_string(window_));
  const int group = group_size();
  std::vector<double> sum(P_, 0.0);
  for (int r = 0; r < group; ++r)
    for (int w = window_ - width; w < window_; ++w) {
      const float* row = prefill_window_row(g * group + r, w);
      for (int j = 0; j < P_; ++j) sum[j] += row[j];
    }
  return sum;
}

std::vector<double> LayerAttention::last_row_head_mean() const {
  if (const StoredPromptStats::Prompt* p = stored_prompt();
      p && p->last_row_head_mean.size() == static_cast<std::size_t>(P_))
    return p->last_row_head_mean;
  if (window_ < 1) throw std::logic_error("the last prompt row was not requested");
  std::vector<double> mean(P_, 0.0);
  for (int h = 0; h < H_; ++h) {
    const float* row = prefill_window_row(h, window_ - 1);
    for (int j = 0; j < P_; ++j) mean[j] += row[j] / H_;  // float / int: each term in float
  }
  return mean;
}

}  // namespace kvsim
