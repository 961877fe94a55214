#include "policies/policy.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "core/suggest.hpp"
#include "traces/mrope.hpp"

namespace kvsim {

void LayerView::check_visible(int pos, const char* what) const {
  if (lookahead_ || (pos >= 0 && pos < horizon_)) return;
  throw std::logic_error(std::string("a policy without `lookahead` read the ") + what +
                         " of position " + std::to_string(pos) + ", which does not exist yet (" +
                         std::to_string(horizon_) + " positions exist at this hook)");
}

void VisibleModality::out_of_range(int pos) const {
  throw std::logic_error("a policy without `lookahead` read the modality of position " +
                         std::to_string(pos) + ", which does not exist yet (" +
                         std::to_string(size_) + " positions exist at this hook)");
}

const float* LayerView::key(int pos, int g) const {
  check_visible(pos, "key");
  return &att_.tensors().k(pos, g, 0);
}

const float* LayerView::value(int pos, int g) const {
  check_visible(pos, "value");
  return &att_.tensors().v(pos, g, 0);
}

int LayerView::rotary_position(int pos, int pair) const {
  check_visible(pos, "rotary position");
  return kvsim::rotary_position(att_.mrope_section(), att_.sample(), pos, pair);
}

int LayerView::next_rotary_position() const {
  return kvsim::next_rotary_position(att_.sample(), visible_len());
}

const float* LayerView::query(int pos, int h) const {
  check_visible(pos, "query");
  return att_.tensors().query(pos, h);
}

const float* LayerView::decode_probs(int t, int h) const {
  check_visible(att_.prompt_len() + t, "decode attention");
  return att_.decode_probs(t, h);
}

const float* LayerView::future_decode_probs(int t, int h) const {
  if (!lookahead_) throw std::logic_error("a policy without `lookahead` read future attention");
  return att_.decode_probs(t, h);
}

int LayerView::future_gen_len() const {
  if (!lookahead_)
    throw std::logic_error("a policy without `lookahead` read the generation length");
  return att_.gen_len();
}

SampleInfo known_before_decoding(SampleInfo s) {
  const auto prompt = static_cast<std::size_t>(s.prompt_len);
  s.gen_len = 0;
  s.reference.clear();
  for (auto* v : {&s.modality, &s.segment})
    if (v->size() > prompt) v->resize(prompt);
  for (auto* v : {&s.media_id, &s.token_ids})
    if (v->size() > prompt) v->resize(prompt);
  return s;
}

PromptSplit prompt_split(const PolicyConfig& p, const SampleInfo& sample, int prompt_tail) {
  if (prompt_tail != 0) {
    if (p.appends_question())
      throw std::invalid_argument(
          p.label +
          ": question = append is an order of its own (the question appended after "
          "compression, unhooked); drop it or the prompt tail (" +
          prompt_tail_text(prompt_tail) + ")");
    return {prompt_tail_length(sample, prompt_tail), true};
  }
  if (p.appends_question()) return {question_length(sample), false};
  return {};
}

PolicyConfig sized_for_split(const PolicyConfig& p, const SampleInfo& sample,
                             const PromptSplit& split) {
  if (!split.hooked || split.fed == 0) return p;
  const int entries = budget_entries(p, sample.prompt_len);
  if (entries < 0) return p;
  const Size size = p.params.get_size("budget");
  if (!size.percent && !size.removed) return p;
  std::map<std::string, std::string> values = p.params.values();
  values["budget"] = std::to_string(entries);
  PolicyConfig sized = p;
  sized.params = ParamSet(p.params.owner(), std::move(values));
  return sized;
}

const SampleStats& LayerView::sample_stats() const {
  if (!stats_) throw std::logic_error("sample statistics were not requested");
  return *stats_;
}

PolicyRegistry& PolicyRegistry::instance() {
  static PolicyRegistry registry;
  return registry;
}

namespace {
bool declares(const PolicyInfo& info, const std::string& param) {
  return std::any_of(info.params.begin(), info.params.end(),
                     [&](const ParamSpec& s) { return s.name == param; });
}

// The parameters of the switches a policy offers, appended to its own (which may not take their
// names), and `decode` implemented: the policy is created through its decode mode.
void add_switches(PolicyInfo& info) {
  const PolicySwitches& offers = info.switches;
  for (const auto& [offered, spec] :
       {std::pair{offers.decode, decode_mode_param()},
        std::pair{offers.compress, compress_when_param()}, std::pair{offers.caches, caches_param()},
        std::pair{offers.question, question_param()}}) {
    if (declares(info, spec.name))
      throw std::invalid_argument("policy '" + info.name + "' declares a parameter '" + spec.name +
                                  "', the name of a switch the registry adds: offer the switch "
                                  "(PolicyInfo::switches) or name the parameter otherwise");
    if (offered) info.params.push_back(spec);
  }
  if (!offers.decode) return;
  info.create = [create = info.create](const ParamSet& p, const SampleInfo& s) {
    return apply_decode_mode(create(p, s), p);
  };
}

}  // namespace

void PolicyRegistry::add(PolicyInfo info) {
  add_switches(info);
  const std::string name = info.name;
  if (!policies_.emplace(name, std::move(info)).second)
    throw std::logic_error("policy '" + name + "' registered twice");
}

void PolicyRegistry::replace(PolicyInfo info) {
  const auto it = policies_.find(info.name);
  if (it == policies_.end()) throw std::logic_error("policy '" + info.name + "' is not registered");
  add_switches(info);
  it->second = std::move(info);
}

const PolicyInfo& PolicyRegistry::get(const std::string& name) const {
  auto it = policies_.find(name);
  if (it == policies_.end()) {
    std::string known;
    for (const auto& [n, _] : policies_) known += (known.empty() ? "" : ", ") + n;
    throw std::invalid_argument("unknown policy '" + name + "'" + did_you_mean(name, names()) +
                                " (known: " + known + ")");
  }
  return it->second;
}

std::vector<std::string> PolicyRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& [n, _] : policies_) out.push_back(n);
  return out;
}

namespace {
// kvpress's `compression_ratio` (the fraction removed) as an alias of `budget`.
void apply_compression_ratio_alias(const std::string& name, const PolicyInfo& info,
                                   const std::map<std::string, std::string>& overrides,
                                   std::map<std::string, std::string>& values) {
  const auto it = values.find("compression_ratio");
  if (it == values.end()) return;
  if (!declares(info, "budget"))
    throw std::invalid_argument(name + ": parameter 'compression_ratio' given, but " + info.name +
                                " has no budget (it sizes its cache itself)");
  if (overrides.count("budget"))
    throw std::invalid_argument(name + ": give 'budget' or 'compression_ratio', not both");
  values["budget"] = kCompressionRatioPrefix + it->second;
  values.erase(it);
}
}  // namespace

BudgetKind PolicyConfig::budget_kind() const {
  for (const ParamSpec& spec : info->params)
    if (spec.name == "budget") {
      const std::string value = budget_text();
      const bool special =
          std::find(spec.choices.begin(), spec.choices.end(), value) != spec.choices.end();
      return special ? BudgetKind::kSpecial : BudgetKind::kEntries;
    }
  return BudgetKind::kSelfSized;
}

std::string PolicyConfig::budget_text() const {
  const auto& v = params.values();
  const auto it = v.find("budget");
  return it == v.end() ? "" : it->second;
}

int budget_entries(const PolicyConfig& policy, int prompt_len) {
  if (policy.budget_kind() != BudgetKind::kEntries) return -1;
  return resolve_budget_split(policy.params, prompt_len, policy.info->name,
                              policy.info->recent_share)
      .total;
}

namespace {
// NAME@TAG: a second instance of NAME in the same run, labelled by the whole string.
std::string untagged(const std::string& name) {
  return name.substr(0, name.find('@'));
}

const PolicyPreset* find_preset(const std::string& untagged_name) {
  for (const auto& p : policy_presets())
    if (p.name == untagged_name) return &p;
  return nullptr;
}
}  // namespace

NamedPolicy resolve_policy_name(const std::string& name) {
  NamedPolicy named;
  named.name = name;
  const std::string base = untagged(name);
  if (base.size() != name.size() && (base.empty() || base.size() + 1 == name.size()))
    throw std::invalid_argument("'" + name + "': expected NAME or NAME@TAG");
  std::string policy = base;
  if (base.find(':') != std::string::npos) {
    named.preset = find_preset(base);
    if (!named.preset) {
      std::string known;
      std::vector<std::string> names;
      for (const auto& p : policy_presets()) {
        known += (known.empty() ? "" : ", ") + p.name;
        names.push_back(p.name);
      }
      throw std::invalid_argument("unknown preset '" + base + "'" + did_you_mean(base, names) +
                                  " (known: " + known + ")");
    }
    policy = named.preset->policy;
  }
  named.info = &PolicyRegistry::instance().get(policy);
  return named;
}

bool NamedPolicy::declares(const std::string& param) const {
  return kvsim::declares(*info, param);
}

bool NamedPolicy::pins_budget() const {
  return preset && preset->params.count("budget") > 0;
}

PolicyConfig make_policy_config(const NamedPolicy& named,
                                const std::map<std::string, std::string>& overrides,
                                const std::string& label) {
  PolicyConfig c;
  c.label = label.empty() ? named.name : label;
  std::map<std::string, std::string> values;
  if (named.preset) values = named.preset->params;
  for (const auto& [k, v] : overrides) values[k] = v;
  c.info = named.info;
  apply_compression_ratio_alias(c.label, *c.info, overrides, values);
  c.params = resolve_params(c.label, c.info->params, values);
  return c;
}

AttentionNeeds default_policy_needs() {
  AttentionNeeds needs;
  for (const std::string& name : PolicyRegistry::instance().names())
    if (name.rfind("test_", 0) != 0) needs.merge(make_policy_config(name, {}).needs());
  for (const PolicyPreset& preset : policy_presets())
    needs.merge(make_policy_config(preset.name, {}).needs());
  return needs;
}

std::vector<int> default_window_widths(int window) {
  std::vector<int> widths;
  for (int w : default_policy_needs().window_group_sums)
    if (w <= window) widths.push_back(w);
  return widths;
}

PolicyConfig make_policy_config(const std::string& name,
                                const std::map<std::string, std::string>& overrides) {
  return make_policy_config(resolve_policy_name(name), overrides);
}

bool policy_declares(const std::string& name, const std::string& param) {
  return resolve_policy_name(name).declares(param);
}

std::optional<std::map<std::string, std::string>> equal_memory_overrides(
    const PolicyConfig& config) {
  const PolicyInfo& info = *config.info;
  if (info.keeps_everything || !declares(info, "budget")) return std::nullopt;
  const auto& current = config.params.values();
  std::map<std::string, std::string> wanted;
  if (declares(info, "budget_rounding")) wanted["budget_rounding"] = "ceil";
  // The switches that would let it hold more: growing while decoding, compressing the prompt
  // once, the question uncompressed, one cache per query head.
  if (info.switches.decode) wanted[decode_mode_param().name] = "cap";
  if (info.switches.compress) wanted[compress_when_param().name] = "every_step";
  if (info.switches.question) wanted[question_param().name] = "compress";
  if (info.switches.caches) wanted[caches_param().name] = "kv_head";
  if (info.equal_memory)
    for (const auto& [k, v] : info.equal_memory(config.params)) wanted[k] = v;
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : wanted)
    if (current.at(k) != v) out[k] = v;
  return out;
}

bool apply_default_budget(const NamedPolicy& named, const std::string& budget,
                          std::map<std::string, std::string>& overrides) {
  if (!named.declares("budget")) return false;
  if (!budget.empty() && !overrides.count("budget") && !overrides.count("compression_ratio") &&
      !named.pins_budget())
    overrides["budget"] = budget;
  return true;
}

bool apply_default_budget(const std::string& name, const std::string& budget,
                          std::map<std::string, std::string>& overrides) {
  return apply_default_budget(resolve_policy_name(name), budget, overrides);
}

std::string budget_ignored_warning(const std::vector<NamedPolicy>& names,
                                   const std::string& budget) {
  std::string ignored, pinned;
  for (const NamedPolicy& n : names) {
    // `full` is the reference with no eviction: a budget has nothing to reach there.
    if (!n.info->keeps_everything && !n.declares("budget"))
      ignored += (ignored.empty() ? "" : ", ") + n.name;
    else if (n.pins_budget())
      pinned += (pinned.empty() ? "" : ", ") + n.name;
  }
  if (budget.empty() || (ignored.empty() && pinned.empty())) return "";
  std::string out = "warning: the budget " + budget + " does not apply to ";
  if (!ignored.empty())
    out += ignored +
           ": they size their caches themselves (compare what each held: the 'stored' "
           "column)";
  if (!pinned.empty())
    out += (ignored.empty() ? "" : "; nor to ") + pinned +
           ": their presets fix the budget (--set LABEL.budget=... overrides it)";
  return out;
}

std::string budget_replaced_warning(
    const std::vector<NamedPolicy>& names,
    const std::map<std::string, std::map<std::string, std::string>>& overrides,
    const std::string& budget) {
  if (budget.empty()) return "";
  std::string replaced;
  for (const NamedPolicy& n : names) {
    const auto it = overrides.find(n.name);
    if (it != overrides.end() &&
        (it->second.count("budget") || it->second.count("compression_ratio")))
      continue;
    if (n.pins_budget()) continue;
    if (make_policy_config(n, {}).budget_kind() == BudgetKind::kSpecial)
      replaced += (replaced.empty() ? "" : ", ") + n.name;
  }
  if (replaced.empty()) return "";
  return "warning: --budget " + budget + " replaces the default budget = auto of " + replaced +
         " (a cache the policy sizes itself, its paper's reading); --set NAME.budget=auto keeps "
         "it";
}

ParamSpec compress_when_param() {
  return {"compress",
          ParamType::kChoice,
          "every_step",
          "every_step (the paper: after the prefill and every decode step) or prefill (the prompt "
          "once, then append: kvpress and KVCache-Factory)",
          0,
          0,
          {"every_step", "prefill"}};
}

ParamSpec question_param() {
  return {"question",
          ParamType::kChoice,
          "compress",
          "compress (the whole prompt) or append (the context only, the sample's question appended "
          "uncompressed after it and the budget taken of the context: kvpress's pipeline)",
          0,
          0,
          {"compress", "append"}};
}

void check_question_once(const ParamSet& p, const std::string& policy, bool evicts_while_decoding) {
  if (evicts_while_decoding && p.get_string("question") == "append")
    throw std::invalid_argument(policy +
                                ": question = append compresses once, after the context; it "
                                "needs a configuration that does not evict while decoding");
}

ParamSpec caches_param() {
  return {"caches",
          ParamType::kChoice,
          "kv_head",
          "kv_head (one cache per KV head) or query_head (one per query head after repeat_kv, "
          "group-size x the memory: the original SnapKV, Ada-KV, KVCache-Factory)",
          0,
          0,
          {"kv_head", "query_head"}};
}

ParamSpec budget_param(const std::string& default_value) {
  return {"budget",
          ParamType::kSize,
          default_value,
          "KV entries kept per (layer, KV head): a count, or a percentage of the prompt length "
          "(rounded by budget_rounding: 20% -> ceil(0.2 P))",
          1,
          1e9};
}

ParamSpec budget_rounding_param(bool parts) {
  std::vector<std::string> choices = {"ceil", "floor", "round", "kvpress"};
  std::string help =
      "how a percentage budget becomes entries (r = percent / 100, in double): ceil (kvsim's, "
      "ceil(r P)), floor (int(r P)), round (Python's round(P r), half to even: "
      "KVCache-Factory), kvpress (int(P (1 - R)) with R = 1 - r: kvpress's compression ratio)";
  if (parts) {
    choices.push_back("parts");
    help +=
        ", parts (the heavy and the recent part each int(P r share), as H2O's and LOOK-M's "
        "code size them)";
  }
  return {"budget_rounding", ParamType::kChoice, "ceil", help, 0, 0, choices};
}

BudgetSplit resolve_budget_split(const ParamSet& params, int prompt_len, const std::string& policy,
                                 const std::function<double(const ParamSet&)>& recent_share) {
  const Size size = params.get_size("budget");
  const std::string rounding = params.values().count("budget_rounding")
                                   ? params.get_string("budget_rounding")
                                   : std::string("ceil");
  BudgetSplit out;
  if (rounding == "parts" && size.percent) {
    // H2O: heavy_budget = int(heavy_budget_ratio * P), recent_budget = int(recent_budget_ratio *
    // P); LOOK-M the same with hh_ratio and recent_ratio. The ratios are r * (1 - share) and
    // r * share, the literals' doubles for the halves the presets use.
    if (!recent_share)
      throw std::invalid_argument(policy + ": budget_rounding = parts needs a recent part");
    const double r = size.value / 100.0, share = recent_share(params);
    out.recent = static_cast<int>(prompt_len * (r * share));
    out.total = out.recent + static_cast<int>(prompt_len * (r * (1.0 - share)));
  } else {
    out.total =
        size.resolve(prompt_len, rounding == "parts" ? Rounding::kCeil : parse_rounding(rounding));
  }
  if (out.total < 1)
    throw std::invalid_argument(
        policy + ": parameter 'budget' = '" + params.get_string("budget") + "' resolves to " +
        std::to_string(out.total) + " entries for a " + std::to_string(prompt_len) +
        "-token prompt (budget_rounding = " + rounding + "); need at least 1");
  return out;
}

int resolve_budget(const ParamSet& params, int prompt_len, const std::string& policy) {
  return resolve_budget_split(params, prompt_len, policy).total;
}

void check_capacity(const Policy& policy, const KvCache& cache, int layer, const char* hook,
                    const std::string& label) {
  for (int g = 0; g < cache.kv_heads(); ++g) {
    const int cap = policy.capacity(layer, g);
    if (cap >= 0 && cache.size(g) > cap)
      throw std::logic_error(label + ": holds " + std::to_string(cache.size(g)) +
                             " entries in layer " + std::to_string(layer) + ", KV head " +
                             std::to_string(g) + " after " + hook + ", above its capacity " +
                             std::to_string(cap));
  }
}

}  // namespace kvsim
