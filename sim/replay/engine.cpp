#include "sim/replay/engine.hpp"

#include <hdf5.h>

#include <algorithm>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "core/kernels/kernels.hpp"
#include "core/parallel.hpp"
#include "sim/replay/step_metric.hpp"
#include "sim/run/note_tally.hpp"

namespace kvsim {

Replayer::Replayer(const TraceReader& reader, std::vector<PolicyConfig> policies,
                   ReplayOptions options)
    : reader_(reader),
      policies_(std::move(policies)),
      options_(options),
      metrics_(metrics_to_run(options_.metrics)) {
  // A compact trace stores the statistics of the whole prompt and of its context alone, not of
  // any other prefix (and MEDA's entropies of the whole prompt only).
  if (options_.prompt_tail != 0 && reader.info().compact())
    throw std::invalid_argument(reader.path() +
                                " is a compact trace, which stores the prompt's "
                                "statistics for the whole prompt only: a prompt tail (" +
                                prompt_tail_text(options_.prompt_tail) +
                                ") needs the full trace it was compacted from");
  for (const auto& p : policies_) {
    needs_.merge(p.needs());
    check_compact_holds(reader, p.needs(), p.label);
  }
  for (const StepMetricInfo* m : metrics_) needs_.merge(m->needs);
  for (const LayerCheck& c : options_.checks)
    if (c.needs) needs_.merge(c.needs(reader.info()));
  const int L = reader.info().num_layers;
  last_heir_.assign(L, -1);
  for (const auto& p : policies_)
    for (int l = 0; l < L; ++l) {
      const int src = p.attention_source(l);
      if (src < 0 || src > l)
        throw std::invalid_argument(p.label + ": layer " + std::to_string(l) +
                                    " cannot inherit the attention of layer " +
                                    std::to_string(src));
      if (src != l) last_heir_[src] = std::max(last_heir_[src], l);
    }
}

void check_compact_holds(const TraceReader& reader, const AttentionNeeds& needs,
                         const std::string& label) {
  const std::string missing = missing_from_compact(needs, reader.info());
  if (!missing.empty())
    throw std::invalid_argument(label + ": " + reader.path() +
                                " is a compact trace, and the policy needs " + missing);
}

namespace {

// Drops the question's steps from a context-only replay and numbers the rest from 0.
void renumber_after_question(LayerResult& r, int question) {
  for (auto& steps : r.steps) steps.erase(steps.begin(), steps.begin() + question);
  for (auto& values : r.observed)
    values.erase(values.begin(), values.begin() + std::size_t(question) * r.observed_columns);
  auto shift = [question](auto& records) {
    for (auto& e : records)
      if (e.step >= 0) e.step -= question;
  };
  for (auto& e : r.evicted) shift(e);
  for (auto& m : r.merged) shift(m);
}

// The per-step metrics of one policy's layer: each one's observer and where its columns sit.
class LayerObservers {
 public:
  LayerObservers(const std::vector<const StepMetricInfo*>& metrics, LayerResult& r, int kv_heads,
                 int steps)
      : r_(r) {
    r.observed_columns = static_cast<int>(observed_columns().size());
    r.observed.assign(kv_heads, std::vector<float>(std::size_t(steps) * r.observed_columns, NAN));
    for (const StepMetricInfo* m : metrics)
      if (m->observer) observers_.push_back({m->observer(), columns_of(*m)});
  }
  // After the step's attention: `first` is the first measured step.
  void observe(const LayerAttention& ref, const KvCache& cache, int step, int first) {
    for (auto& [observer, at] : observers_)
      for (int g = 0; g < cache.kv_heads(); ++g)
        observer->observe(ref, cache, step, g, step > first ? &at.at(r_, g, step - 1, 0) : nullptr,
                          &at.at(r_, g, step, 0));
  }

 private:
  LayerResult& r_;
  std::vector<std::pair<std::unique_ptr<StepObserver>, ObservedColumns>> observers_;
};

// Whether any check watches the decode hooks (LayerCheck::after_decode).
bool watched_by_checks(const LayerReplayOptions& options) {
  return options.checks && std::any_of(options.checks->begin(), options.checks->end(),
                                       [](const LayerCheck& c) { return bool(c.after_decode); });
}

// The policy's decode hook at decode step `step` (the view's horizon set to its position), checked
// against its capacity and, when `watched`, watched by the checks that ask (their step numbered
// from `first`).
void decode_hook(Policy& policy, LayerView& view, StepAttention& sa, KvCache& cache, int layer,
                 int step, int first, bool watched, const LayerReplayOptions& options,
                 LayerResult& r) {
  std::vector<std::vector<std::int32_t>> before;
  if (watched)
    for (int g = 0; g < cache.kv_heads(); ++g) before.push_back(cache.positions(g));
  view.set_horizon(view.prompt_len() + step + 1);
  policy.on_decode(view, sa, cache);
  if (options.check_invariants) check_capacity(policy, cache, layer, "a decode step", "policy");
  if (watched)
    for (const LayerCheck& c : *options.checks)
      if (c.after_decode) c.after_decode(policy, layer, step - first, before, cache, r);
}

// What the layer's cache logged: every eviction and merge, per KV head.
void record_decisions(const KvCache& cache, LayerResult& r) {
  r.evicted.resize(cache.kv_heads());
  r.merged.resize(cache.kv_heads());
  for (int g = 0; g < cache.kv_heads(); ++g) {
    r.evicted[g] = cache.evictions(g);
    r.merged[g] = cache.merges(g);
  }
}

}  // namespace

LayerResult replay_layer(Policy& policy, const LayerAttention& att, const LayerAttention& ref,
                         bool lookahead, const SampleStats* stats, std::size_t bytes_per_element,
                         const LayerReplayOptions& options,
                         const StepAttentionModel& step_attention) {
  const bool check_invariants = options.check_invariants;
  const int P = att.prompt_len(), G = att.gen_len(), Hkv = att.num_kv_heads();
  const std::size_t noted = policy.notes().size();  // notes from before this layer are not its
  LayerView view(att, lookahead, stats);
  KvCache cache(Hkv, att.head_dim());
  cache.fill_prompt(P);
  cache.set_step(-1);
  policy.on_prefill(view, cache);  // view.visible_len() = P
  if (check_invariants) {
    for (int g = 0; g < Hkv; ++g) cache.check_invariants(g);
    check_capacity(policy, cache, att.layer(), "the prefill", "policy");
  }

  LayerResult r;
  r.layer = att.layer();
  if (options.prefill_only) {
    r.notes.assign(policy.notes().begin() + noted, policy.notes().end());
    return r;
  }
  r.steps.assign(Hkv, std::vector<StepMetrics>(G));
  LayerObservers observers(options.metrics, r, Hkv, G);
  r.prefill_kept_min = P;
  for (int g = 0; g < Hkv; ++g) r.prefill_kept_min = std::min(r.prefill_kept_min, cache.size(g));
  StepAttention sa;
  std::vector<StepMetrics> m(Hkv);
  const std::int64_t entry_bytes =
      2ll * att.head_dim() * static_cast<std::int64_t>(bytes_per_element);
  const int first = options.appended_steps;
  const bool watched = watched_by_checks(options);
  for (int t = 0; t < G; ++t) {
    cache.set_step(t);
    for (int g = 0; g < Hkv; ++g) cache.append(g, P + t);
    if (t < first) continue;  // the question: appended, nothing decided, nothing measured
    step_attention.step(att, ref, cache, t, sa, m);
    for (int g = 0; g < Hkv; ++g) {
      m[g].kv_bytes = m[g].cache_size * entry_bytes;
      m[g].position = P + t;
      r.steps[g][t] = m[g];
    }
    observers.observe(ref, cache, t, first);
    decode_hook(policy, view, sa, cache, att.layer(), t, first, watched, options, r);
  }
  if (check_invariants)
    for (int g = 0; g < Hkv; ++g) cache.check_invariants(g);
  if (step_attention.finish) step_attention.finish(r.steps);
  record_decisions(cache, r);
  if (first > 0) renumber_after_question(r, first);
  r.notes.assign(policy.notes().begin() + noted, policy.notes().end());
  return r;
}

namespace {

// The engine's decode-step attention for one policy in one layer: per KV head, the mass recall,
// the attended set's renormalisation, and the output errors (deferred to one GEMM per block of
// steps where they would sum the attended values one by one). The renormalised probabilities
// reach the policy lazily, through StepAttention::head.
class SharedStepAttention {
 public:
  SharedStepAttention(const LayerAttention& att, const LayerAttention& ref, int threads)
      : att_(att), ref_(ref), deferred_(att, ref, threads) {}
  void step(const KvCache& cache, int step, StepAttention& out, std::vector<StepMetrics>& metrics);
  void finish(std::vector<std::vector<StepMetrics>>& steps) const { deferred_.finish(steps); }

 private:
  // Merged entries attend with their merged key: their probabilities are computed here, eagerly.
  void merged_probs(int g, std::vector<float>& probs, double& mass_sum);
  void plain_sums(int g, bool everything, double& mass_sum);
  double full_output_error(int g) const;
  double merged_output_error(int g, const std::vector<float>& probs);
  void defer_output_error(int g, bool complement, double ref2, double vnorm2);
  void fill(int g, std::vector<float>& probs) const;

  const LayerAttention& att_;
  const LayerAttention& ref_;
  const KvCache* cache_ = nullptr;
  int step_ = 0;
  std::vector<double> inverse_weight_;  // [Hkv * group]: 1 / Σ attended probabilities
  std::vector<std::int32_t> listed_;    // positions handed to deferred_
  std::vector<double> rescale_;
  std::vector<float> o_hat_;
  std::vector<const float*> group_rows_;  // plain_sums' scratch
  std::vector<double> group_sums_;
  DeferredOutputError deferred_;
};

void SharedStepAttention::step(const KvCache& cache, int step, StepAttention& out,
                               std::vector<StepMetrics>& metrics) {
  const int Hkv = att_.num_kv_heads(), group = att_.group_size(), s = att_.prompt_len() + step;
  const bool with_v = att_.has_output();
  cache_ = &cache;
  step_ = step;
  inverse_weight_.resize(static_cast<std::size_t>(Hkv) * group);
  out.step = step;
  out.position = s;
  out.group = group;
  out.probs.resize(Hkv);
  out.filled.assign(Hkv, 0);
  out.fill = [this](int g, std::vector<float>& probs) { fill(g, probs); };
  for (int g = 0; g < Hkv; ++g) {
    const bool merged = cache.has_merged(g);
    const int n_att = cache.attended_size(g);
    // Positions are unique and at most s: attending s + 1 of them is attending all of them.
    const bool everything = !merged && n_att == s + 1;
    double mass_sum = 0;
    if (merged) {
      merged_probs(g, out.probs[g], mass_sum);
      out.filled[g] = 1;
    } else {
      plain_sums(g, everything, mass_sum);
    }
    StepMetrics& m = metrics[g];
    m.cache_size = cache.size(g);
    m.attended_size = n_att;
    m.mass_recall = static_cast<float>(mass_sum / group);
    m.output_rel_error = m.output_value_error = NAN;
    if (with_v) {
      // Output via the complement (o_full minus what is missing) when that is the smaller sum.
      const bool complement = !merged && (s + 1 - n_att) < n_att;
      double ref2 = 0, vnorm2 = 0;
      for (int r = 0; r < group; ++r) {
        const double vn = ref_.full_value_norm(step, g * group + r);
        ref2 += ref_.full_output_norm2(step, g * group + r);
        vnorm2 += vn * vn;
      }
      if (merged || everything) {
        const double err2 = merged ? merged_output_error(g, out.probs[g]) : full_output_error(g);
        m.output_rel_error = static_cast<float>(std::sqrt(err2 / ref2));
        m.output_value_error = static_cast<float>(std::sqrt(err2 / vnorm2));
      } else {
        defer_output_error(g, complement, ref2, vnorm2);
      }
    }
  }
}

// out[r] = Σ_e rows[r][positions[e]] in double, each sum in ascending e as a plain loop adds it:
// the rows' chains are interleaved, kRows at a time, so that the additions overlap instead of
// each waiting on the last (the same bytes).
void gathered_sums(const float* const* rows, int count, const std::int32_t* positions, int n,
                   double* out) {
  constexpr int kRows = 8;
  for (int r0 = 0; r0 < count; r0 += kRows) {
    const int m = std::min(kRows, count - r0);
    double acc[kRows] = {};
    for (int e = 0; e < n; ++e) {
      const std::int32_t pos = positions[e];
      for (int k = 0; k < kRows; ++k)
        if (k < m) acc[k] += rows[r0 + k][pos];
    }
    std::copy_n(acc, m, out + r0);
  }
}

void SharedStepAttention::plain_sums(int g, bool everything, double& mass_sum) {
  const int n = cache_->size(g), group = att_.group_size();
  const bool all_attended = cache_->attended_size(g) == n;
  const std::int32_t* positions = cache_->positions(g).data();
  // The usual case: the layer attends with its own attention and every entry is attended, so the
  // recall is the renormalisation's weight, and the group's sums take one pass over the entries.
  if (!everything && all_attended &&
      att_.decode_probs(step_, g * group) == ref_.decode_probs(step_, g * group)) {
    group_rows_.resize(group);
    group_sums_.resize(group);
    for (int r = 0; r < group; ++r) group_rows_[r] = att_.decode_probs(step_, g * group + r);
    gathered_sums(group_rows_.data(), group, positions, n, group_sums_.data());
    for (int r = 0; r < group; ++r) {
      const int h = g * group + r;
      // Positions ascend in the cache, as in decode_mass: a subset's sum cannot exceed it.
      mass_sum += group_sums_[r] / ref_.decode_mass(step_, h);
      inverse_weight_[static_cast<std::size_t>(h)] = 1.0 / group_sums_[r];
    }
    return;
  }
  for (int r = 0; r < group; ++r) {
    const int h = g * group + r;
    double weight = 0;
    if (everything) {
      // The sums below, taken over every position in order, are exactly the full rows' masses.
      mass_sum += 1.0;
      weight = att_.decode_mass(step_, h);
    } else {
      const float* pf = att_.decode_probs(step_, h);
      const float* pf_ref = ref_.decode_probs(step_, h);
      double recall = 0;
      if (pf == pf_ref) {  // the layer attends with its own attention: one sum serves both
        for (int e = 0; e < n; ++e)
          if (cache_->attended(g, e)) recall += pf[positions[e]];
        weight = recall;
      } else {
        for (int e = 0; e < n; ++e) {
          if (!cache_->attended(g, e)) continue;
          recall += pf_ref[positions[e]];
          weight += pf[positions[e]];
        }
      }
      // Positions ascend in the cache, as in decode_mass: a subset's sum cannot exceed it.
      mass_sum += recall / ref_.decode_mass(step_, h);
    }
    inverse_weight_[static_cast<std::size_t>(h)] = 1.0 / weight;
  }
}

void SharedStepAttention::fill(int g, std::vector<float>& probs) const {
  const int n = cache_->size(g), group = att_.group_size();
  const bool all_attended = cache_->attended_size(g) == n;
  const std::int32_t* positions = cache_->positions(g).data();
  probs.assign(static_cast<std::size_t>(group) * n, 0.0f);
  for (int r = 0; r < group; ++r) {
    const int h = g * group + r;
    const float* pf = att_.decode_probs(step_, h);
    const double inv = inverse_weight_[static_cast<std::size_t>(h)];
    float* p = &probs[static_cast<std::size_t>(r) * n];
    if (all_attended)
      for (int e = 0; e < n; ++e) p[e] = static_cast<float>(pf[positions[e]] * inv);
    else
      for (int e = 0; e < n; ++e)
        if (cache_->attended(g, e)) p[e] = static_cast<float>(pf[positions[e]] * inv);
  }
}

void SharedStepAttention::merged_probs(int g, std::vector<float>& probs, double& mass_sum) {
  const KvCache& cache = *cache_;
  const int n = cache.size(g), group = att_.group_size(), d = att_.head_dim();
  const int s = att_.prompt_len() + step_;
  probs.assign(static_cast<std::size_t>(group) * n, 0.0f);
  for (int r = 0; r < group; ++r) {
    const int h = g * group + r;
    const float* pf = att_.decode_probs(step_, h);
    const float* pf_ref = ref_.decode_probs(step_, h);
    float* p = &probs[static_cast<std::size_t>(r) * n];
    double recall = 0, weight = 0;
    for (int e = 0; e < n; ++e) {
      if (!cache.attended(g, e)) continue;
      const int pos = cache.position(g, e);
      recall += pf_ref[pos];
      if (const float* mk = cache.merged_key(g, e)) {
        const float* q = att_.tensors().query(s, h);
        double dot = 0;
        for (int i = 0; i < d; ++i) dot += static_cast<double>(q[i]) * mk[i];
        p[e] = static_cast<float>(std::exp(att_.scale() * dot - att_.decode_lse(step_, h)));
      } else {
        p[e] = pf[pos];
      }
      weight += p[e];
    }
    const double inv = 1.0 / weight;
    for (int e = 0; e < n; ++e) p[e] = static_cast<float>(p[e] * inv);
    inverse_weight_[static_cast<std::size_t>(h)] = inv;
    mass_sum += recall / ref_.decode_mass(step_, h);
  }
}

// Σ_r ‖o_r - ô_r‖² of KV head g when every position is attended: ô is the attended layer's own
// full output (they differ only for layers that inherit another's attention).
double SharedStepAttention::full_output_error(int g) const {
  const int group = att_.group_size(), d = att_.head_dim();
  double err2 = 0;
  for (int r = 0; r < group; ++r) {
    const float* o = ref_.full_output(step_, g * group + r);
    const float* o_att = att_.full_output(step_, g * group + r);
    for (int i = 0; i < d; ++i) err2 += (o[i] - o_att[i]) * (o[i] - o_att[i]);
  }
  return err2;
}

// Σ_r ‖o_r - ô_r‖² of KV head g with merged entries: ô summed over the entries with their
// renormalised probabilities and merged values.
double SharedStepAttention::merged_output_error(int g, const std::vector<float>& probs) {
  const KvCache& cache = *cache_;
  const int n = cache.size(g), group = att_.group_size(), d = att_.head_dim();
  const kernels::Table& kernels = kernels::active();
  o_hat_.resize(d);
  double err2 = 0;
  for (int r = 0; r < group; ++r) {
    const float* o = ref_.full_output(step_, g * group + r);
    const float* p = &probs[static_cast<std::size_t>(r) * n];
    std::fill(o_hat_.begin(), o_hat_.end(), 0.0f);
    for (int e = 0; e < n; ++e) {
      if (p[e] == 0.0f) continue;
      const float* mv = cache.merged_value(g, e);
      kernels.axpy(p[e], mv ? mv : &att_.tensors().v(cache.position(g, e), g, 0), o_hat_.data(), d);
    }
    for (int i = 0; i < d; ++i) err2 += (o[i] - o_hat_[i]) * (o[i] - o_hat_[i]);
  }
  return err2;
}

// Hands KV head g's output error to the batched GEMM: the attended positions with the
// renormalisation, or, when fewer positions are missing than attended, the missing ones with the
// factor 1 / (1 - missing mass) that rescales o_full minus their share.
void SharedStepAttention::defer_output_error(int g, bool complement, double ref2, double vnorm2) {
  const KvCache& cache = *cache_;
  const int group = att_.group_size(), s = att_.prompt_len() + step_;
  listed_.clear();
  if (!complement) {
    const bool all_attended = cache.attended_size(g) == cache.size(g);
    if (!all_attended)
      for (int e = 0; e < cache.size(g); ++e)
        if (cache.attended(g, e)) listed_.push_back(cache.position(g, e));
    const std::int32_t* attended = all_attended ? cache.positions(g).data() : listed_.data();
    deferred_.add(step_, g, false, attended, cache.attended_size(g),
                  &inverse_weight_[static_cast<std::size_t>(g) * group], ref2, vnorm2);
    return;
  }
  // Positions ascend in the cache: the missing ones are the gaps between attended entries.
  const std::int32_t* positions = cache.positions(g).data();
  const int n = cache.size(g);
  listed_.resize(s + 1);
  int missing_count = 0, next = 0;
  for (int e = 0; e < n; ++e) {
    if (!cache.attended(g, e)) continue;
    for (const int pos = positions[e]; next < pos; ++next) listed_[missing_count++] = next;
    next = positions[e] + 1;
  }
  for (; next <= s; ++next) listed_[missing_count++] = next;
  listed_.resize(missing_count);
  rescale_.resize(group);
  for (int r = 0; r < group; ++r) {
    const float* pf = att_.decode_probs(step_, g * group + r);
    double missing = 0;
    for (int j : listed_) missing += pf[j];
    rescale_[r] = 1.0 / (1.0 - missing);
  }
  deferred_.add(step_, g, true, listed_.data(), static_cast<int>(listed_.size()), rescale_.data(),
                ref2, vnorm2);
}

}  // namespace

StepAttentionModel shared_step_attention(const LayerAttention& att, const LayerAttention& ref,
                                         int threads) {
  auto model = std::make_shared<SharedStepAttention>(att, ref, threads);
  return {[model](const LayerAttention&, const LayerAttention&, const KvCache& cache, int step,
                  StepAttention& out,
                  std::vector<StepMetrics>& metrics) { model->step(cache, step, out, metrics); },
          [model](std::vector<std::vector<StepMetrics>>& steps) { model->finish(steps); }};
}

namespace {

// Whether layers may flow through the pipeline (layer l + 1 read while layer l is replayed): HDF5
// must serialise its calls itself (Debian's library does), and two layers' tensors must fit the
// memory the options allow.
bool may_pipeline(const TraceInfo& info, const SampleInfo& sample, const ReplayOptions& options) {
  if (options.threads < 2 || info.num_layers < 2 || !hdf5_serialises_calls()) return false;
  return layer_tensor_bytes(info, sample) <= options.prefetch_limit_bytes;
}

}  // namespace

double layer_tensor_bytes(const TraceInfo& info, const SampleInfo& sample) {
  // A compact trace holds the query rows from compact_first_row on only.
  const double query_rows = sample.total_len() - sample.compact_first_row;
  return 4.0 * info.head_dim *
         (query_rows * info.num_heads + 2.0 * sample.total_len() * info.num_kv_heads);
}

TraceInfo info_with_kv_heads(TraceInfo info, int kv_heads) {
  info.num_kv_heads = kv_heads;
  return info;
}

LayerTensors repeat_kv_heads(const LayerTensors& t, int group) {
  LayerTensors out;
  out.layer = t.layer;
  out.q = t.q;
  out.q_first_row = t.q_first_row;
  out.stored = t.stored;  // per query head: repeating KV heads changes none of them
  auto repeat = [group](const xt::xtensor<float, 3>& x) {
    const std::size_t T = x.shape(0), Hkv = x.shape(1), d = x.shape(2);
    xt::xtensor<float, 3> y = xt::empty<float>({T, Hkv * group, d});
    for (std::size_t i = 0; i < T; ++i)
      for (std::size_t g = 0; g < Hkv; ++g)
        for (int r = 0; r < group; ++r) std::copy_n(&x(i, g, 0), d, &y(i, g * group + r, 0));
    return y;
  };
  out.k = repeat(t.k);
  if (t.has_v()) out.v = repeat(t.v);
  return out;
}

bool hdf5_serialises_calls() {
  hbool_t threadsafe = 0;
  return H5is_library_threadsafe(&threadsafe) >= 0 && threadsafe;
}

namespace {

// The policy as the engine creates it for a sample: on the prompt less what is fed after
// compression, knowing only what exists before decoding.
std::unique_ptr<Policy> create_for_sample(const PolicyConfig& p, const SampleInfo& sample,
                                          int prompt_tail) {
  const PromptSplit split = prompt_split(p, sample, prompt_tail);
  const PolicyConfig sized = sized_for_split(p, sample, split);
  return p.info->create(sized.params, known_before_decoding(context_only(sample, split.fed)));
}

// "'a', 'b', 'c' and 4 more"
std::string some_names(const std::vector<std::string>& names) {
  std::string out;
  const std::size_t shown = std::min<std::size_t>(names.size(), 3);
  for (std::size_t i = 0; i < shown; ++i) out += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > shown) out += " and " + std::to_string(names.size() - shown) + " more";
  return out;
}

template <typename Value>
Value& entry(std::vector<std::pair<std::string, Value>>& list, const std::string& key) {
  for (auto& e : list)
    if (e.first == key) return e.second;
  return list.emplace_back(key, Value{}).second;
}

}  // namespace

std::map<std::string, std::vector<std::string>> Replayer::validate(
    const std::vector<std::string>& samples) const {
  std::vector<std::pair<std::string, std::vector<std::string>>> errors;  // message -> samples
  NoteTally noted;
  for (const std::string& name : samples) {
    const SampleInfo sample = reader_.read_sample(name);
    for (std::size_t i = 0; i < policies_.size(); ++i) {
      const PolicyConfig& p = policies_[i];
      try {
        const std::unique_ptr<Policy> instance = create_for_sample(p, sample, options_.prompt_tail);
        for (const std::string& n : instance->notes()) noted.add(static_cast<int>(i), name, n);
        // A budget the prompt fits in evicts nothing at prefill: say so, or the run reads as a
        // perfect compression.
        const PromptSplit split = prompt_split(p, sample, options_.prompt_tail);
        const int compressed = sample.prompt_len - split.fed;
        if (const int b = budget_entries(sized_for_split(p, sample, split), compressed);
            b >= compressed && !p.info->keeps_everything)
          noted.add(static_cast<int>(i), name,
                    p.label + ": budget " + p.budget_text() +
                        " is not below the prompt's length: the prompt is kept whole (the full "
                        "cache until decoding outgrows the budget)");
      } catch (const std::invalid_argument& e) {
        entry(errors, e.what()).push_back(name);
      }
    }
  }
  if (!errors.empty()) {
    std::string msg = std::to_string(errors.size()) + " configuration(s) cannot run:";
    for (const auto& [what, where] : errors)
      msg += "\n  " + what + " (sample" + (where.size() > 1 ? "s " : " ") + some_names(where) + ")";
    throw std::invalid_argument(msg);
  }
  std::map<std::string, std::vector<std::string>> out;
  for (const auto& [policy, note] : noted.lines(samples.size()))
    out[policies_[policy].label].push_back(note);
  return out;
}

std::vector<bool> Replayer::prefill_only_at(int layer, const std::vector<int>& first_layers) const {
  std::vector<bool> prefill_only(policies_.size(), false);
  if (!first_layers.empty())
    for (std::size_t p = 0; p < policies_.size(); ++p) prefill_only[p] = layer < first_layers[p];
  return prefill_only;
}

bool Replayer::prompt_statistics_suffice(const std::vector<bool>& prefill_only) const {
  // A run without policies computes the shared statistics alone, in full (the benchmarks).
  if (needs_.key_ranking || policies_.empty()) return false;
  for (std::size_t p = 0; p < policies_.size(); ++p)
    if (!prefill_only[p] || policies_[p].info->lookahead) return false;  // lookahead: at prefill
  return true;
}

void Replayer::replay_sample(const std::string& sample_name,
                             const std::function<void(const LayerResult&)>& on_result,
                             const std::function<void(int)>& on_layer,
                             const std::vector<int>& first_layers) {
  if (!first_layers.empty() && first_layers.size() != policies_.size())
    throw std::logic_error("replay_sample: one first layer per policy");
  SampleRun run = start_sample(sample_name);
  const SampleInfo& sample = run.sample;
  const TraceInfo& info = reader_.info();
  // With two threads or more the layers flow through a pipeline: while the policies replay
  // layer l, layer l + 1 is read, and layer l - 1's results are delivered. The next layer's
  // attention is computed only once layer l's is released, so it takes layer l's pooled blocks
  // (core/block_pool.hpp) rather than faulting in blocks of its own: computing it beside the
  // policies held two layers' statistics at once (1.15 GB against 0.77 GB at the peak on a
  // 2-layer 32k compact trace) for no gain in time, its own heads already running in parallel.
  // Each stage keeps the layer order, so the callbacks see exactly what a serial run shows them,
  // and no result depends on which thread computed it.
  const bool pipelined = may_pipeline(info, sample, options_);
  auto read = [&](int l, LayerTensors storage) {
    reader_.read_layer_into(sample, l, storage);
    return storage;
  };
  // A layer where every policy only catches up on the prefill needs the prompt statistics alone.
  auto attend = [&](int l, LayerTensors tensors) {
    if (prompt_statistics_suffice(prefill_only_at(l, first_layers)))
      return std::make_unique<LayerAttention>(LayerAttention::PromptOnly{}, info, sample,
                                              std::move(tensors), needs_, options_.threads);
    return std::make_unique<LayerAttention>(info, sample, std::move(tensors), needs_,
                                            options_.threads);
  };
  std::unique_ptr<LayerAttention> att = attend(0, read(0, {}));
  LayerTensors spare;  // storage recycled from layer to layer
  std::future<void> delivered;
  auto deliver = [&](std::vector<LayerResult> results, int l) {
    for (const auto& r : results) on_result(r);
    if (on_layer) on_layer(l);
  };
  std::map<int, LayerTensors> sources;  // q/k of layers that deeper layers inherit
  for (int l = 0; l < info.num_layers; ++l) {
    std::future<LayerTensors> next;
    if (pipelined && l + 1 < info.num_layers)
      next = std::async(std::launch::async, read, l + 1, std::move(spare));
    std::vector<LayerResult> results =
        replay_policies(*att, sources, run, prefill_only_at(l, first_layers));
    if (delivered.valid()) delivered.get();
    if (pipelined)
      delivered = std::async(std::launch::async, deliver, std::move(results), l);
    else
      deliver(std::move(results), l);
    for (auto it = sources.begin(); it != sources.end();)
      it = last_heir_[it->first] <= l ? sources.erase(it) : std::next(it);
    LayerTensors released = att->release_tensors();
    if (last_heir_[l] > l)
      sources[l] =
          LayerTensors{l, released.q, released.k, {}, released.q_first_row, released.stored};
    if (l + 1 == info.num_layers) break;
    att.reset();  // its blocks back to the pool before the next layer's attention takes them
    LayerTensors tensors;
    if (next.valid()) {
      tensors = next.get();
      spare = std::move(released);
    } else {
      tensors = read(l + 1, std::move(released));
    }
    att = attend(l + 1, std::move(tensors));
  }
  if (delivered.valid()) delivered.get();
}

int samples_side_by_side(int threads, int samples, double largest_layer_bytes, double limit_bytes) {
  const int most = std::min(threads, samples);
  if (most < 2 || largest_layer_bytes > limit_bytes || !hdf5_serialises_calls()) return 1;
  return most;
}

namespace {

// Samples replayed side by side finish out of order; their results are handed on in sample
// order, and a sample runs at most `ahead` places past the last one handed on (what bounds the
// results held). A sample that failed stops everything after the results before it.
class InOrderDelivery {
 public:
  InOrderDelivery(int samples, int ahead, const std::function<void(const LayerResult&)>& on_result)
      : n_(samples),
        ahead_(ahead),
        on_result_(on_result),
        finished_(samples),
        errors_(samples),
        ready_(samples, 0) {}
  // The next sample to replay, once it is within reach; -1 when none is left or delivery stopped.
  int take() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return stop_ || next_ >= n_ || next_ < delivered_ + ahead_; });
    return stop_ || next_ >= n_ ? -1 : next_++;
  }
  void finish(int i, std::vector<LayerResult> results, std::exception_ptr error) {
    const std::lock_guard<std::mutex> lock(mutex_);
    finished_[i] = std::move(results);
    errors_[i] = error;
    ready_[i] = 1;
    deliver_ready();
    changed_.notify_all();
  }
  // After every worker returned: the error that stopped delivery, if any.
  void rethrow() const {
    if (stop_) std::rethrow_exception(errors_[delivered_]);
  }

 private:
  // Under mutex_: hands every finished sample at the head of the order on.
  void deliver_ready() {
    while (!stop_ && delivered_ < n_ && ready_[delivered_]) {
      try {
        for (const auto& r : finished_[delivered_]) on_result_(r);
      } catch (...) {
        if (!errors_[delivered_]) errors_[delivered_] = std::current_exception();
      }
      std::vector<LayerResult>().swap(finished_[delivered_]);
      if (errors_[delivered_])
        stop_ = true;
      else
        ++delivered_;
    }
  }

  const int n_, ahead_;
  const std::function<void(const LayerResult&)>& on_result_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int next_ = 0, delivered_ = 0;
  bool stop_ = false;
  std::vector<std::vector<LayerResult>> finished_;
  std::vector<std::exception_ptr> errors_;
  std::vector<std::uint8_t> ready_;
};

}  // namespace

void Replayer::replay_samples(const std::vector<std::string>& samples,
                              const std::function<void(const LayerResult&)>& on_result,
                              const std::function<void(int layer)>& on_layer) {
  const int n = static_cast<int>(samples.size());
  double largest = 0;
  for (const auto& name : samples)
    largest = std::max(largest, layer_tensor_bytes(reader_.info(), reader_.read_sample(name)));
  const int side_by_side =
      samples_side_by_side(options_.threads, n, largest, options_.prefetch_limit_bytes);
  if (side_by_side == 1) {
    for (const auto& s : samples) replay_sample(s, on_result, on_layer);
    return;
  }
  ReplayOptions share = options_;
  share.threads = std::max(1, options_.threads / side_by_side);
  std::mutex layer_mutex;
  const std::function<void(int)> on_layer_locked = [&](int l) {
    if (!on_layer) return;
    const std::lock_guard<std::mutex> lock(layer_mutex);
    on_layer(l);
  };
  InOrderDelivery delivery(n, 2 * side_by_side, on_result);
  auto worker = [&] {
    for (int i; (i = delivery.take()) >= 0;) {
      std::vector<LayerResult> results;
      std::exception_ptr error;
      try {
        const TraceReader reader(reader_.path());  // readers keep staging buffers: one each
        Replayer one(reader, policies_, share);
        one.needs_ = needs_;
        one.replay_sample(
            samples[i], [&](const LayerResult& r) { results.push_back(r); }, on_layer_locked);
      } catch (...) {
        error = std::current_exception();
      }
      delivery.finish(i, std::move(results), error);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < side_by_side; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  delivery.rethrow();
}

std::unique_ptr<LayerAttention> Replayer::derive(const TraceInfo& info, const SampleInfo& sample,
                                                 LayerTensors tensors, bool prompt_only) const {
  if (prompt_only)
    return std::make_unique<LayerAttention>(LayerAttention::PromptOnly{}, info, sample,
                                            std::move(tensors), needs_, options_.threads);
  return std::make_unique<LayerAttention>(info, sample, std::move(tensors), needs_,
                                          options_.threads);
}

std::map<int, std::unique_ptr<LayerAttention>> Replayer::heir_attention(
    const LayerAttention& att, const std::map<int, LayerTensors>& sources, const SampleInfo& sample,
    bool prompt_only) const {
  const int l = att.layer();
  std::map<int, std::unique_ptr<LayerAttention>> heirs;
  for (const auto& p : policies_) {
    const int src = p.attention_source(l);
    if (src == l || heirs.count(src)) continue;
    LayerTensors mixed;
    mixed.layer = l;
    mixed.q = sources.at(src).q;
    mixed.k = sources.at(src).k;
    mixed.q_first_row = sources.at(src).q_first_row;
    mixed.stored = sources.at(src).stored;
    mixed.v = att.tensors().v;
    heirs[src] = derive(reader_.info(), sample, std::move(mixed), prompt_only);
  }
  return heirs;
}

Replayer::SampleRun Replayer::start_sample(const std::string& name) const {
  SampleRun run;
  run.sample = reader_.read_sample(name);
  const SampleInfo& sample = run.sample;
  // Policies are created per sample: their state may carry from lower to higher layers.
  for (const auto& p : policies_) {
    try {
      run.instances.push_back(create_for_sample(p, sample, options_.prompt_tail));
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("sample '" + name + "': " + e.what());
    }
    const PromptSplit split = prompt_split(p, sample, options_.prompt_tail);
    run.splits.push_back(split);
    run.budget_entries.push_back(
        budget_entries(sized_for_split(p, sample, split), sample.prompt_len - split.fed));
  }
  // Under a prompt tail (every policy's split, `question = append` refused) the sample's
  // statistics are those of the prompt compressed, as a prefill of it alone computes them.
  if (needs_.sample_entropies || !needs_.sample_window_sums.empty())
    run.stats = compute_sample_stats(
        reader_, context_only(sample, prompt_tail_length(sample, options_.prompt_tail)), needs_,
        options_.threads);
  return run;
}

Replayer::Shape Replayer::shape_of(int i, const LayerAttention& att, const SampleRun& run) const {
  return Shape{att.group_size() > 1 && policies_[i].query_head_caches(), run.splits[i].fed};
}

std::map<Replayer::Shape, std::unique_ptr<LayerAttention>> Replayer::reshaped_attention(
    const LayerAttention& att, const SampleRun& run, bool prompt_only) const {
  const TraceInfo& info = reader_.info();
  std::map<Shape, std::unique_ptr<LayerAttention>> shaped;
  for (int i = 0; i < static_cast<int>(policies_.size()); ++i) {
    const Shape s = shape_of(i, att, run);
    if (s == Shape{false, 0} || shaped.count(s)) continue;
    shaped[s] = derive(s.first ? info_with_kv_heads(info, info.num_heads) : info,
                       context_only(run.sample, s.second),
                       s.first ? repeat_kv_heads(att.tensors(), att.group_size()) : att.tensors(),
                       prompt_only);
  }
  return shaped;
}

LayerResult Replayer::replay_policy(int i, const LayerAttention& attended,
                                    const LayerAttention& measured, SampleRun& run,
                                    bool prefill_only, int finish_threads) const {
  LayerResult r;
  try {
    const PromptSplit& split = run.splits[i];
    const LayerReplayOptions layer_options{.check_invariants = options_.check_invariants,
                                           .checks = &options_.checks,
                                           .appended_steps = split.hooked ? 0 : split.fed,
                                           .prefill_only = prefill_only,
                                           .metrics = metrics_};
    r = replay_layer(*run.instances[i], attended, measured, policies_[i].info->lookahead,
                     &run.stats, dtype_bytes(run.sample.dtype), layer_options,
                     prefill_only ? StepAttentionModel{}
                                  : shared_step_attention(attended, measured, finish_threads));
    if (prefill_only) return r;
    for (const LayerCheck& c : options_.checks) c.check(measured, r);
  } catch (const std::logic_error& e) {
    throw std::logic_error(policies_[i].label + ", sample '" + run.sample.name + "': " + e.what());
  }
  r.policy_index = i;
  r.sample = run.sample.name;
  r.budget_entries = run.budget_entries[i];
  return r;
}

std::vector<LayerResult> Replayer::replay_policies(const LayerAttention& att,
                                                   const std::map<int, LayerTensors>& sources,
                                                   SampleRun& run,
                                                   const std::vector<bool>& prefill_only) const {
  const int l = att.layer();
  // Statistics derived from `att` hold what it holds: the prompt's alone when they suffice.
  const bool prompt_only = prompt_statistics_suffice(prefill_only);
  const std::map<int, std::unique_ptr<LayerAttention>> heirs =
      heir_attention(att, sources, run.sample, prompt_only);
  const std::map<Shape, std::unique_ptr<LayerAttention>> shaped =
      reshaped_attention(att, run, prompt_only);
  std::vector<LayerResult> results(policies_.size());
  // Threads the policies leave idle batch their output errors, head by head.
  const int finish_threads =
      std::max(1, options_.threads / std::max<int>(1, static_cast<int>(policies_.size())));
  parallel_for(static_cast<int>(policies_.size()), options_.threads, [&](int i) {
    const int src = policies_[i].attention_source(l);
    const Shape shape = shape_of(i, att, run);
    const bool reshaped = shape != Shape{false, 0};
    const LayerAttention& measured = reshaped ? *shaped.at(shape) : att;
    const LayerAttention& attended = reshaped ? measured : src == l ? att : *heirs.at(src);
    results[i] = replay_policy(i, attended, measured, run, prefill_only[i], finish_threads);
  });
  // Results of the policies that replayed the layer, in policy order.
  std::vector<LayerResult> replayed;
  for (std::size_t i = 0; i < results.size(); ++i)
    if (!prefill_only[i]) replayed.push_back(std::move(results[i]));
  for (const StepMetricInfo* m : metrics_)
    if (m->across_policies) m->across_policies(replayed, policies_, columns_of(*m));
  return replayed;
}

}  // namespace kvsim
