// kvtrace v1 (../shared/kvtrace-v1.md): metadata types and a validating, layer-at-a-time reader.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>
#include <xtensor/xtensor.hpp>

#include "traces/hdf5_util.hpp"

namespace kvsim {

enum class Modality : std::uint8_t { kText = 0, kImage = 1, kVideo = 2 };
enum class Segment : std::uint8_t { kSystem = 0, kUser = 1, kGenerated = 2 };
enum class DType { kFloat16, kFloat32 };

const char* dtype_name(DType t);
std::size_t dtype_bytes(DType t);

// File-level attributes.
// The version of the compact section this kvsim writes (kvtrace-v1.md, "Compact traces").
constexpr int kCompactTraceVersion = 3;

struct TraceInfo {
  std::string model;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  double scale = 0.0;  // resolved: the attribute, or 1/sqrt(d)
  bool scale_given = false;
  // Optional: the base θ of the rotary embedding the stored queries and keys carry (transformers'
  // rotate_half layout, inv_freq_i = θ^(-2i/d), no scaling); 0 when the trace does not say.
  double rope_theta = 0.0;
  // Optional: multimodal rotary positions (M-RoPE, traces/mrope.hpp): the rotary pairs per axis
  // (temporal, height, width), summing to d/2; empty for plain RoPE.
  std::vector<int> mrope_section;
  // A compact trace (kvtrace-v1.md, "Compact traces") keeps, of each sample's prompt queries, only
  // the rows that windows of up to `compact_window` rows need, and stores the statistics the other
  // rows would give; 0 for a full trace.
  int compact_window = 0;
  bool compact_entropies = false;  // whether it stores every layer's prompt entropies
  // The section's version (kvtrace_compact): 1 stored entropies from products shaped otherwise
  // than this kvsim's (equal to about 1e-9, not byte for byte), 2 from scalar exponentials (about
  // 1e-15); 3 as this kvsim computes them.
  int compact_version = 0;
  // The widths W whose window group sums a compact trace's layers store (with the last prompt
  // row's head mean), ascending; empty when they store none (traces written before them).
  std::vector<int> compact_window_widths;
  bool compact() const { return compact_window > 0; }
  int group_size() const { return num_heads / num_kv_heads; }
};

// Per-sample attributes and token metadata (everything but the per-layer tensors).
struct SampleInfo {
  std::string name;
  int prompt_len = 0;  // P
  int gen_len = 0;     // G
  std::string task;
  std::string reference;
  // Optional: the last question_len prompt positions are the question (what kvpress appends
  // uncompressed after compressing the context); -1 when the sample does not say.
  int question_len = -1;
  // Optional: samples naming one context_id are one context asked several questions (each
  // sample's prompt is that context followed by its own question): a context-only compression
  // is then the same for all of them (context_draw_key).
  std::string context_id;
  std::vector<std::uint8_t> modality;   // [T]
  std::vector<std::uint8_t> segment;    // [T]
  std::vector<std::int32_t> media_id;   // [T] or empty
  std::vector<std::int32_t> token_ids;  // [T] or empty
  // [3, T] axis-major, or empty: the M-RoPE position ids (temporal, height, width) of each token,
  // with TraceInfo::mrope_section; empty: position i is i on every axis.
  std::vector<std::int32_t> position_ids;
  bool has_v = false;
  DType dtype = DType::kFloat32;
  // Compact traces: the first query row stored (rows before it are summarised), and the length of
  // the context whose statistics are stored beside the prompt's (P - question_length), 0 if none.
  int compact_first_row = 0;
  int compact_context_len = 0;
  int total_len() const { return prompt_len + gen_len; }
};

// The question a context-only compression appends uncompressed (kvtrace-v1.md, `question_len`):
// the sample's attribute when it has one, else the prompt positions after its last image or video
// token, else 0 (a text-only prompt without the attribute is all context).
int question_length(const SampleInfo& sample);
// The sample as a context-only compression sees it: its last `question` prompt positions become
// the first decode steps (P - question prompt positions, G + question steps).
SampleInfo context_only(SampleInfo sample, int question);
// A prompt tail fed after compression (replay's and live's `--prompt-tail`): the last N prompt
// tokens, or the sample's question (kQuestionTail), are fed as ordinary decode steps against the
// compressed cache, so that no answer token is computed from the full prompt. 0: none.
inline constexpr int kQuestionTail = -1;
// How many prompt positions `tail` feeds after compression on `sample`: N, or its question's
// length. invalid_argument, naming the sample, when that leaves no context (N >= P) or the sample
// has no question to feed.
int prompt_tail_length(const SampleInfo& sample, int tail);
// "question" or the count, as `--prompt-tail` takes it; "" for 0.
std::string prompt_tail_text(int tail);
// Parses `--prompt-tail`: "question", or a whole number >= 0; invalid_argument otherwise.
int parse_prompt_tail(const std::string& text);
// The name a policy's per-sample random draws are keyed on: the context_id when the sample
// declares one (so several questions on one context draw alike), else the sample's name.
const std::string& context_draw_key(const SampleInfo& sample);

// What a compact trace stores of one layer in place of its early prompt queries: the statistics
// LayerAttention computes from them (core/layer_attention.hpp), as it computed them.
struct StoredPromptStats {
  int layer = -1;  // the layer they are of (a layer that inherits another's q/k holds its stats)
  // The statistics of the first `prompt_len` positions taken as the prompt.
  struct Prompt {
    std::vector<float> column_sums;          // [H, P]: Σ_i p_ij per query head
    std::vector<float> column_sums_rounded;  // [H, P]: the same of p_ij rounded to the dtype
    std::vector<float> text_column_sums;     // [P]: over text queries, head-averaged
    std::vector<float> text_column_max;      // [P]
    // Window statistics (TraceInfo::compact_window_widths; empty when not stored), as
    // LayerAttention::window_group_sums and last_row_head_mean compute them:
    std::map<int, std::vector<double>> window_group_sums;  // width -> [Hkv, P]
    std::vector<double> last_row_head_mean;                // [P]
  };
  // Keyed by prompt length: the whole prompt, and the context alone when the sample has a
  // question (what a policy that appends the question sees).
  std::map<int, Prompt> by_prompt_len;
  // The layer's prompt entropies (LayerEntropies, in its declaration order), when stored.
  bool has_entropies = false;
  std::array<double, 6> entropies{};
  // The full cache's results at the sample's own decode steps, which every replay of the layer
  // computes before any policy runs: the attention output and two sums of each step's
  // probabilities. Optional (`stats/decode`, a layer with values and decode steps): empty, the
  // replay computes them.
  struct Decode {
    int prompt_len = 0, kv_heads = 0;  // the shape they are of (P, Hkv)
    std::vector<float> output;         // [G, H, d]: Σ_j p_j v_j of step t, query head h
    std::vector<float> value_norm;     // [G, H]: Σ_j p_j ‖v_j‖
    std::vector<double> mass;          // [G, H]: Σ_j p_j, in double, in position order
    bool empty() const { return output.empty(); }
  };
  Decode decode;
  // The statistics of a prompt of `prompt_len` positions; throws std::logic_error naming
  // `statistic` and the lengths stored when there are none.
  const Prompt& prompt(int prompt_len, const char* statistic) const;
};

// One layer of one sample, converted to float32, layout [T, heads, d] as in the file.
struct LayerTensors {
  int layer = 0;
  xt::xtensor<float, 3> q;  // [T - q_first_row, H, d]: query rows q_first_row..T-1
  xt::xtensor<float, 3> k;  // [T, Hkv, d]
  xt::xtensor<float, 3> v;  // [T, Hkv, d], empty (size 0) when the trace has no values
  int q_first_row = 0;      // > 0 only for a compact trace's layers
  // A compact trace's statistics of the rows before q_first_row (null for a full trace).
  std::shared_ptr<const StoredPromptStats> stored;
  bool has_v() const { return v.size() > 0; }
  // [d]: the query of position pos, head h; throws std::logic_error when the row is not stored.
  const float* query(int pos, int h) const;
};

// Opens a kvtrace v1 file and validates its file-level attributes on construction. Samples and
// layers are read on demand and validated as they are read; every violation throws TraceError
// with the file, sample and dataset in the message.
// media_id is -1 exactly on text tokens (kvtrace-v1.md); kvprompt files follow the same rule.
// Throws TraceError prefixed by `where`.
void check_media_ids(const std::vector<std::uint8_t>& modality,
                     const std::vector<std::int32_t>& media_id, const std::string& where);

class TraceReader {
 public:
  explicit TraceReader(const std::string& path);

  const std::string& path() const { return path_; }
  const TraceInfo& info() const { return info_; }
  const std::vector<std::string>& sample_names() const { return samples_; }

  SampleInfo read_sample(const std::string& name) const;
  // Reads layer l of a sample whose SampleInfo came from read_sample().
  LayerTensors read_layer(const SampleInfo& sample, int layer) const;
  // The same into `out`, reusing its storage when the shapes match (no allocation per layer).
  void read_layer_into(const SampleInfo& sample, int layer, LayerTensors& out) const;

  // Bytes of q/k/v data stored in the file for a sample (on disk, after any compression).
  std::uint64_t stored_bytes(const std::string& sample) const;
  // An optional float32 [rows, cols] dataset of a sample (TraceWriter::write_sample_matrix), or
  // an empty vector when the sample has none.
  std::vector<float> read_sample_matrix(const SampleInfo& sample, const char* name, int& rows,
                                        int& cols) const;
  // Storage of a sample's layers/0/q: "contiguous", or "chunked" plus its filters
  // ("+shuffle+gzip").
  std::string storage_layout(const std::string& sample) const;
  // The name of the query dataset of a layer: "q", or a compact trace's "q_rows".
  const char* query_dataset() const { return info_.compact() ? "q_rows" : "q"; }

 private:
  std::string where(const std::string& sample, const std::string& dataset = "") const;
  void read_file_attrs();
  void read_tensor(const SampleInfo& s, int layer, const char* name, int rows, int heads,
                   xt::xtensor<float, 3>& out) const;
  void read_compact_sample_attrs(hid_t group, SampleInfo& s) const;
  // A file attribute of 1 to `most` integers, or nullopt; TraceError naming the file otherwise.
  std::optional<std::vector<std::int64_t>> file_int_array_attr(const char* name,
                                                               std::size_t most) const;
  void read_mrope_section();
  void read_compact_window_widths();
  void read_position_ids(hid_t group, SampleInfo& s) const;
  // read_sample's steps: the sample's attributes, its per-position datasets (checked), and the
  // layers' q (or q_rows), k and v datasets (present in every layer), with the tensors' dtype.
  void read_sample_attrs(hid_t group, SampleInfo& s) const;
  void read_positions(hid_t group, SampleInfo& s) const;
  void check_sample_layers(hid_t group, SampleInfo& s) const;
  // A compact trace's stats/ group of layer l (traces/kvtrace_compact.cpp).
  std::shared_ptr<const StoredPromptStats> read_stored_stats(const SampleInfo& s, int layer) const;
  // A float dataset of exactly `shape` (float32 or float64 in the file), finite, into `out`.
  template <typename T>
  void read_floats(const std::string& sample, const std::string& rel,
                   const std::vector<hsize_t>& shape, T* out) const;

  std::string path_;
  H5Handle file_;
  TraceInfo info_;
  std::vector<std::string> samples_;
  mutable std::vector<std::uint16_t> raw_;  // float16 staging buffer, reused across reads
};

}  // namespace kvsim
