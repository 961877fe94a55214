// Eviction in the loop: runs a Model step by step with any registered policy editing the real KV
// cache through the same hooks as replay (policies/policy.hpp).
//
// Each layer runs its own policy instance, which has first seen the prefill of every lower layer
// (the state replay's single instance has on reaching that layer; policies/policy.hpp).
// Per sample the prompt is prefilled once with a full cache (shared by every run), its attention
// statistics computed once (core/layer_attention.hpp, prompt only). A run then loads the
// prompt's keys and values into the backend's cache, calls on_prefill for every layer, and for each
// decode step and layer: appends the token's key and value, attends over the retained entries,
// calls on_decode, and applies the policy's evictions and merges to the backend's cache (the
// evicted rows are freed; merged rows are overwritten with the merged key and value).
//
// Compression happens at the end of the prefill, as in SnapKV and kvpress: methods that prune
// inside the prefill's forward pass (FastV, A-VL's prefill pruning) are applied there too, so
// their effect on the prompt's own later hidden states is not modelled.
//
// A policy that compresses the context only (`question = append`, kvpress's pipeline) runs in
// kvpress's order: the context (the prompt less its question) is compressed, then the question's
// tokens are fed one by one against the compressed cache, as replay treats them (the sample split
// at its question: the question's positions become the first decode steps), and the answer
// follows. The context's statistics are those of the one prefill's first P - Q rows: the prefill
// is causal, so a context-only prefill computes the same.
//
// A prompt tail (prepare's `prompt_tail`: the last N tokens, or the question) splits every
// policy's prompt the same way, its tokens fed as decode steps against the compressed cache
// before the answer, so that no answer token is computed from the full prompt; the policies
// decide on those steps as on any other (replay's ReplayOptions::prompt_tail, which it matches).
#pragma once

#include <memory>
#include <vector>

#include "policies/policy.hpp"
#include "sim/live/model.hpp"
#include "traces/prompt_file.hpp"

namespace kvsim::live {

// A prompt after its full-cache prefill, ready for any number of runs.
struct PreparedPrompt {
  PromptSample prompt;
  TraceInfo trace;    // the model's attention shapes
  SampleInfo sample;  // P, G and metadata over T = P + G (generated positions: text, segment 2)
  std::vector<std::unique_ptr<LayerAttention>> layers;
  std::vector<float> first_logits;  // the prefill's next-token distribution
  int decode_position_offset = 0;   // M-RoPE: the rotary position of step t is P + t + this
  SampleStats stats;                // when some policy needs sample entropies
  // Prepared with `question_after` and a question, or a prompt tail: the sample split before its
  // last `question` prompt positions (context_only) and the layers' statistics of the context.
  int question = 0;
  int prompt_tail = 0;  // as prepared (ReplayOptions::prompt_tail's values)
  SampleInfo context;
  std::vector<std::unique_ptr<LayerAttention>> context_layers;
};

struct RunOptions {
  const PolicyConfig* policy = nullptr;  // nullptr: the model alone (full cache, no hooks)
  // Teacher forcing: the input tokens of steps 0..steps-1; nullptr: greedy generation.
  const std::vector<std::int32_t>* forced = nullptr;
  int steps = 0;
  bool keep_logits = false;
  bool record = false;  // write each step's q/k/v into the prepared layers (capture)
  bool check_invariants = true;
};

struct StepRecord {
  std::int32_t input = 0;  // the token fed at this step
  int position = 0;
  std::int64_t kv_entries = 0;  // cache rows while the step attends, all layers and KV heads
  double seconds = 0;           // wall time of the step, model and policy
};

struct RunResult {
  // predicted[0] = argmax of first_logits, predicted[t + 1] = argmax after step t; a greedy run
  // feeds predicted[t] at step t.
  std::vector<std::int32_t> predicted;
  // The distribution of the answer's first token: the prefill's, or with the question appended
  // after compression, that after the question's last token.
  std::vector<float> first_logits;
  // The prompt's tokens fed after compression (question = append, or a prompt tail), before step
  // 0; 0 otherwise.
  int question_steps = 0;
  std::vector<std::vector<float>> logits;  // [steps][vocab] with keep_logits
  std::vector<StepRecord> steps;
  std::int64_t prompt_kv_entries = 0;  // rows of the prompt (or context) cache before compression
  std::int64_t peak_kv_entries = 0;    // most rows during decoding, the question's steps included
  std::vector<KvCache> caches;         // per layer, the policy's final cache (empty without one)
  std::int64_t bytes_per_entry = 0;    // key + value of one row as the backend stores them
  // What the policy noted while running (Policy::notes, e.g. a budget that ran dry), each once.
  std::vector<std::string> policy_notes;
};

class LiveEngine {
 public:
  LiveEngine(Model& model, int threads) : model_(model), threads_(threads) {}
  Model& model() { return model_; }

  // Checks that every policy can run live (no lookahead, no inherited attention) and returns the
  // statistics they need.
  static AttentionNeeds live_needs(const std::vector<PolicyConfig>& policies,
                                   const ModelConfig& config);

  // Runs longer than the config's max_position_embeddings are refused unless allowed.
  void allow_beyond_max_positions(bool allow) { beyond_max_positions_ = allow; }
  // `question_after`: also prepare the context's statistics for policies that append the
  // question (PreparedPrompt::context_layers; needs_question_after tells). `prompt_tail`: every
  // policy's run feeds the prompt's last N tokens (or its question) after compression; the
  // context is then the prompt less them (invalid_argument when one of them is not a text token).
  PreparedPrompt prepare(const PromptSample& prompt, int gen_len, const AttentionNeeds& needs,
                         bool question_after = false, int prompt_tail = 0);
  static bool needs_question_after(const std::vector<PolicyConfig>& policies);
  RunResult run(PreparedPrompt& prepared, const RunOptions& options);

 private:
  // The tokens fed after compression (the prompt tail or the question): checked to be text, and
  // the context's layer statistics, from the one prefill's first P - fed rows.
  void prepare_fed(PreparedPrompt& pp, int fed, const AttentionNeeds& needs) const;

  Model& model_;
  int threads_;
  bool beyond_max_positions_ = false;
};

// The index of the largest logit (the lowest index among ties).
std::int32_t argmax(const std::vector<float>& logits);

// That a prompt fits the model: its inputs_embeds as wide as the hidden size, its token ids (but
// at the positions inputs_embeds fills) and reference ids inside the vocabulary. Errors start
// with `where` ("sample 's': ", or the file before it) and name `model` when given ("the model"
// otherwise). LiveEngine::prepare checks it; the command line checks every prompt before any
// work.
void check_prompt_fits_model(const PromptSample& prompt, const ModelConfig& config,
                             const std::string& where, const std::string& model = "");

}  // namespace kvsim::live
