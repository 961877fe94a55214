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
// Corollary 2.1 (FlushEvent in sim/replay/engine.hpp): at each step where a policy removes d
// entries, the sum of its scores of the removed entries vs the sum of the d lowest scores it held
// (a policy reports +inf for the entries it could not remove: HAE's tokens outside S_1, so the
// bound is Eq. 6's Low_d(S_1)); the corollary claims the first is at most the second.
#pragma once

#include "sim/replay/engine.hpp"

namespace kvsim {

// Theorem 2.1 quantities for every KV head of one policy's layer result; `ref` is the layer's
// full-cache attention (with text-query statistics).
std::vector<TheoremCheck> check_theorem_2_1(const LayerAttention& ref, const LayerResult& result,
                                            double epsilon);

// Median of per-key decay rates of KV head g (see above).
double attention_decay_rate(const LayerAttention& ref, int kv_head);

// The check replay --bounds runs (ReplayOptions::checks): the text-query statistics of every
// layer, the decode steps' removals recorded (Corollary 2.1), and Theorem 2.1 at `epsilon`.
LayerCheck bounds_check(double epsilon);

}  // namespace kvsim
