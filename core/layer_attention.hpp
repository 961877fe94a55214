// Attention statistics of one (sample, layer), computed once and shared by every policy and
// metric replayed in the same run: in teacher-forced replay the logits q·k do not depend on the
// policy, so nothing here is recomputed per policy.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/block_pool.hpp"
#include "traces/kvtrace.hpp"

namespace kvsim {

// What the policies of a run need beyond the always-computed decode attention.
struct AttentionNeeds {
  bool prefill_column_sums = false;  // Σ over all causal prompt rows of p_ij, per query head
  int prefill_window = 0;            // keep the last `prefill_window` prompt rows' probabilities
  // Widths W read through LayerAttention::window_group_sums (a KV group's last W prompt rows
  // summed: SnapKV's votes, MadaKV's proxy); a compact trace may store them, and then the rows
  // themselves are not computed. Sorted, unique.
  std::vector<int> window_group_sums;
  // LayerAttention::last_row_head_mean: the last prompt row's attention averaged over the heads
  // (TOVA's, FastV's, A-VL's and ST3's scores); stored by a compact trace like the sums above.
  bool last_row_head_mean = false;
  // For layers below this: column sum and column max, over the prompt's text queries, of the
  // attention averaged over all query heads: how much text attends each entry (defined as HAE's
  // Dual-Attention Pruning reads it, Eq. 1 and 3; also read by `kvsim stats` and replay --bounds).
  int text_query_layers = 0;
  // Per-layer entropies of every layer before the first is compressed (core/sample_stats.hpp).
  bool sample_entropies = false;
  // Windows W: the column sums of every layer's last W prompt rows, before the first layer is
  // compressed (SampleStats::window_sums; MadaKV's Eq. 9 needs of all layers). Sorted, unique.
  std::vector<int> sample_window_sums;
  // > 0: count causal prompt entries with p_ij <= epsilon, per query head and key modality (the
  // ε-sparsity `kvsim stats` reports, HAE Eq. 7's definition). Implies a pass over every prompt
  // row.
  double sparsity_epsilon = 0;
  // Per decode step and KV head, the keys ranked by the group-mean full-cache attention (replay
  // diagnostics: hit rates and misses).
  bool key_ranking = false;
  // The prefill column sums again with every probability first rounded to the trace's dtype (a
  // float16 model's attention weights; float32 as is), summed in float: LOOK-M's released
  // arithmetic (lookm `arithmetic = released`).
  bool prefill_column_sums_rounded = false;
  // Reads prompt queries themselves (LayerView::query), not only statistics of them: e.g. a
  // Gaussian fitted to every prompt query (expected_attention). A compact trace cannot serve it.
  bool prompt_queries = false;
  void merge(const AttentionNeeds& o);
};

// The fields of AttentionNeeds by name, and one set by name from text ("true", "32", "0.001",
// "16,32" for the window sums): how a policy written outside C++ (Python) declares what it reads,
// every kind of need alike. Throws std::invalid_argument naming the field and what it takes, or
// listing the names.
const std::vector<std::string>& attention_need_names();
void set_attention_need(AttentionNeeds& needs, const std::string& name, const std::string& value);

// What the compact trace described by `trace` lacks of `needs`: the statistic, what the trace
// holds and what to do ("" when it holds everything, as a full trace does).
std::string missing_from_compact(const AttentionNeeds& needs, const TraceInfo& trace);

// Prompt rows are processed in blocks of this many: a compact trace keeps its queries from the
// start of the block that holds a window's first row, so that it computes the window's rows with
// the products a full trace uses.
constexpr int kPrefillBlockRows = 64;

class LayerAttention {
 public:
  // Computes the statistics with `threads` threads (results independent of the count). Prefill
  // rows are processed in blocks, so at most one block of logits per thread is ever held: a
  // 16k-token prompt needs no [P, P] matrix.
  LayerAttention(const TraceInfo& trace, const SampleInfo& sample, LayerTensors tensors,
                 const AttentionNeeds& needs, int threads);
  // The plain reference: the same statistics from scalar loops, row by row, no BLAS, no blocking
  // (core/naive_attention.cpp). Used to check the fast path and as the benchmark's baseline.
  struct Naive {};
  LayerAttention(Naive, const TraceInfo& trace, const SampleInfo& sample, LayerTensors tensors,
                 const AttentionNeeds& needs);

  // The live path: statistics of the prompt only (no decode step exists yet). `tensors` holds
  // T = P + G rows of which the first P are filled; rows of generated tokens are written with
  // set_token_row as they are produced (policies that merge read recorded keys and values).
  // `prefix` (0 < prefix < P): also the column sums (plain and rounded) and text-query statistics
  // that a PromptOnly of the prompt's first `prefix` positions computes, to the byte, from the same
  // pass (causal rows before `prefix` see only keys before it; the one block that straddles it
  // is multiplied again at the shorter prompt's shape): the context before a question.
  struct PromptOnly {
    int prefix = 0;
  };
  LayerAttention(PromptOnly, const TraceInfo& trace, const SampleInfo& sample, LayerTensors tensors,
                 const AttentionNeeds& needs, int threads);
  void set_token_row(int position, const float* q, const float* k, const float* v);

  int layer() const { return tensors_.layer; }
  int num_layers() const { return L_; }
  int prompt_len() const { return P_; }
  int gen_len() const { return G_; }
  int total_len() const { return P_ + G_; }
  int num_heads() const { return H_; }
  int num_kv_heads() const { return Hkv_; }
  int group_size() const { return H_ / Hkv_; }
  int head_dim() const { return d_; }
  float scale() const { return scale_; }
  // The trace's rotary base (TraceInfo::rope_theta), 0 when it does not say.
  double rope_theta() const { return rope_theta_; }
  // The trace's M-RoPE sections (TraceInfo::mrope_section), empty for plain RoPE.
  const std::vector<int>& mrope_section() const { return mrope_section_; }
  const SampleInfo& sample() const { return sample_; }
  const LayerTensors& tensors() const { return tensors_; }
  // Hands the q/k/v storage back for the next layer's read.
  LayerTensors release_tensors() { return std::move(tensors_); }

  // [P]: Σ_{i<P} p_ij for query head h (causal prompt attention received by key j).
  const float* prefill_column_sums(int h) const;
  // The same with each probability rounded to the trace's dtype first
  // (prefill_column_sums_rounded).
  const float* prefill_column_sums_rounded(int h) const;
  int prefill_window() const { return window_; }
  // [P]: probabilities of prompt query P - window + r (r < window) for query head h. A compact
  // trace's layer that stores every window statistic its needs name computes the rows only when
  // one is first read (any thread; the others wait).
  const float* prefill_window_row(int h, int r) const;
  // [P]: Σ over the group's query heads r (outer) and the last `width` prompt rows (inner, in row
  // order) of p_ij, in double from 0: the sum SnapKV's votes and MadaKV's proxy importance add.
  // Stored by a compact trace for the widths it lists, else added from the rows.
  std::vector<double> window_group_sums(int kv_head, int width) const;
  // [P]: Σ over query heads h in order of p_{P-1,j} / H (each term in float), in double from 0.
  std::vector<double> last_row_head_mean() const;
  // Whether the window rows are held (computed, or not deferred); unsynchronised: for tests.
  bool holds_window_rows() const { return window_rows_ != nullptr; }
  bool has_text_query_stats() const { return !text_colsum_.empty(); }
  bool has_key_ranking() const { return !ranking_.empty(); }
  // Positions 0..P+t ranked by the group-mean full-cache attention of step t, KV head g (best
  // first, ties to the newer); top_count = ceil(10%), mass90_count = fewest holding 90%.
  const std::int32_t* key_ranking(int t, int g) const {
    return &ranking_[(static_cast<std::size_t>(t) * Hkv_ + g) * T_];
  }
  int top_count(int t, int g) const {
    return rank_counts_[(static_cast<std::size_t>(t) * Hkv_ + g) * 2];
  }
  int mass90_count(int t, int g) const {
    return rank_counts_[(static_cast<std::size_t>(t) * Hkv_ + g) * 2 + 1];
  }
  // Causal prompt entries p_ij <= epsilon of query head h whose key j is text (0) or vision (1).
  long sparse_entries(int h, int key_vision) const;
  // [P]: Σ over text queries i < P of the head-averaged p_ij, and the max over them.
  const float* text_query_column_sums() const;
  const float* text_query_column_max() const;
  // PromptOnly::prefix's statistics: [prefix] each, as the accessors above give a prompt that long.
  const float* prefix_column_sums(int h) const;
  const float* prefix_column_sums_rounded(int h) const;
  const float* prefix_text_query_column_sums() const;
  const float* prefix_text_query_column_max() const;
  // [T]: full-cache probabilities of decode step t (query P + t) for query head h; zero beyond.
  const float* decode_probs(int t, int h) const {
    return &decode_probs_[(static_cast<std::size_t>(h) * G_ + t) * T_];
  }
  // Σ_j of decode_probs(t, h), summed in double in position order: the denominator of mass
  // recall, so that the full cache recalls exactly 1 and no subset more (float rounding leaves
  // the stored probabilities summing to 1 ± a few ulps).
  double decode_mass(int t, int h) const {
    return decode_mass_[static_cast<std::size_t>(t) * H_ + h];
  }
  // log Σ_j exp(scale q·k_j) of decode step t over the full cache, for attending merged keys.
  float decode_lse(int t, int h) const { return decode_lse_[static_cast<std::size_t>(t) * H_ + h]; }
  // [d]: full-cache attention output of decode step t for query head h (needs v).
  const float* full_output(int t, int h) const {
    return &full_output_[(static_cast<std::size_t>(t) * H_ + h) * d_];
  }
  bool has_output() const { return !full_output_.empty(); }
  // ‖full_output(t, h)‖², summed in double.
  double full_output_norm2(int t, int h) const {
    return full_output_norm2_[static_cast<std::size_t>(t) * H_ + h];
  }
  // Σ_j p_j ‖v_j‖ over the full cache at decode step t for query head h (needs v).
  float full_value_norm(int t, int h) const {
    return full_value_norm_[static_cast<std::size_t>(t) * H_ + h];
  }

 private:
  // Sets the shapes and allocates the outputs; the public constructors then fill them.
  struct Shape {
    bool decode = true;  // allocate the decode statistics
  };
  LayerAttention(Shape, const TraceInfo& trace, const SampleInfo& sample, LayerTensors tensors,
                 const AttentionNeeds& needs);
  void allocate(const AttentionNeeds& needs, bool decode);
  // The prompt's causal rows (their column sums, window rows, sparsity) of every head, on
  // `threads`; of query heads [first_head, last_head), one KV group's, in blocks of block_rows.
  void compute_prefill_heads(int threads);
  struct KeyRows {  // one KV head's key rows: row j at rows + j * stride
    const float* rows;
    int stride;
  };
  void compute_prefill(int first_head, int last_head, int block_rows, KeyRows k);
  // The prompt's rows the layer needs (compute_prefill_heads), or the window's deferred.
  void prefill(const AttentionNeeds& needs, int threads);
  void allocate_window_rows();
  // Whether the stored statistics serve every window statistic `needs` names, so that the window
  // rows wait until one is read (ensure_window_rows).
  bool stored_serves_window(const AttentionNeeds& needs) const;
  // The window rows of a layer that deferred them: computed once, on the calling thread.
  void ensure_window_rows() const;
  // The stored statistics of this prompt length, or null (a full trace).
  const StoredPromptStats::Prompt* stored_prompt() const;
  // The stored window group sums of `width` rows ([Hkv, P]), or null.
  const std::vector<double>* stored_group_sums(int width) const;
  // Softmaxes a causal row of n logits in place and adds it to the column sums given (null: not
  // wanted); the rounded sums add each entry rounded to the trace's dtype.
  void softmax_prefill_row(float* row, int n, float* colsum, float* rounded) const;
  // The prefix's sums of head h, once the prompt's sums hold every row before i0: theirs, plus
  // rows [i0, prefix) at the prefix's own shape; `logits` is a free buffer of a block's logits.
  void take_prefix_sums(int h, int i0, KeyRows k, float* logits);
  // A compact trace's statistics in place of those of the prompt rows it does not hold.
  void take_stored(const AttentionNeeds& needs);
  // The full cache's decode results a compact trace stores for exactly this layer and shape, or
  // null (then computed: compute_decode with sums_and_outputs).
  const StoredPromptStats::Decode* stored_decode() const;
  // Decode probabilities of query heads first_head..last_head-1; their sums and outputs too when
  // `sums_and_outputs` (not stored).
  void compute_decode(int first_head, int last_head, bool sums_and_outputs);
  void compute_value_norms(int threads);
  void compute_output_norms();
  void count_sparse(int h, const float* row, int i);
  void rank_keys(int g);
  void compute_text_query_stats(int threads);
  std::vector<int> text_query_rows() const;

  SampleInfo sample_;
  LayerTensors tensors_;
  int L_, P_, G_, T_, H_, Hkv_, d_, window_;
  float scale_;
  double rope_theta_;
  std::vector<int> mrope_section_;
  bool want_colsums_;
  std::vector<float> colsums_;  // [H, P]
  bool want_rounded_colsums_;
  std::vector<float> rounded_colsums_;  // [H, P]
  PooledBlock window_rows_;             // [H, window, P]: rows written before they are read
  // Window rows left to the first reader (stored_serves_window): computed under the flag.
  bool window_deferred_ = false;
  std::unique_ptr<std::once_flag> window_once_ = std::make_unique<std::once_flag>();  // movable
  PooledBlock decode_probs_;               // [H, G, T]: a KV head's rows contiguous
  std::vector<float> decode_lse_;          // [G, H]
  std::vector<double> decode_mass_;        // [G, H]
  std::vector<float> full_output_;         // [G, H, d]
  std::vector<float> full_value_norm_;     // [G, H]
  std::vector<double> full_output_norm2_;  // [G, H]
  std::vector<float> value_norms_;         // [Hkv, T]: ‖v_j‖, shared by a KV head's query heads
  std::vector<long> sparse_counts_;        // [H, 2]
  std::vector<std::int32_t> ranking_;      // [G, Hkv, T]
  std::vector<std::int32_t> rank_counts_;  // [G, Hkv, 2]
  double epsilon_ = 0;
  std::vector<float> text_colsum_;         // [P]
  std::vector<float> text_colmax_;         // [P]
  int prefix_ = 0;                         // PromptOnly::prefix
  std::vector<float> prefix_colsums_;      // [H, prefix]
  std::vector<float> prefix_rounded_;      // [H, prefix]
  std::vector<float> prefix_text_colsum_;  // [prefix]
  std::vector<float> prefix_text_colmax_;  // [prefix]
};

// Numerically stable in-place softmax of scale·x[0..n) (x holds raw q·k); returns log Σ exp.
float softmax_inplace(float* x, int n, float scale);
// x rounded to a trace dtype's precision (float16: round to nearest even; float32: x).
float round_to_dtype(float x, DType dtype);

}  // namespace kvsim
