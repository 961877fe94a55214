// `kvsim live capture` and `kvsim live evaluate`: the two jobs of the live path.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "sim/live/answers.hpp"
#include "sim/live/live_engine.hpp"
#include "sim/live/vocabulary.hpp"
#include "traces/kvtrace_writer.hpp"

namespace kvsim::live {

// Generates with a full cache and writes q, k, v (after RoPE) of every layer to a kvtrace v1
// file: greedy for gen_len steps, or teacher-forced with each prompt's reference_ids.
struct CaptureOptions {
  int gen_len = 32;
  bool force_reference = false;
  DType dtype = DType::kFloat32;
  std::string model_name;
  // Also store samples/<name>/logits, float32 [G + 1, vocab]: row 0 from the prefill (the
  // distribution of position P), row t + 1 after decode step t.
  bool logits = false;
  // Greedy generation stops once it has fed one of these tokens (the model's end of sequence):
  // the sample then has as many generated positions as tokens up to and including it.
  std::vector<std::int32_t> stop_tokens;
  // > 0: write a compact trace (sim/run/compact_trace.hpp) keeping the prompt queries of windows
  // up to this many rows: each sample's statistics are computed from its layers as captured (in
  // the stored dtype), and its other prompt queries never reach the disk.
  int compact_window = 0;
  bool compact_entropies = true;
  std::vector<int> compact_window_widths;  // CompactOptions::window_widths
  std::function<void()> on_sample;         // called after each sample (progress)
  // Identity of the model and prompts (the CLI: the checkpoint's and prompt file's fingerprints,
  // the backend). Finished samples are kept in `<out>.parts/` under it and these options, so a
  // rerun after an interruption captures only the rest (sim/live/pieces.hpp).
  std::string fingerprint;
};
void capture(LiveEngine& engine, const PromptReader& prompts,
             const std::vector<std::string>& samples, const std::string& out_path,
             const CaptureOptions& options);
// The two halves of `capture`, for runs split over processes (`mpirun`): each process captures
// the samples[i] with here[i] into `<out>.parts/` (skipping finished ones), then one assembles
// the file from every sample's piece and removes the directory.
void capture_samples(LiveEngine& engine, const PromptReader& prompts,
                     const std::vector<std::string>& samples, const std::vector<bool>& here,
                     const std::string& out_path, const CaptureOptions& options);
void assemble_capture(LiveEngine& engine, const std::vector<std::string>& samples,
                      const std::string& out_path, const CaptureOptions& options);

// End-to-end accuracy of every policy against the full-cache run of the same model.
struct EvalOptions {
  int gen_len = 32;
  // The full cache's greedy answer ends at the first of these tokens (included): the sample is
  // evaluated over the steps that produced it (at least one), every policy on the same steps.
  std::vector<std::int32_t> stop_tokens;
  bool check_invariants = true;
  bool timing = true;  // latency columns (the only fields that differ between identical runs)
  // Decodes the greedy answers for answer-level accuracy against each prompt's `reference`
  // attribute; without it the answer columns stay empty.
  const Vocabulary* vocabulary = nullptr;
  // Every policy compresses the prompt less its last N tokens (or its question), fed after
  // compression before the answer (LiveEngine::prepare); 0: none.
  int prompt_tail = 0;
};

struct EvalStep {  // one decode step of one policy on one sample
  int step = 0, position = 0;
  double kl = 0;       // KL(full || policy) of the next-token distribution, teacher-forced
  int top1_agree = 0;  // same argmax, teacher-forced
  std::int32_t full_token = 0, policy_token = 0;  // greedy runs: the token predicted at this step
  std::int64_t kv_entries = 0, kv_bytes = 0;      // greedy run
  double ms = 0;                                  // greedy run
};

struct EvalSummary {  // one policy on one sample
  std::string label, sample;
  std::string budget;  // the policy's budget parameter as resolved ("20%", "64"); empty: none
  int prompt_len = 0, gen_len = 0;
  double mean_kl = 0, max_kl = 0, top1_agreement = 0;
  int first_divergence = 0;   // first index where the greedy answers differ; answer length if none
  double answer_overlap = 0;  // LCS(policy answer, full answer) / answer length
  double token_match = 0;     // token_match_rate of the two greedy answers (sim/live/answers.hpp)
  // Answer-level accuracy (needs a vocabulary; the scores also a reference answer): the greedy
  // answers up to their first stop token, decoded, scored as lmms-eval scores VQA answers.
  bool has_answers = false, has_reference = false;
  std::string answer, full_answer, reference;
  AnswerScore score, full_score;
  int ref_tokens = 0;
  double ref_loglik = NAN, ref_loglik_full = NAN;
  std::int64_t prompt_kv_bytes = 0, peak_kv_bytes = 0, full_peak_kv_bytes = 0;
  // Prompt tokens fed after compression (the question under `question = append`, a prompt
  // tail); prompt_kv_bytes is then the part compressed.
  int prompt_fed = 0;
  double ms_per_token = NAN, full_ms_per_token = NAN;
  std::vector<EvalStep> steps;
  // What the policy noted on this sample (its greedy run; Policy::notes), each once.
  std::vector<std::string> notes;
};

// Runs every policy on one prompt: full greedy (+ reference) baseline, then per policy a
// teacher-forced run, a greedy run and a reference run.
std::vector<EvalSummary> evaluate_prompt(LiveEngine& engine, const PromptSample& prompt,
                                         const std::vector<PolicyConfig>& policies,
                                         const EvalOptions& options);

// Result files: per-step and per-(policy, sample) CSVs (docs/live.md, "Live results").
std::string eval_steps_csv_header();
void append_eval_steps_csv(std::string& out, const EvalSummary& s, bool timing);
std::string eval_summary_csv_header();
void append_eval_summary_csv(std::string& out, const EvalSummary& s, bool timing);

// `live evaluate --summary` and its console table, from the per-(policy, sample) rows
// (eval_summary_csv_header): every row gains delta_nll (ref_nll − ref_nll_full) and
// peak_held_over_budget (the peak entries held per layer and KV head over the budget); then one
// overall row per policy and per seed group (sample = all): the mean of every number over the
// samples that have it, their count, 95% bootstrap intervals of the accuracies, the KL and the
// ΔNLL, and a seed group's SD of the accuracy over seeds. The table prints the overall rows,
// budgeted policies first and those that size themselves apart, with ! where the peak held differs
// from the budget by more than 1%.
struct EvalReport {
  std::string summary_csv, table;
  // The per-sample rows' notes: per policy label, each distinct note with the number of samples
  // that gave it ("TEXT (K of N sample(s))", as replay reports them), in policy order.
  std::vector<std::pair<std::string, std::string>> notes;
};
EvalReport report_evaluation(const std::string& per_sample_csv,
                             const std::vector<PolicyConfig>& policies);

// Helpers with hand-checkable answers (tests).
double kl_divergence(const std::vector<float>& p_logits, const std::vector<float>& q_logits);
double log_softmax_at(const std::vector<float>& logits, std::int32_t index);
int longest_common_subsequence(const std::vector<std::int32_t>& a,
                               const std::vector<std::int32_t>& b);

}  // namespace kvsim::live
