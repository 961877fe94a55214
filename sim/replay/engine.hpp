// Teacher-forced replay: one sample, every policy of a run, layer by layer.
//
// Per layer the loop is: load q/k/v, compute the shared attention statistics once, then for each
// policy: fill the cache with the prompt, on_prefill (evict), and for each decode step append the
// token, attend over the retained entries, record metrics, on_decode (evict), check invariants;
// after the last step, the batched output errors. With two threads or more, reading and the shared
// attention of layer l + 1 overlap the policies of layer l (Replayer::replay_sample).
#pragma once

#include <any>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "policies/policy.hpp"
#include "sim/replay/output_error.hpp"
#include "traces/kvtrace.hpp"

namespace kvsim {

struct StepMetricInfo;  // sim/replay/step_metric.hpp

struct StepMetrics {
  int position = 0;       // the decode step's query position, P + step
  int cache_size = 0;     // entries stored (K and V), including the current token
  int attended_size = 0;  // entries that took part in attention
  float mass_recall = 0;  // Σ full-cache probability of attended positions, mean over the group
  float output_rel_error = NAN;  // ‖o - ô‖ / ‖o‖ over the group's query heads; NaN without v
  // ‖o - ô‖ / Σ_j p_j ‖v_j‖ (full-cache probabilities) over the group's query heads: the error
  // relative to the mean norm of the attended values, which stays finite when o is small.
  float output_value_error = NAN;
  std::int64_t kv_bytes = 0;  // cache_size * 2 * head_dim * bytes per element of the trace
  // Every other per-step column is a registered metric's (LayerResult::observed).
};

// Everything one policy did in one layer of one sample.
struct LayerResult {
  int policy_index = 0;
  std::string sample;
  int layer = 0;
  int prefill_kept_min = 0;  // entries kept after the prefill, min over KV heads
  int budget_entries = -1;   // what the policy's budget resolved to for this sample; -1: none
  std::vector<std::vector<StepMetrics>> steps;  // [kv head][step]
  // The registered metrics' columns (sim/replay/step_metric.hpp), NaN where a metric did not
  // run: [kv head][step * observed_columns + column].
  int observed_columns = 0;
  std::vector<std::vector<float>> observed;
  std::vector<std::vector<EvictionRecord>> evicted;  // [kv head]
  std::vector<std::vector<MergeRecord>> merged;      // [kv head]
  // What each check (LayerCheck) recorded, under the check's own key (e.g. bounds_record).
  std::map<std::string, std::any> checked;
  std::vector<std::string> notes;  // what the policy noted during this layer's hooks
};

// A check run on every policy's result of every layer, beside the metrics: the statistics it
// reads, what it watches at each decode hook, and what it records in the result
// (LayerResult::checked). replay --bounds plugs in HAE's Theorem 2.1 and Corollary 2.1
// (bounds_check, sim/replay/bounds.hpp); the engine knows no check.
struct LayerCheck {
  std::string name;  // the check and its settings (a replay checkpoint's manifest records it)
  std::function<AttentionNeeds(const TraceInfo&)> needs;
  // Optional: after each measured decode hook (`step` numbered as the result numbers it), with
  // the positions each KV head held before the hook.
  std::function<void(const Policy& policy, int layer, int step,
                     const std::vector<std::vector<std::int32_t>>& held_before,
                     const KvCache& cache, LayerResult& result)>
      after_decode;
  // After the layer's last step, against the layer's full-cache attention.
  std::function<void(const LayerAttention& measured, LayerResult& result)> check;
};

struct ReplayOptions {
  int threads = 1;
  bool check_invariants = true;
  // The optional per-step metrics to run, by name (sim/replay/step_metric.hpp), beside those
  // that always run: e.g. "diagnostics" (hit rates, misses and evicted mass per step).
  std::vector<std::string> metrics;
  std::vector<LayerCheck> checks;
  // With threads >= 2, layer l + 1 is read and its attention computed while the policies replay
  // layer l, when one layer's float32 q/k/v take at most this many bytes (two layers are then
  // held at once).
  double prefetch_limit_bytes = 256.0 * (1 << 20);
  // Every policy compresses the prompt less its last N tokens (or its question: kQuestionTail,
  // traces/kvtrace.hpp), which are then fed as ordinary decode steps (hooked and measured, steps
  // numbered from the first of them), so no answer token is computed from the full prompt.
  // 0: the prompt is compressed whole (or a policy's own `question = append` split).
  int prompt_tail = 0;
};

// `info` with `kv_heads` KV heads, and a layer's tensors with K and V repeated `group` times per
// KV head (transformers' repeat_kv: KV head g serves query heads g*group .. g*group + group - 1):
// the layer as a policy with one cache per query head sees it (`caches = query_head`). (The
// sample as a context-only compression sees it: context_only, traces/kvtrace.hpp.)
TraceInfo info_with_kv_heads(TraceInfo info, int kv_heads);
LayerTensors repeat_kv_heads(const LayerTensors& tensors, int group);

// Bytes of one layer's q, k and v of a sample in float32 (what replay holds per layer in flight):
// a compact trace's query rows from compact_first_row on only.
double layer_tensor_bytes(const TraceInfo& info, const SampleInfo& sample);
// Whether the HDF5 library serialises its own calls, so that several threads may read traces.
bool hdf5_serialises_calls();
// How many independent samples to replay at once on `threads`: one per thread (at most `samples`)
// when the largest one's layer fits `limit_bytes` (the pipeline's limit) and HDF5 serialises its
// calls, otherwise one at a time, so that long prompts need no more memory with more threads.
int samples_side_by_side(int threads, int samples, double largest_layer_bytes, double limit_bytes);

// Replays samples of one trace through a list of policies, sharing the attention work.
class Replayer {
 public:
  Replayer(const TraceReader& reader, std::vector<PolicyConfig> policies, ReplayOptions options);
  const std::vector<PolicyConfig>& policies() const { return policies_; }
  // Computes these statistics too, whether or not a policy asks for them (benchmarks).
  void require(const AttentionNeeds& needs) { needs_.merge(needs); }

  // Creates every policy for every sample before any work is done. Throws one error that lists
  // every policy that cannot run and on which samples; otherwise returns, per policy label, what
  // the policies adjusted (Policy::notes), each distinct note once with the number of samples.
  std::map<std::string, std::vector<std::string>> validate(
      const std::vector<std::string>& samples) const;

  // Calls on_result for every (layer, policy) in that order, and on_layer after each layer.
  // `first_layers[p]` (empty: all 0) resumes policy p at that layer: its instance first sees the
  // prefill of every lower layer (no decode steps, no results), which under the Policy contract
  // (no decode-time state carried across layers) leaves it as a run from layer 0 would have.
  void replay_sample(const std::string& sample,
                     const std::function<void(const LayerResult&)>& on_result,
                     const std::function<void(int layer)>& on_layer = {},
                     const std::vector<int>& first_layers = {});
  // replay_sample for every sample, results delivered in sample order, exactly as one after the
  // other. With several threads and small layers, samples run side by side, each on a share of
  // the threads and its own reader; a finished sample waits for those before it (at most twice
  // as many samples as run at once are held), and on_result is called by one thread at a time.
  // An error stops the replay after the results that precede it, as a serial run would.
  void replay_samples(const std::vector<std::string>& samples,
                      const std::function<void(const LayerResult&)>& on_result,
                      const std::function<void(int layer)>& on_layer = {});

 private:
  // A sample's run: what each policy fixes before its first layer (its instance, where it splits
  // the prompt, the entries its budget resolves to: -1 for none), and the sample's statistics.
  struct SampleRun {
    SampleInfo sample;
    SampleStats stats;
    std::vector<std::unique_ptr<Policy>> instances;
    std::vector<PromptSplit> splits;
    std::vector<int> budget_entries;
  };
  // Creates every policy for the sample and resolves what the run fixes once per sample.
  SampleRun start_sample(const std::string& name) const;
  // Every policy through one layer (in parallel); results in policy order. Policies with
  // `prefill_only[i]` see the layer's prefill alone and give no result; when all do, `att` may
  // hold the prompt statistics alone (LayerAttention::PromptOnly).
  std::vector<LayerResult> replay_policies(const LayerAttention& att,
                                           const std::map<int, LayerTensors>& sources,
                                           SampleRun& run,
                                           const std::vector<bool>& prefill_only) const;
  // Policies with one cache per query head replay a layer with K and V repeated per query head
  // (repeat_kv): the same attention, group-size x the KV heads. Policies that compress the prompt
  // less its question or tail replay it split there, the fed positions becoming the first decode
  // steps: the same decode attention, the prompt statistics of what was compressed. A policy's
  // shape: (one cache per query head, positions fed after compression); (false, 0) is the layer.
  using Shape = std::pair<bool, int>;
  Shape shape_of(int policy, const LayerAttention& att, const SampleRun& run) const;
  // The layer's attention in every other shape the policies need, each computed once.
  std::map<Shape, std::unique_ptr<LayerAttention>> reshaped_attention(const LayerAttention& att,
                                                                      const SampleRun& run,
                                                                      bool prompt_only) const;
  // Policy `policy` through the layer, attending with `attended`, measured against `measured`,
  // and checked; a logic error names the policy and the sample.
  LayerResult replay_policy(int policy, const LayerAttention& attended,
                            const LayerAttention& measured, SampleRun& run, bool prefill_only,
                            int finish_threads) const;
  // A layer's statistics of `tensors` as this run needs them: the prompt's alone when
  // `prompt_only` (prompt_statistics_suffice).
  std::unique_ptr<LayerAttention> derive(const TraceInfo& info, const SampleInfo& sample,
                                         LayerTensors tensors, bool prompt_only) const;
  // Layers that inherit another layer's q/k (attention_source) attend with it but are measured
  // against their own values: one LayerAttention per source layer the policies name.
  std::map<int, std::unique_ptr<LayerAttention>> heir_attention(
      const LayerAttention& att, const std::map<int, LayerTensors>& sources,
      const SampleInfo& sample, bool prompt_only) const;
  // Which policies only catch up on layer `layer`'s prefill (below their first layer).
  std::vector<bool> prefill_only_at(int layer, const std::vector<int>& first_layers) const;
  // Whether the prompt's statistics serve a layer where `prefill_only` says who catches up: no
  // policy replays its decode steps, none reads future attention at its prefill.
  bool prompt_statistics_suffice(const std::vector<bool>& prefill_only) const;

  const TraceReader& reader_;
  std::vector<PolicyConfig> policies_;
  ReplayOptions options_;
  AttentionNeeds needs_;
  // last_heir_[l]: the deepest layer that attends with layer l's q/k, or -1.
  std::vector<int> last_heir_;
  std::vector<const StepMetricInfo*> metrics_;  // the per-step metrics this run computes
};

// Runs one policy through one layer given precomputed statistics (shared by the engine and the
// plain reference). step_attention computes a decode step's attention and metrics.
// `att` is the attention the policy sees and attends with; `ref` is the layer's own full-cache
// attention that metrics compare against. They differ only for layers that inherit another
// layer's attention (ST3's QK heredity).
using StepAttentionFn =
    std::function<void(const LayerAttention& att, const LayerAttention& ref, const KvCache&,
                       int step, StepAttention&, std::vector<StepMetrics>&)>;
// A step function and, optionally, what completes the metrics after the layer's last step
// (metrics that no policy reads may be computed in batches: sim/replay/output_error.hpp).
struct StepAttentionModel {
  StepAttentionFn step;
  std::function<void(std::vector<std::vector<StepMetrics>>& steps)> finish;
};
struct LayerReplayOptions {
  bool check_invariants = true;
  // The checks whose after_decode hooks watch each decode step (nullptr: none).
  const std::vector<LayerCheck>* checks = nullptr;
  // The first `appended_steps` decode steps of `att` are the question of a context-only
  // compression (`question = append`): appended without a hook and without metrics. Results then
  // hold the later steps only, numbered from 0 (decisions too), as the whole sample numbers them.
  // (A prompt tail's steps are ordinary decode steps of `att`: hooked, measured and kept.)
  int appended_steps = 0;
  // Only the prefill hook (a resumed policy catching up on a lower layer): the result holds the
  // layer and its notes, no steps.
  bool prefill_only = false;
  // The per-step metrics observing each measured step (sim/replay/step_metric.hpp).
  std::vector<const StepMetricInfo*> metrics;
};
LayerResult replay_layer(Policy& policy, const LayerAttention& att, const LayerAttention& ref,
                         bool lookahead, const SampleStats* stats, std::size_t bytes_per_element,
                         const LayerReplayOptions& options,
                         const StepAttentionModel& step_attention);

// Throws std::invalid_argument naming the label, the statistic and what the trace holds when
// `reader` is a compact trace that lacks what `needs` asks (a full trace holds everything).
void check_compact_holds(const TraceReader& reader, const AttentionNeeds& needs,
                         const std::string& label);

// The engine's decode-step attention for one policy in one layer whose policy attends with `att`
// and is measured against `ref`: gathers the shared full-cache probabilities of the attended
// entries and renormalises them (merged entries attend with their merged key); output errors are
// completed by `finish` (sim/replay/output_error.hpp).
// `threads`: for the output errors after the layer's last step (independent per KV head).
StepAttentionModel shared_step_attention(const LayerAttention& att, const LayerAttention& ref,
                                         int threads = 1);

}  // namespace kvsim
