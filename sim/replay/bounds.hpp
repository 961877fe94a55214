// HAE's error bounds (paper 000, Sec. 2.3 and App. A.2), checked on data rather than assumed.
//
// Theorem 2.1: if the number c of entries evicted at the end of the prefill satisfies
// c <= k_bound = log(ε / Attn_max) / log(1 - λ), the total loss of the evicted entries stays
// below ε. kvsim measures, per (layer, KV head):
//   λ: the decay rate of a key's attention over decode steps, S(t) = S_1 (1 - λ)^t (App. A.2).
//      Estimator: for every prompt key, the least-squares slope b of log a_t over t = 0..G-1,
//      a_t its full-cache attention at step t averaged over the KV head's query heads;
//      λ_j = 1 - exp(b); λ = the median over prompt keys. NaN with fewer than 2 decode steps.
//   Attn_max = min over the c evicted keys of their largest head-averaged attention from a text
//      query of the prompt (the theorem's min_j max_i A_{j,i}).
//   loss: the largest full-cache attention mass (group mean) on the c keys at any decode step.
// The premise is c <= k_bound; the claim is loss < ε; a failure is a premise that holds with a
// claim that does not.
// Corollary 2.1 (FlushEvent): at each step where a policy removes d
// entries, the sum of its scores of the removed entries vs the sum of the d lowest scores it held
// (a policy reports +inf for the entries it could not remove: HAE's tokens outside S_1, so the
// bound is Eq. 6's Low_d(S_1)); the corollary claims the first is at most the second.
#pragma once

#include "sim/replay/engine.hpp"

namespace kvsim {

// A decode step at which a policy removed d >= 1 entries of a KV head: the sum of the policy's
// own scores of the removed entries, and the sum of the d lowest scores among the entries held
// before the removal (what a greedy evictor would have lost; entries the policy could not remove
// score +inf). HAE Corollary 2.1 claims realized <= greedy.
struct FlushEvent {
  int step = 0, kv_head = 0, removed = 0;
  double realized = 0, greedy = 0;
};

// HAE Theorem 2.1 on one KV head (every quantity as documented above).
struct TheoremCheck {
  int kv_head = 0;
  int evicted = 0;        // c: entries evicted at the end of the prefill
  double lambda = NAN;    // estimated decay rate of the keys' attention over decode steps
  double attn_max = NAN;  // min over the c evicted keys of their largest text-query attention
  double k_bound = NAN;   // log(ε / Attn_max) / log(1 - λ)
  double loss = NAN;      // largest full-cache attention mass on the c keys at any decode step
};

// What the bounds check records in one policy's layer result.
struct BoundsRecord {
  std::vector<TheoremCheck> theorem;  // [kv head]
  std::vector<FlushEvent> flushes;    // in step order, KV heads in order within a step
};
// The bounds check's record of `result`; nullptr where the check did not run.
const BoundsRecord* bounds_record(const LayerResult& result);

// Theorem 2.1 quantities for every KV head of one policy's layer result; `ref` is the layer's
// full-cache attention (with text-query statistics).
std::vector<TheoremCheck> check_theorem_2_1(const LayerAttention& ref, const LayerResult& result,
                                            double epsilon);

// Median of per-key decay rates of KV head g (see above).
double attention_decay_rate(const LayerAttention& ref, int kv_head);

// The check replay --bounds runs (ReplayOptions::checks): the text-query statistics of every
// layer, the decode steps' removals recorded (Corollary 2.1), and Theorem 2.1 at `epsilon`.
LayerCheck bounds_check(double epsilon);

// --bounds: HAE Theorem 2.1 (one row per policy, sample, layer, KV head) and Corollary 2.1 (one
// row per decode step at which a policy with scores removed entries). Columns:
// check,policy,sample,layer,kv_head,step,evicted,lambda,attn_max,k_bound,epsilon,loss,bound,
// premise,holds.
class BoundsCsvWriter {
 public:
  BoundsCsvWriter(const std::string& path, const std::vector<PolicyConfig>& policies,
                  double epsilon);
  void write(const LayerResult& r);
  void close();
  static const char* header();
  long theorem_rows = 0, theorem_failures = 0, flushes = 0, corollary_failures = 0;

 private:
  std::string path_;
  std::vector<std::string> labels_;
  double epsilon_;
  std::string out_;
};

}  // namespace kvsim
