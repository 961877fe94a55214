// The eviction-policy interface and registry.
//
// A Policy decides which KV entries of one sample stay cached: it keeps its own state and edits
// the KvCache through two hooks. It sees only attention statistics up to the current step (never
// future queries, except policies that declare `lookahead`, whose results are labelled as such)
// and does no trace I/O, so the same code can drive eviction inside a live model.
//
// Call order, per sample: on_prefill(layer l) for l = 0..L-1 in increasing order, and
// on_decode(step t, layer l) with t increasing within each layer. Replay runs each layer's
// prefill and all its decode steps before the next layer with one instance. The live path
// (sim/live/live_engine.hpp) decodes step-major, so it gives every layer its own instance, which
// first sees the prefill of every lower layer: a policy may carry information from lower to
// higher layers at prefill, and must not carry decode-time state across layers.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/kv_cache.hpp"
#include "core/layer_attention.hpp"
#include "core/params.hpp"
#include "core/run_labels.hpp"
#include "core/sample_stats.hpp"

namespace kvsim {

// Renormalised attention of one decode step over the attended entries of the cache (the
// full-cache probabilities renormalised over the attended set; 0 for stored-but-unused entries).
struct StepAttention {
  int step = 0;
  int position = 0;  // P + step, the query's position (already appended to the cache)
  int group = 1;     // query heads per KV head
  // probs[g][r * n_g + e]: query head g*group + r on entry e of KV head g (n_g = cache size).
  // Read through head(): when `fill` is set, a KV head's row is written on its first read, so
  // policies that never look at the step's attention do not pay for it. It describes the cache as
  // on_decode received it: read a KV head's row before editing that head.
  mutable std::vector<std::vector<float>> probs;
  std::function<void(int g, std::vector<float>& out)> fill;
  mutable std::vector<std::uint8_t> filled;  // [g], with `fill`
  const float* head(int g, int r, int n) const {
    if (fill && !filled[g]) {
      fill(g, probs[g]);
      filled[g] = 1;
    }
    return probs[g].data() + static_cast<std::size_t>(r) * n;
  }
};

// The modality of the positions that exist at a hook (0 text, 1 image, 2 video), indexed by
// position: size() is the number visible, and reading past it throws as reading a key does, so a
// policy learns nothing of the generation's length from it.
class VisibleModality {
 public:
  VisibleModality(const std::uint8_t* data, int size) : data_(data), size_(size) {}
  std::uint8_t operator[](int pos) const {
    if (pos < 0 || pos >= size_) out_of_range(pos);
    return data_[pos];
  }
  int size() const { return size_; }
  const std::uint8_t* data() const { return data_; }

 private:
  [[noreturn]] void out_of_range(int pos) const;
  const std::uint8_t* data_;
  int size_;
};

// What a policy may read at a hook: the layer's shared statistics, gated by its declared needs,
// and the q/k/v rows of the positions that exist at that hook — positions < P at the prefill,
// positions <= P + t at decode step t (the horizon). Reading past the horizon throws, unless the
// policy declares `lookahead`.
class LayerView {
 public:
  LayerView(const LayerAttention& att, bool lookahead, const SampleStats* stats = nullptr)
      : att_(att), lookahead_(lookahead), stats_(stats), horizon_(att.prompt_len()) {}
  int layer() const { return att_.layer(); }
  int num_layers() const { return att_.num_layers(); }
  int prompt_len() const { return att_.prompt_len(); }
  int group_size() const { return att_.group_size(); }
  int num_heads() const { return att_.num_heads(); }
  int num_kv_heads() const { return att_.num_kv_heads(); }
  int head_dim() const { return att_.head_dim(); }
  float scale() const { return att_.scale(); }
  double rope_theta() const { return att_.rope_theta(); }
  // The rotary position of a visible position on rotary pair f: pos, or its M-RoPE id on the
  // pair's axis (traces/mrope.hpp); and where the next token's positions start.
  int rotary_position(int pos, int pair) const;
  int next_rotary_position() const;
  bool has_values() const { return att_.tensors().has_v(); }
  // Positional like the rest of the view: the first visible_len() positions (all of them with
  // `lookahead`).
  VisibleModality modality() const {
    const auto& m = att_.sample().modality;
    return {m.data(), lookahead_ ? static_cast<int>(m.size()) : std::min<int>(horizon_, m.size())};
  }
  // Positions that exist at this hook: P at the prefill, P + t + 1 at decode step t.
  int visible_len() const { return horizon_; }
  void set_horizon(int positions) { horizon_ = positions; }
  // The d floats of position `pos`: key and value of KV head g, query of query head h.
  const float* key(int pos, int g) const;
  const float* value(int pos, int g) const;
  const float* query(int pos, int h) const;
  // Prompt statistics (declared in AttentionNeeds): column sums of the causal prompt attention,
  // the last prefill_window() prompt rows, and the text-query column sums and maxima.
  const float* prefill_column_sums(int h) const { return att_.prefill_column_sums(h); }
  const float* prefill_column_sums_rounded(int h) const {
    return att_.prefill_column_sums_rounded(h);
  }
  DType dtype() const { return att_.sample().dtype; }  // the trace's (float32 in a live model)
  int prefill_window() const { return att_.prefill_window(); }
  const float* prefill_window_row(int h, int r) const { return att_.prefill_window_row(h, r); }
  // The window statistics (AttentionNeeds::window_group_sums, last_row_head_mean).
  std::vector<double> window_group_sums(int g, int width) const {
    return att_.window_group_sums(g, width);
  }
  std::vector<double> last_row_head_mean() const { return att_.last_row_head_mean(); }
  const float* text_query_column_sums() const { return att_.text_query_column_sums(); }
  const float* text_query_column_max() const { return att_.text_query_column_max(); }
  // Full-cache probabilities of decode step t (t <= the current step unless lookahead).
  const float* decode_probs(int t, int h) const;
  // Lookahead policies only: any decode step's full-cache probabilities, and the generation length.
  const float* future_decode_probs(int t, int h) const;
  int future_gen_len() const;
  // Whole-sample statistics (requested with AttentionNeeds::sample_entropies).
  const SampleStats& sample_stats() const;
  // The same view with future attention closed (a lookahead policy running a causal one inside).
  LayerView causal() const {
    LayerView v(att_, false, stats_);
    v.horizon_ = horizon_;
    return v;
  }

 private:
  void check_visible(int pos, const char* what) const;

  const LayerAttention& att_;
  bool lookahead_;
  const SampleStats* stats_;
  int horizon_;
};

// What a policy may know of a sample when it is created: the prompt (its modality, segments,
// media and token ids), not the generation — its length, tokens and modality are the future.
SampleInfo known_before_decoding(SampleInfo sample);

class Policy {
 public:
  virtual ~Policy() = default;
  // End of the prefill of a layer: the cache holds positions 0..P-1 in every KV head.
  virtual void on_prefill(const LayerView& view, KvCache& cache) = 0;
  // After decode step t attended (att); the cache already holds position P + t.
  virtual void on_decode(const LayerView& view, const StepAttention& att, KvCache& cache) = 0;
  // Most entries a KV head may hold after a hook returns, or -1 when unbounded. Checked by the
  // engine after every hook.
  virtual int capacity(int layer, int kv_head) const { return -1; }
  // The scores the policy evicts by, indexed by position, for diagnostics (--bounds); nullptr
  // when it has none.
  virtual const std::vector<double>* eviction_scores(int layer, int kv_head) const {
    return nullptr;
  }
  // What the policy adjusted for this sample (e.g. a window clamped to a smaller budget), each a
  // sentence naming the policy and parameter; reported as warnings and kept with the results.
  // A wrapper (policies/decode_mode.cpp) reports the notes of the policy it wraps.
  virtual const std::vector<std::string>& notes() const { return notes_; }

 protected:
  void note(std::string text) { notes_.push_back(std::move(text)); }

 private:
  std::vector<std::string> notes_;
};

// Switches a policy offers beside its own parameters, declared at its registration (a
// capability, not a parameter name): the registry adds each one's standard parameter to the
// policy's and implements `decode` by wrapping `create`; the engine (`caches`, `question`) and the
// equal-memory rule read them through PolicyConfig. A policy that offers `compress` or `question`
// reads its value itself (`compress` changes when it evicts; `question = append` must refuse a
// configuration that evicts while decoding: check_question_once).
struct PolicySwitches {
  bool decode = false;    // decode = grow | cap | every:N (decode_mode_param)
  bool compress = false;  // compress = every_step | prefill (compress_when_param)
  bool caches = false;    // caches = kv_head | query_head (caches_param)
  bool question = false;  // question = compress | append (question_param)
};

struct PolicyInfo {
  std::string name;
  std::string summary;            // one line
  std::string provenance;         // paper and section, or repository and file
  std::vector<ParamSpec> params;  // its own; the registry appends those of its switches
  PolicySwitches switches;
  AttentionNeeds needs;    // statistics computed once per layer for the whole run
  bool lookahead = false;  // reads future attention: an upper reference, not a deployable policy
  bool merges = false;     // may merge entries (decision dumps then carry `merged`)
  // Whether it merges, when that depends on its parameters (KVCache-Factory's `merge`); unset:
  // `merges`.
  std::function<bool(const ParamSet&)> merges_for;
  // Needs may depend on parameters (e.g. SnapKV's window).
  std::function<AttentionNeeds(const ParamSet&)> needs_for;
  std::function<std::unique_ptr<Policy>(const ParamSet&, const SampleInfo&)> create;
  // The layer whose queries and keys a layer attends with (ST3's QK heredity); unset: itself.
  std::function<int(const ParamSet&, int layer)> attention_source;
  // Whether it keeps one cache per query head when that depends on more than its own `caches`
  // (the oracle follows the policy it matches); unset: `caches = query_head`.
  std::function<bool(const ParamSet&)> query_head_caches;
  // Whether it compresses the context only, when that depends on more than its own `question`
  // (the oracle follows the policy it matches); unset: `question = append`.
  std::function<bool(const ParamSet&)> appends_question;
  // Equal memory (--equal-memory): the values of its own parameters under which the policy holds
  // at most its budget's entries after every hook, beyond those every budgeted policy gets
  // (equal_memory_overrides); unset: none. Throws std::invalid_argument when it cannot.
  std::function<std::map<std::string, std::string>(const ParamSet&)> equal_memory;
  // budget_rounding = parts (budget_rounding_param(true)): the share of the budget its recent part
  // takes, read from its own parameters (H2O's `recent`, LOOK-M's `recent_ratio`); unset: no
  // recent part. Throws std::invalid_argument when the parameters give no share.
  std::function<double(const ParamSet&)> recent_share;
  // Never evicts: the reference every metric is measured against, with no budget to hold (full).
  bool keeps_everything = false;
  // A lookahead reference regret is measured against (replay's `regret` column): given its
  // parameters, the label of the policy whose memory it matches step by step, or "" when it holds
  // its own budget (then it serves policies whose budget resolves alike); unset: not a reference.
  std::function<std::string(const ParamSet&)> regret_reference_for;
};

class PolicyRegistry {
 public:
  static PolicyRegistry& instance();
  void add(PolicyInfo info);
  // Replaces a policy added at run time (Python registrations); `info.name` must exist.
  void replace(PolicyInfo info);
  const PolicyInfo& get(const std::string& name) const;  // throws listing known names
  std::vector<std::string> names() const;

 private:
  std::map<std::string, PolicyInfo> policies_;
};

// How a configuration's cache is sized, read from its registration: by its budget (kEntries: a
// count or a share of the prompt, resolved per sample), by itself (kSelfSized: it declares no
// `budget`, as fastv and st3), or by itself in this configuration (kSpecial: the budget is one of
// its declared special values, hae's `auto`).
enum class BudgetKind { kEntries, kSelfSized, kSpecial };

// One policy of a run: name, label, resolved parameters.
struct PolicyConfig {
  std::string label;
  const PolicyInfo* info = nullptr;
  ParamSet params;
  AttentionNeeds needs() const { return info->needs_for ? info->needs_for(params) : info->needs; }
  int attention_source(int layer) const {
    return info->attention_source ? info->attention_source(params, layer) : layer;
  }
  bool merges() const { return info->merges_for ? info->merges_for(params) : info->merges; }
  // `caches = query_head`: the policy runs on the layer with its KV heads repeated per query head.
  bool query_head_caches() const {
    if (info->query_head_caches) return info->query_head_caches(params);
    return info->switches.caches && params.get_string("caches") == "query_head";
  }
  // `question = append`: the policy compresses the context and the question is appended after
  // (the engine replays it on the sample split at its question: traces/kvtrace.hpp).
  bool appends_question() const {
    if (info->appends_question) return info->appends_question(params);
    return info->switches.question && params.get_string("question") == "append";
  }
  BudgetKind budget_kind() const;
  // The budget as given ("20%", "64", "auto"), or "" when it declares none.
  std::string budget_text() const;
};

// How a policy sees a sample's prompt: the last `fed` prompt positions are fed after compression
// as decode steps, `hooked` when the policy decides and is measured on them (a prompt tail) and
// not when they are the question appended unhooked (`question = append`, kvpress's pipeline).
struct PromptSplit {
  int fed = 0;
  bool hooked = false;
};
// The split of `sample` for policy `p` under `prompt_tail` (ReplayOptions::prompt_tail, the live
// engine's prepare).
// invalid_argument when the tail cannot be fed (prompt_tail_length) or when the policy splits at
// its question itself (`question = append`) and a tail is given: the two orders are exclusive.
PromptSplit prompt_split(const PolicyConfig& p, const SampleInfo& sample, int prompt_tail);
// The configuration `p` is created with on `sample` split by `split`. Under a prompt tail a budget
// given as a share of the prompt (N%, compression_ratio:R) is a share of the whole prompt: it is
// resolved there and handed over as that many entries, so the part compressed holds what a
// compression of the whole prompt holds and the orders with and without a tail are at equal
// memory (under budget_rounding = parts, H2O's and LOOK-M's recent share is then taken of those
// entries). Otherwise (no tail, `question = append`, a budget in entries or none) `p` itself.
PolicyConfig sized_for_split(const PolicyConfig& p, const SampleInfo& sample,
                             const PromptSplit& split);

// A named parameter set pinning one reference reading of a method (policies/presets.cpp).
struct PolicyPreset {
  std::string name;    // "<policy>:<reading>", e.g. "snapkv:kvpress"
  std::string policy;  // the registered policy it configures
  std::map<std::string, std::string> params;
  std::string provenance;
  std::string summary;
};
const std::vector<PolicyPreset>& policy_presets();

// `name` is a policy or a preset, optionally NAME@TAG to run it twice in one run (e.g.
// oracle@snapkv with match=snapkv beside a plain oracle); the label is `name`. Preset values apply
// first, then `overrides`; every value is validated against the policy's declarations.
// `compression_ratio=R` (kvpress's fraction removed) is accepted as an alias of
// budget=compression_ratio:R.
PolicyConfig make_policy_config(const std::string& name,
                                const std::map<std::string, std::string>& overrides);

// A policy or preset name resolved once: the registered policy it runs and the preset whose
// values apply first. What builds a run's policy list reads of a name, for every configuration
// and warning, without looking it up again.
struct NamedPolicy {
  std::string name;                      // as given: NAME or PRESET, either with @TAG
  const PolicyInfo* info = nullptr;      // the registered policy
  const PolicyPreset* preset = nullptr;  // nullptr for a policy named directly
  bool declares(const std::string& param) const;
  bool pins_budget() const;  // a preset that fixes the budget (hae:table2)
};
// Throws std::invalid_argument for a malformed or unknown name (suggesting the nearest).
NamedPolicy resolve_policy_name(const std::string& name);
// make_policy_config of a resolved name; `label` (default: the name) labels the configuration
// and its parameter errors.
PolicyConfig make_policy_config(const NamedPolicy& named,
                                const std::map<std::string, std::string>& overrides,
                                const std::string& label = "");

// What every registered policy and preset reads at its defaults (the test_ policies the tests
// register left out): what a compact trace keeps by default.
AttentionNeeds default_policy_needs();
// Its window group sums' widths up to `window`: what a compact trace stores by default
// (CompactOptions::window_widths).
std::vector<int> default_window_widths(int window);

// Whether the policy or preset `name` declares the parameter `param`.
bool policy_declares(const std::string& name, const std::string& param);

// --equal-memory: the parameter values under which the policy configured by `config` holds at
// most the entries its budget resolves to after every hook: budget_rounding = ceil (the same
// count for every policy), decode = cap where decoding would grow the cache (grow, every:N),
// compress = every_step where the prompt is compressed once (prefill), question = compress where
// the question would be appended uncompressed (append), caches = kv_head where each query head
// would keep its own cache (group-size x the memory), then the policy's own
// (PolicyInfo::equal_memory: lookm keeps its text within the budget, hae its recycle bin). Only
// the values that differ from the configuration's are returned. std::nullopt for a policy with
// no budget (it sizes its cache itself) and for `full`.
std::optional<std::map<std::string, std::string>> equal_memory_overrides(
    const PolicyConfig& config);

// Registers a policy from a static initialiser in its own .cpp.
struct PolicyRegistration {
  explicit PolicyRegistration(PolicyInfo info) { PolicyRegistry::instance().add(std::move(info)); }
};

// Entries the policy's `budget` resolves to for a prompt of prompt_len, or -1 when its cache is
// not sized by a budget (budget_kind() is not kEntries).
int budget_entries(const PolicyConfig& policy, int prompt_len);

// The Policy contract after a hook: no (layer, KV head) of `cache` holds more than the policy's
// declared capacity. Throws std::logic_error naming the label, layer, head and hook. (Ordering and
// uniqueness are kept by KvCache's edits themselves.)
void check_capacity(const Policy& policy, const KvCache& cache, int layer, const char* hook,
                    const std::string& label);

// A command line's --budget: sets overrides["budget"] when the policy (or preset) `name` declares
// a budget and the overrides do not already set one (nor compression_ratio). Returns whether the
// policy has a budget at all.
bool apply_default_budget(const std::string& name, const std::string& budget,
                          std::map<std::string, std::string>& overrides);
bool apply_default_budget(const NamedPolicy& named, const std::string& budget,
                          std::map<std::string, std::string>& overrides);
// The warning to print when a command line's budget reaches policies that ignore it (they have
// no budget parameter), naming them; "" when there are none or no budget was given.
std::string budget_ignored_warning(const std::vector<NamedPolicy>& names,
                                   const std::string& budget);
// The warning to print when a command line's budget replaces a policy's own default reading of
// it (`budget = auto`: a cache the policy sizes itself, as hae's), naming the policies among
// `names` whose `overrides` do not set a budget; "" when there are none or no budget was given.
std::string budget_replaced_warning(
    const std::vector<NamedPolicy>& names,
    const std::map<std::string, std::map<std::string, std::string>>& overrides,
    const std::string& budget);

// The parameters of the PolicySwitches, which the registry appends to a policy that offers them.
// `decode` (policies/decode_mode.cpp): grow | cap | every:N, what a policy that compresses only
// the prompt does while decoding. A policy that offers it is wrapped by the registry, so every
// caller of `create` (replay, the live path, Python) gets the mode.
ParamSpec decode_mode_param();
std::unique_ptr<Policy> apply_decode_mode(std::unique_ptr<Policy> policy, const ParamSet& params);

// `compress = every_step | prefill` of policies that evict at every step in their paper and once
// after the prompt in kvpress and KVCache-Factory (streamingllm, tova).
ParamSpec compress_when_param();

// `caches = kv_head | query_head`: one cache per KV head (kvsim, kvpress), or one per query head
// after repeat_kv, as the original SnapKV, Ada-KV and KVCache-Factory keep on GQA models (each
// query head selects its own set; group-size x the memory). The engine honours it by replaying
// the policy on the layer with K and V repeated per query head; on multi-head layers the two are
// the same.
ParamSpec caches_param();

// `question = compress | append`: compress the whole prompt (the papers, KVCache-Factory), or the
// context only and append the question uncompressed after it, as kvpress's pipeline does
// (kvpress/pipeline.py: the press runs on the context's prefill, the question is fed after it);
// the budget then resolves against the context's length. The question is the sample's
// `question_len` (kvtrace-v1.md).
ParamSpec question_param();
// Throws (naming `policy`) when `question = append` meets a policy configuration that evicts
// while decoding: the question's entries would enter a cache the policy then trims as if it had
// seen them.
void check_question_once(const ParamSet& p, const std::string& policy, bool evicts_while_decoding);

// The budget parameter every budgeted policy declares, and its resolution against P.
ParamSpec budget_param(const std::string& default_value = "20%");
// `budget_rounding` (core/params.hpp Rounding), declared by every budgeted policy beside its
// budget; `parts` (for policies with a heavy and a recent part) adds H2O's and LOOK-M's split.
ParamSpec budget_rounding_param(bool parts);
int resolve_budget(const ParamSet& params, int prompt_len, const std::string& policy);
// The budget, and under budget_rounding = parts its recent part (else recent = -1: the policy
// splits the total by its own rule). `recent_share` is the policy's (PolicyInfo::recent_share),
// read only under parts; parts without one is an error naming the policy.
struct BudgetSplit {
  int total = 0;
  int recent = -1;
};
BudgetSplit resolve_budget_split(const ParamSet& params, int prompt_len, const std::string& policy,
                                 const std::function<double(const ParamSet&)>& recent_share = {});

}  // namespace kvsim
