#include "sim/live/evaluate.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <stdexcept>
#include <xtensor/xview.hpp>

#include "analysis/comparison.hpp"
#include "analysis/csv_table.hpp"
#include "core/csv_format.hpp"
#include "core/partial_files.hpp"
#include "sim/live/pieces.hpp"
#include "sim/run/compact_trace.hpp"
#include "sim/run/note_tally.hpp"
#include "sim/run/result_files.hpp"
#include "traces/half.hpp"

namespace kvsim::live {

namespace {

std::vector<double> log_softmax(const std::vector<float>& x) {
  double mx = -INFINITY;
  for (float v : x) mx = std::max(mx, static_cast<double>(v));
  double sum = 0;
  for (float v : x) sum += std::exp(v - mx);
  const double lse = mx + std::log(sum);
  std::vector<double> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = x[i] - lse;
  return out;
}

}  // namespace

double kl_divergence(const std::vector<float>& p_logits, const std::vector<float>& q_logits) {
  const std::vector<double> lp = log_softmax(p_logits), lq = log_softmax(q_logits);
  double kl = 0;
  for (std::size_t i = 0; i < lp.size(); ++i) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
  return std::max(kl, 0.0);  // rounding can leave -1e-17 for identical inputs
}

double log_softmax_at(const std::vector<float>& logits, std::int32_t index) {
  return log_softmax(logits)[index];
}

int longest_common_subsequence(const std::vector<std::int32_t>& a,
                               const std::vector<std::int32_t>& b) {
  std::vector<int> prev(b.size() + 1, 0), cur(b.size() + 1, 0);
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j)
      cur[j] = a[i - 1] == b[j - 1] ? prev[j - 1] + 1 : std::max(prev[j], cur[j - 1]);
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

namespace {

TraceInfo capture_trace_info(LiveEngine& engine, const CaptureOptions& o) {
  const ModelConfig& c = engine.model().config();
  TraceInfo info;
  info.model = o.model_name.empty() ? c.model_type : o.model_name;
  info.num_layers = c.num_hidden_layers;
  info.num_heads = c.num_attention_heads;
  info.num_kv_heads = c.num_key_value_heads;
  info.head_dim = c.head_dim;
  info.scale = engine.model().scale();
  info.scale_given = true;
  info.rope_theta = c.rope_theta;
  info.mrope_section = c.mrope_section;
  info.compact_window = o.compact_window;
  info.compact_entropies = o.compact_window > 0 && o.compact_entropies;
  if (o.compact_window > 0) info.compact_window_widths = o.compact_window_widths;
  return info;
}

std::string ids_text(const std::vector<std::int32_t>& ids) {
  std::string out;
  for (auto id : ids) out += (out.empty() ? "" : ",") + std::to_string(id);
  return out;
}

// The decode steps a greedy run keeps when it stops at the first fed token in `stop`: up to and
// including the step that fed it; all `steps` when none was fed.
int steps_until_stop(const RunResult& r, int steps, const std::vector<std::int32_t>& stop) {
  for (int t = 0; t < steps; ++t)
    if (std::find(stop.begin(), stop.end(), r.steps[t].input) != stop.end()) return t + 1;
  return steps;
}

// Drops the generated positions after the first `kept` from a sample's metadata.
void truncate_generation(SampleInfo& s, int kept) {
  const int T = s.prompt_len + kept;
  s.gen_len = kept;
  s.modality.resize(T);
  s.segment.resize(T);
  s.token_ids.resize(T);
  if (!s.media_id.empty()) s.media_id.resize(T);
}

// The first T positions of a layer's tensors.
LayerTensors first_positions(const LayerTensors& t, int T) {
  if (static_cast<int>(t.q.shape(0)) == T) return t;
  LayerTensors out;
  out.layer = t.layer;
  out.q = xt::view(t.q, xt::range(0, T), xt::all(), xt::all());
  out.k = xt::view(t.k, xt::range(0, T), xt::all(), xt::all());
  if (t.has_v()) out.v = xt::view(t.v, xt::range(0, T), xt::all(), xt::all());
  return out;
}

// The M-RoPE ids [3, T] of a captured sample: the prompt's ([P, 3] in the prompt file), then
// each decode step's, P + t + the prepared offset on every axis (as the model fed them).
std::vector<std::int32_t> trace_position_ids(const PreparedPrompt& pp, int T) {
  const int P = pp.sample.prompt_len;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(3) * T);
  for (int a = 0; a < 3; ++a)
    for (int i = 0; i < T; ++i)
      ids[static_cast<std::size_t>(a) * T + i] =
          i < P ? pp.prompt.position_ids[static_cast<std::size_t>(i) * 3 + a]
                : i + pp.decode_position_offset;
  return ids;
}

// Generates one sample with a full cache and writes it, alone, to `path` (atomically).
void capture_sample(LiveEngine& engine, const PromptSample& prompt, const std::string& prompts_path,
                    const TraceInfo& info, const WriteOptions& wo, const CaptureOptions& o,
                    const std::string& path) {
  if (o.force_reference && prompt.reference_ids.empty())
    throw std::invalid_argument(prompts_path + ": sample '" + prompt.info.name +
                                "' has no reference_ids to teacher-force");
  const int G = o.force_reference ? static_cast<int>(prompt.reference_ids.size()) : o.gen_len;
  PreparedPrompt pp = engine.prepare(prompt, G, AttentionNeeds{});
  RunOptions ro;
  ro.steps = G;
  ro.record = true;
  ro.keep_logits = o.logits;
  ro.forced = o.force_reference ? &prompt.reference_ids : nullptr;
  const RunResult r = engine.run(pp, ro);
  SampleInfo s = pp.sample;
  s.dtype = o.dtype;
  for (int t = 0; t < G; ++t) s.token_ids[s.prompt_len + t] = r.steps[t].input;
  const int kept = o.force_reference ? G : steps_until_stop(r, G, o.stop_tokens);
  if (kept < G) truncate_generation(s, kept);
  if (!info.mrope_section.empty()) s.position_ids = trace_position_ids(pp, s.total_len());
  if (info.compact()) s = compact_sample(std::move(s), info.compact_window);
  TraceWriter writer(begin_partial(path), info, wo);
  writer.write_sample(s);
  for (const auto& layer : pp.layers) {
    LayerTensors t = first_positions(layer->tensors(), s.total_len());
    if (info.compact()) {
      // The statistics of what the file stores: the tensors rounded to its dtype first.
      if (o.dtype == DType::kFloat16)
        for (auto* x : {&t.q, &t.k, &t.v}) round_through_half(x->data(), x->data(), x->size());
      t = compact_layer(info, s, std::move(t), info.compact_entropies, 1);
    }
    writer.write_layer(s, t);
  }
  if (o.logits) {
    std::vector<float> all = pp.first_logits;
    for (const auto& row : r.logits) all.insert(all.end(), row.begin(), row.end());
    all.resize(static_cast<std::size_t>(kept + 1) * engine.model().config().vocab_size);
    writer.write_sample_matrix(s, "logits", kept + 1, engine.model().config().vocab_size,
                               all.data());
  }
  writer.close();
  publish(path);
}

// The output trace, sample by sample from the pieces (values round-trip exactly in either dtype).
void assemble_trace(const PieceStore& store, const std::vector<std::string>& samples,
                    const TraceInfo& info, const WriteOptions& wo, const std::string& out_path) {
  TraceWriter writer(begin_partial(out_path), info, wo);
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const TraceReader piece(store.path(i, samples[i]));
    const SampleInfo s = piece.read_sample(samples[i]);
    writer.write_sample(s);
    for (int l = 0; l < info.num_layers; ++l) writer.write_layer(s, piece.read_layer(s, l));
    int rows = 0, cols = 0;
    const std::vector<float> logits = piece.read_sample_matrix(s, "logits", rows, cols);
    if (!logits.empty()) writer.write_sample_matrix(s, "logits", rows, cols, logits.data());
  }
  writer.close();
  publish(out_path);
}

WriteOptions capture_write_options(const CaptureOptions& o) {
  WriteOptions wo;
  wo.dtype = o.dtype;
  return wo;
}

PieceStore capture_store(const std::string& out_path, const TraceInfo& info,
                         const CaptureOptions& o) {
  return PieceStore(
      out_path, fingerprint_of({KVSIM_VERSION, o.fingerprint, info.model, std::to_string(o.gen_len),
                                std::to_string(o.force_reference), dtype_name(o.dtype),
                                std::to_string(o.logits), "stop " + ids_text(o.stop_tokens),
                                "compact " + std::to_string(o.compact_window) +
                                    (o.compact_entropies ? "" : " without entropies")}));
}

}  // namespace

void capture_samples(LiveEngine& engine, const PromptReader& prompts,
                     const std::vector<std::string>& samples, const std::vector<bool>& here,
                     const std::string& out_path, const CaptureOptions& o) {
  const TraceInfo info = capture_trace_info(engine, o);
  const PieceStore store = capture_store(out_path, info, o);
  for (std::size_t i = 0; i < samples.size(); ++i) {
    if (!here.empty() && !here[i]) continue;
    if (!store.done(i, samples[i]))
      capture_sample(engine, prompts.read(samples[i]), prompts.path(), info,
                     capture_write_options(o), o, store.path(i, samples[i]));
    if (o.on_sample) o.on_sample();
  }
}

void assemble_capture(LiveEngine& engine, const std::vector<std::string>& samples,
                      const std::string& out_path, const CaptureOptions& o) {
  const TraceInfo info = capture_trace_info(engine, o);
  const PieceStore store = capture_store(out_path, info, o);
  assemble_trace(store, samples, info, capture_write_options(o), out_path);
  store.clear();
}

void capture(LiveEngine& engine, const PromptReader& prompts,
             const std::vector<std::string>& samples, const std::string& out_path,
             const CaptureOptions& o) {
  capture_samples(engine, prompts, samples, {}, out_path, o);
  assemble_capture(engine, samples, out_path, o);
}

namespace {

// The first G steps of a greedy run are those of a G-step run: keeps them.
void keep_first_steps(RunResult& r, int G) {
  if (static_cast<int>(r.steps.size()) <= G) return;
  r.predicted.resize(G + 1);
  if (!r.logits.empty()) r.logits.resize(G);
  r.steps.resize(G);
  r.peak_kv_entries = 0;
  for (const auto& st : r.steps) r.peak_kv_entries = std::max(r.peak_kv_entries, st.kv_entries);
}

// The log-likelihood of the reference answer, teacher-forced: its first token under the run's
// first distribution (the prefill's, or after the appended question), the rest after each step.
double loglik(const RunResult& r, const std::vector<std::int32_t>& ref) {
  double sum = log_softmax_at(r.first_logits, ref[0]);
  for (std::size_t t = 0; t + 1 < ref.size(); ++t) sum += log_softmax_at(r.logits[t], ref[t + 1]);
  return sum;
}

// Decodes both greedy answers (each up to its own first stop token) and scores them against the
// reference answer, when there is one.
void score_answers(const Vocabulary& vocabulary, const std::string& reference,
                   const std::vector<std::int32_t>& policy_ids,
                   const std::vector<std::int32_t>& full_ids, const std::vector<std::int32_t>& stop,
                   EvalSummary& s) {
  s.has_answers = true;
  s.answer = vocabulary.decode(answer_until_stop(policy_ids, stop));
  s.full_answer = vocabulary.decode(answer_until_stop(full_ids, stop));
  s.reference = reference;
  s.has_reference = !reference.empty();
  if (!s.has_reference) return;
  s.score = score_answer(s.answer, reference);
  s.full_score = score_answer(s.full_answer, reference);
}

double mean_ms(const RunResult& r) {
  if (r.steps.empty()) return NAN;
  double s = 0;
  for (const auto& st : r.steps) s += st.seconds;
  return 1000.0 * s / r.steps.size();
}

}  // namespace

namespace {

// The steps every run of a prompt is evaluated over: with stop tokens, the full cache's answer
// ends at the first one predicted (predicted[k], produced by step k - 1): k steps, at least one;
// else all of them.
int answer_steps(const RunResult& full, const EvalOptions& o) {
  for (int k = 0; k <= o.gen_len && !o.stop_tokens.empty(); ++k)
    if (std::find(o.stop_tokens.begin(), o.stop_tokens.end(), full.predicted[k]) !=
        o.stop_tokens.end())
      return std::max(k, 1);
  return o.gen_len;
}

// A policy's runs against the full cache's over G steps: per step, the teacher-forced run's KL
// and top-1 agreement and the greedy run's tokens and memory; then where the greedy answers
// (the prefill's token and one per step) first differ, their overlap and token match.
void compare_with_full(const RunResult& full, const RunResult& tf, const RunResult& gr, int G,
                       EvalSummary& s) {
  s.gen_len = G;
  for (int t = 0; t < G; ++t) {
    EvalStep st;
    st.step = t;
    st.position = s.prompt_len + t;
    st.kl = kl_divergence(full.logits[t], tf.logits[t]);
    st.top1_agree = full.predicted[t + 1] == tf.predicted[t + 1];
    st.full_token = full.predicted[t + 1];
    st.policy_token = gr.predicted[t + 1];
    st.kv_entries = gr.steps[t].kv_entries;
    st.kv_bytes = st.kv_entries * gr.bytes_per_entry;
    st.ms = 1000.0 * gr.steps[t].seconds;
    s.mean_kl += st.kl;
    s.max_kl = std::max(s.max_kl, st.kl);
    s.top1_agreement += st.top1_agree;
    s.steps.push_back(st);
  }
  s.mean_kl /= G;
  s.top1_agreement /= G;
  const int answer = G + 1;  // predicted[0..G]: the prefill's token and one per step
  s.first_divergence = answer;
  for (int i = 0; i < answer; ++i)
    if (gr.predicted[i] != full.predicted[i]) {
      s.first_divergence = i;
      break;
    }
  s.answer_overlap =
      static_cast<double>(longest_common_subsequence(gr.predicted, full.predicted)) / answer;
  s.token_match = token_match_rate(gr.predicted, full.predicted);
}

}  // namespace

namespace {

// What every policy of a prompt is compared with: the full cache's run (its steps cut to the
// answer's), the options of the policies' runs, and the full cache's log-likelihood of the
// reference answer (NaN without one).
struct FullCacheRun {
  RunResult full;
  RunOptions base, reference;
  double reference_loglik = NAN;
};

FullCacheRun run_full_cache(LiveEngine& engine, PreparedPrompt& pp, const PromptSample& prompt,
                            const EvalOptions& o) {
  const int R = static_cast<int>(prompt.reference_ids.size());
  FullCacheRun f;
  f.base.steps = o.gen_len;
  f.base.keep_logits = true;
  f.base.check_invariants = o.check_invariants;
  f.full = engine.run(pp, f.base);
  const int G = answer_steps(f.full, o);  // every policy runs those steps
  if (G < o.gen_len) {
    f.base.steps = G;
    keep_first_steps(f.full, G);
  }
  f.reference = f.base;
  f.reference.steps = std::max(R - 1, 0);
  f.reference.forced = &prompt.reference_ids;
  if (R > 0) f.reference_loglik = loglik(engine.run(pp, f.reference), prompt.reference_ids);
  return f;
}

// One policy on the prepared prompt: teacher-forced on the full cache's answer, greedy on its
// own, and forced on the reference answer when there is one.
EvalSummary evaluate_policy(LiveEngine& engine, PreparedPrompt& pp, const PromptSample& prompt,
                            const PolicyConfig& policy, const FullCacheRun& f,
                            const EvalOptions& o) {
  const int R = static_cast<int>(prompt.reference_ids.size()), G = f.base.steps;
  RunOptions forced = f.base;
  forced.policy = &policy;
  forced.forced = &f.full.predicted;
  const RunResult tf = engine.run(pp, forced);
  // The policy's own answer may end later than the full cache's: with stop tokens its greedy
  // run goes on to --gen steps, and the step columns keep the first G.
  RunOptions greedy = f.base;
  greedy.policy = &policy;
  greedy.keep_logits = false;
  if (!o.stop_tokens.empty()) greedy.steps = o.gen_len;
  RunResult gr = engine.run(pp, greedy);
  const std::vector<std::int32_t> policy_answer = gr.predicted;
  keep_first_steps(gr, G);

  EvalSummary s;
  s.label = policy.label;
  s.sample = prompt.info.name;
  s.budget = policy.budget_text();
  s.prompt_len = prompt.info.prompt_len;
  compare_with_full(f.full, tf, gr, G, s);
  if (o.vocabulary)
    score_answers(*o.vocabulary, prompt.info.reference, policy_answer, f.full.predicted,
                  o.stop_tokens, s);
  if (R > 0) {
    RunOptions ref = f.reference;
    ref.policy = &policy;
    s.ref_tokens = R;
    s.ref_loglik = loglik(engine.run(pp, ref), prompt.reference_ids);
    s.ref_loglik_full = f.reference_loglik;
  }
  s.prompt_kv_bytes = gr.prompt_kv_entries * gr.bytes_per_entry;
  s.prompt_fed = gr.question_steps;
  s.peak_kv_bytes = gr.peak_kv_entries * gr.bytes_per_entry;
  s.full_peak_kv_bytes = f.full.peak_kv_entries * f.full.bytes_per_entry;
  s.ms_per_token = mean_ms(gr);
  s.full_ms_per_token = mean_ms(f.full);
  s.notes = gr.policy_notes;
  return s;
}

}  // namespace

std::vector<EvalSummary> evaluate_prompt(LiveEngine& engine, const PromptSample& prompt,
                                         const std::vector<PolicyConfig>& policies,
                                         const EvalOptions& o) {
  const int R = static_cast<int>(prompt.reference_ids.size());
  const AttentionNeeds needs = LiveEngine::live_needs(policies, engine.model().config());
  PreparedPrompt pp = engine.prepare(prompt, std::max(o.gen_len, R - 1), needs,
                                     LiveEngine::needs_question_after(policies), o.prompt_tail);
  const FullCacheRun f = run_full_cache(engine, pp, prompt, o);
  std::vector<EvalSummary> out;
  for (const auto& policy : policies)
    out.push_back(evaluate_policy(engine, pp, prompt, policy, f, o));
  return out;
}

namespace {

void field(std::string& out, double x) {
  out += ',';
  append_float(out, x);
}

void field(std::string& out, std::int64_t x) {
  out += ',' + std::to_string(x);
}

}  // namespace

std::string eval_steps_csv_header() {
  return "policy,sample,step,position,kl,top1_agree,full_token,policy_token,kv_entries,kv_bytes,"
         "latency_ms\n";
}

void append_eval_steps_csv(std::string& out, const EvalSummary& s, bool timing) {
  for (const auto& st : s.steps) {
    out += csv_quote(s.label) + ',' + csv_quote(s.sample);
    field(out, std::int64_t{st.step});
    field(out, std::int64_t{st.position});
    field(out, st.kl);
    field(out, std::int64_t{st.top1_agree});
    field(out, std::int64_t{st.full_token});
    field(out, std::int64_t{st.policy_token});
    field(out, st.kv_entries);
    field(out, st.kv_bytes);
    field(out, timing ? st.ms : NAN);
    out += '\n';
  }
}

namespace {

// A row's notes in one CSV field, " | " between them (notes are sentences: they hold commas and
// semicolons, not bars).
constexpr const char* kNoteSeparator = " | ";

std::string join_notes(const std::vector<std::string>& notes) {
  std::string out;
  for (const auto& n : notes) out += (out.empty() ? "" : kNoteSeparator) + n;
  return out;
}

std::vector<std::string> split_notes(const std::string& field) {
  std::vector<std::string> out;
  const std::string separator = kNoteSeparator;
  for (std::size_t from = 0; from < field.size();) {
    std::size_t to = field.find(separator, from);
    if (to == std::string::npos) to = field.size();
    out.push_back(field.substr(from, to - from));
    from = to + separator.size();
  }
  return out;
}

}  // namespace

std::string eval_summary_csv_header() {
  return "policy,sample,budget,prompt_len,gen_len,mean_kl,max_kl,top1_agreement,first_divergence,"
         "answer_overlap,exact_match,token_match,answer_exact,answer_contains,full_answer_exact,"
         "full_answer_contains,ref_tokens,ref_loglik,ref_loglik_full,ref_nll,ref_nll_full,"
         "ref_ppl,ref_ppl_full,prompt_kv_bytes,prompt_fed,"
         "peak_kv_bytes,full_peak_kv_bytes,kv_fraction,ms_per_token,full_ms_per_token,answer,"
         "full_answer,reference,notes\n";
}

void append_eval_summary_csv(std::string& out, const EvalSummary& s, bool timing) {
  out += csv_quote(s.label) + ',' + csv_quote(s.sample) + ',' + csv_quote(s.budget);
  field(out, std::int64_t{s.prompt_len});
  field(out, std::int64_t{s.gen_len});
  field(out, s.mean_kl);
  field(out, s.max_kl);
  field(out, s.top1_agreement);
  field(out, std::int64_t{s.first_divergence});
  field(out, s.answer_overlap);
  field(out, std::int64_t{s.first_divergence == s.gen_len + 1});
  field(out, s.token_match);
  const double none = NAN;  // empty: no vocabulary or no reference answer
  field(out, s.has_reference ? (s.score.exact ? 1.0 : 0.0) : none);
  field(out, s.has_reference ? (s.score.contains ? 1.0 : 0.0) : none);
  field(out, s.has_reference ? (s.full_score.exact ? 1.0 : 0.0) : none);
  field(out, s.has_reference ? (s.full_score.contains ? 1.0 : 0.0) : none);
  field(out, std::int64_t{s.ref_tokens});
  field(out, s.ref_loglik);
  field(out, s.ref_loglik_full);
  // Per-token negative log-likelihood of the reference and its perplexity, exp(NLL), as language
  // model papers report them.
  const double nll = s.ref_tokens ? -s.ref_loglik / s.ref_tokens : NAN;
  const double nll_full = s.ref_tokens ? -s.ref_loglik_full / s.ref_tokens : NAN;
  field(out, nll);
  field(out, nll_full);
  field(out, std::exp(nll));
  field(out, std::exp(nll_full));
  field(out, s.prompt_kv_bytes);
  field(out, std::int64_t{s.prompt_fed});
  field(out, s.peak_kv_bytes);
  field(out, s.full_peak_kv_bytes);
  field(out, static_cast<double>(s.peak_kv_bytes) / s.full_peak_kv_bytes);
  field(out, timing ? s.ms_per_token : NAN);
  field(out, timing ? s.full_ms_per_token : NAN);
  out += ',' + (s.has_answers ? csv_quote(s.answer) : std::string());
  out += ',' + (s.has_answers ? csv_quote(s.full_answer) : std::string());
  out += ',' + (s.has_reference ? csv_quote(s.reference) : std::string());
  out += ',' + csv_quote(join_notes(s.notes));
  out += '\n';
}

namespace {

// Columns of the overall rows beyond the per-sample ones.
constexpr const char* kOverallColumns =
    "delta_nll,peak_held_over_budget,samples,seeds,answer_contains_ci_low,"
    "answer_contains_ci_high,answer_exact_ci_low,answer_exact_ci_high,mean_kl_ci_low,"
    "mean_kl_ci_high,delta_nll_ci_low,delta_nll_ci_high,answer_contains_seed_sd";

// The peak entries held per (layer, KV head) over the budget of one row: peak_kv_bytes counts
// the entries stored when a step attends, its own token included, and prompt_kv_bytes over the
// positions compressed (P less prompt_fed) the bytes of one position in every layer and head.
double held_over_budget(const CsvTable& t, std::size_t row, const PolicyConfig* config) {
  if (!config) return NAN;
  const auto col = [&](const char* name) {
    const std::string& v = t.rows[row][t.column(name)];
    return v.empty() ? NAN : std::stod(v);
  };
  const double P = col("prompt_len"), prompt_bytes = col("prompt_kv_bytes");
  const double compressed = P - (t.column("prompt_fed") >= 0 ? col("prompt_fed") : 0.0);
  // The budget as the policy resolved it: a share of the context under `question = append`, of
  // the whole prompt otherwise (a prompt tail's included: sized_for_split).
  const int budget =
      budget_entries(*config, static_cast<int>(config->appends_question() ? compressed : P));
  if (budget <= 0 || !(prompt_bytes > 0)) return NAN;
  return (col("peak_kv_bytes") * compressed / prompt_bytes - 1) / budget;
}

std::string fixed(double x, const char* format) {
  if (std::isnan(x)) return "-";
  char s[32];
  std::snprintf(s, sizeof s, format, x);
  return s;
}

std::string interval(const Interval& i) {
  return i.valid() ? "[" + fixed(i.low, "%.3f") + "," + fixed(i.high, "%.3f") + "]" : "-";
}

}  // namespace

namespace {

// The per-sample rows' notes: per policy, each distinct note with the samples that gave it.
std::vector<std::pair<std::string, std::string>> tallied_notes(
    const CsvTable& t, const std::vector<std::string>& label,
    const std::vector<std::string>& sample, const std::vector<PolicyConfig>& policies) {
  NoteTally noted;
  std::map<std::string, int> policy_index;
  for (const auto& p : policies)
    policy_index.emplace(p.label, static_cast<int>(policy_index.size()));
  std::set<std::string> samples;
  for (std::size_t i = 0; i < t.rows.size(); ++i) {
    samples.insert(sample[i]);
    const auto at = policy_index.find(label[i]);
    if (at != policy_index.end())
      for (const std::string& n : split_notes(t.rows[i][t.column("notes")]))
        noted.add(at->second, sample[i], n);
  }
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [policy, note] : noted.lines(samples.size()))
    out.emplace_back(policies[policy].label, note);
  return out;
}

// Per run and per seed group: the per-sample peak held over the budget furthest from 1.
std::map<std::string, double> furthest_held(const std::vector<std::string>& label,
                                            const std::vector<double>& held) {
  std::map<std::string, double> worst;
  for (std::size_t i = 0; i < label.size(); ++i) {
    if (std::isnan(held[i])) continue;
    for (const std::string& key : {label[i], seed_group_of(label[i])}) {
      if (key.empty()) continue;
      auto [it, added] = worst.emplace(key, held[i]);
      if (!added && std::fabs(held[i] - 1) > std::fabs(it->second - 1)) it->second = held[i];
    }
  }
  return worst;
}

// A policy's overall row: its run's or seed group's numbers, and what the console shows.
struct Overall {
  std::string label;
  int seeds;
  MeanSummary contains, exact, kl, dnll;
  double kv_fraction, held;
  bool sizes_itself;
};

// The summary's per-sample rows: each input row with its ΔNLL and held/budget appended.
void append_per_sample_rows(std::string& csv, const CsvTable& t, const std::vector<double>& delta,
                            const std::vector<double>& held) {
  for (std::size_t i = 0; i < t.rows.size(); ++i) {
    for (std::size_t c = 0; c < t.header.size(); ++c)
      csv += (c ? "," : "") + csv_quote(t.rows[i][c]);
    for (double x : {delta[i], held[i]}) {
      csv += ",";
      append_float(csv, x);
    }
    csv += ",1,1,,,,,,,,,\n";
  }
}

// Every numeric column (and delta_nll) as per-sample tables: `runs` keeps each run apart,
// `pooled` pools a seed group's runs.
struct SampleTables {
  std::map<std::string, SampleTable> runs, pooled;  // header name -> table
};
SampleTables sample_tables(const CsvTable& t, const std::vector<std::string>& label,
                           const std::vector<std::string>& sample,
                           const std::vector<double>& delta) {
  static const std::vector<std::string> text = {"policy",      "sample",    "budget", "answer",
                                                "full_answer", "reference", "notes"};
  SampleTables out;
  for (const auto& h : t.header) {
    if (std::find(text.begin(), text.end(), h) != text.end()) continue;
    const std::vector<double> v = t.numbers(h);
    out.runs[h] = per_sample_values(label, sample, v, {}, false);
    out.pooled[h] = per_sample_values(label, sample, v);
  }
  out.runs["delta_nll"] = per_sample_values(label, sample, delta, {}, false);
  out.pooled["delta_nll"] = per_sample_values(label, sample, delta);
  return out;
}

// The configuration run `name` was made with; with `groups`, a seed group's too (any of its
// runs); else nullptr.
const PolicyConfig* config_of(const std::string& name, const std::vector<PolicyConfig>& policies,
                              bool groups) {
  for (const auto& c : policies)
    if (c.label == name) return &c;
  if (groups)
    for (const auto& c : policies)
      if (seed_group_of(c.label) == name) return &c;
  return nullptr;
}

// The overall CSV line of run or seed group `name` (every column's mean over samples, ΔNLL, the
// furthest held/budget, n, seeds, the intervals), appended to `csv`; its console row.
Overall append_overall_row(std::string& csv, const CsvTable& t,
                           const std::map<std::string, SampleTable>& tables,
                           const std::string& name, const PolicyConfig* cfg, double held) {
  const SampleTable& any = tables.at("mean_kl");
  std::string line = csv_quote(name) + ",all,";
  line += cfg && !cfg->budget_text().empty() ? csv_quote(cfg->budget_text()) : "";
  auto stat = [&](const std::string& h) {
    const SampleTable& table = tables.at(h);
    return summarize(table, table.index(name));
  };
  for (const auto& h : t.header) {
    if (h == "policy" || h == "sample" || h == "budget") continue;
    line += ",";
    if (tables.count(h)) append_float(line, stat(h).mean);
  }
  const MeanSummary d = stat("delta_nll"), c = stat("answer_contains"), e = stat("answer_exact"),
                    k = stat("mean_kl");
  line += ",";
  append_float(line, d.mean);
  line += ",";
  append_float(line, held);
  const int seeds = any.seeds[any.index(name)];
  line += "," + std::to_string(k.n) + "," + std::to_string(seeds);
  for (double x : {c.interval.low, c.interval.high, e.interval.low, e.interval.high, k.interval.low,
                   k.interval.high, d.interval.low, d.interval.high, c.seed_sd}) {
    line += ",";
    append_float(line, x);
  }
  csv += line + "\n";
  return {name,
          seeds,
          c,
          e,
          k,
          d,
          stat("kv_fraction").mean,
          held,
          cfg && !cfg->info->keeps_everything && cfg->budget_kind() != BudgetKind::kEntries};
}

// The console table: plain policies and seed groups (not their runs), budgeted ones first.
std::string console_table(const std::vector<Overall>& rows) {
  std::vector<const Overall*> shown;
  for (const Overall& r : rows)
    if (seed_group_of(r.label).empty()) shown.push_back(&r);
  std::stable_partition(shown.begin(), shown.end(),
                        [](const Overall* r) { return !r->sizes_itself; });
  int w = 24;
  for (const Overall* r : shown) w = std::max<int>(w, static_cast<int>(r->label.size()) + 10);
  std::string table;
  char line[512];
  std::snprintf(line, sizeof line, "%-*s %4s %8s %8s %15s %8s %15s %9s %22s %8s %7s\n", w, "policy",
                "n", "held/B", "contains", "contains_95%", "exact", "exact_95%", "mean_kl",
                "dnll (95%)", "kv_frac", "seedSD");
  table += line;
  bool flagged = false, apart = false;
  for (const Overall* r : shown) {
    if (r->sizes_itself && !apart) {
      table += "sizing their caches themselves (no budget: compare by what they held):\n";
      apart = true;
    }
    const std::string held = held_over_budget_cell(r->held, flagged);
    const std::string label = seed_group_text(r->label, r->seeds);
    std::snprintf(line, sizeof line, "%-*s %4ld %8s %8s %15s %8s %15s %9s %22s %8s %7s\n", w,
                  label.c_str(), r->kl.n, held.c_str(), fixed(r->contains.mean, "%.3f").c_str(),
                  interval(r->contains.interval).c_str(), fixed(r->exact.mean, "%.3f").c_str(),
                  interval(r->exact.interval).c_str(), fixed(r->kl.mean, "%.4f").c_str(),
                  (fixed(r->dnll.mean, "%+.2f") + " " + interval(r->dnll.interval)).c_str(),
                  fixed(r->kv_fraction, "%.2f").c_str(),
                  fixed(r->contains.seed_sd, "%.3f").c_str());
    table += line;
  }
  if (flagged) table += kHeldFootnote;
  table +=
      "means over the n samples with 95% percentile-bootstrap intervals (docs/outputs.md); "
      "contains / exact: the answer contains / is the reference; dnll: NLL of the reference "
      "answer minus the full cache's; seedSD: SD of the accuracy over seeds\n";
  return table;
}

}  // namespace

EvalReport report_evaluation(const std::string& per_sample_csv,
                             const std::vector<PolicyConfig>& policies) {
  const CsvTable t = parse_csv_table(per_sample_csv, "live evaluate summary");
  const std::vector<std::string> label = t.strings("policy"), sample = t.strings("sample");
  // Per-sample additions.
  const std::vector<double> nll = t.numbers("ref_nll"), nll_full = t.numbers("ref_nll_full");
  std::vector<double> delta(t.rows.size()), held(t.rows.size());
  for (std::size_t i = 0; i < t.rows.size(); ++i) {
    delta[i] = nll[i] - nll_full[i];
    held[i] = held_over_budget(t, i, config_of(label[i], policies, false));
  }
  EvalReport out;
  out.notes = tallied_notes(t, label, sample, policies);
  out.summary_csv = eval_summary_csv_header();
  out.summary_csv.pop_back();
  out.summary_csv += std::string(",") + kOverallColumns + "\n";
  append_per_sample_rows(out.summary_csv, t, delta, held);
  // Overall rows: each run, then each seed group, by their per-sample tables.
  const SampleTables tables = sample_tables(t, label, sample, delta);
  const std::map<std::string, double> worst_held = furthest_held(label, held);
  std::vector<Overall> rows;
  auto overall = [&](const std::map<std::string, SampleTable>& by_column, const std::string& name) {
    if (by_column.at("mean_kl").index(name) < 0) return;
    const double h = worst_held.count(name) ? worst_held.at(name) : NAN;
    rows.push_back(append_overall_row(out.summary_csv, t, by_column, name,
                                      config_of(name, policies, true), h));
  };
  std::vector<std::string> groups;
  for (const auto& p : policies) {
    overall(tables.runs, p.label);
    const std::string g = seed_group_of(p.label);
    if (!g.empty() && std::find(groups.begin(), groups.end(), g) == groups.end())
      groups.push_back(g);
  }
  for (const auto& g : groups) overall(tables.pooled, g);
  out.table = console_table(rows);
  return out;
}

}  // namespace kvsim::live
