// oracle: evicts the entries that will receive the least attention in the remaining decode steps
// of the trace (sum of full-cache probabilities over those steps and over the query heads of the
// KV head), ties toward the older. It reads the future, so it is an upper reference for what a
// score-based policy could achieve at the same budget, not a deployable method; results label it
// "lookahead".
//
// `match = POLICY` (a policy or preset, optionally with parameters: `snapkv[decode=cap,window=8]`)
// makes the oracle hold, in every KV head after every hook, exactly as many entries as that policy
// holds on the same trace (a causal copy of it runs inside the oracle, with the oracle's budget
// unless the match sets one), so that the two are compared at equal memory. The copy's decode
// attention is the full-cache attention renormalised over what it holds (entries it merged count
// with their recorded keys; only its sizes are used). It keeps a cache per query head when the
// policy it matches does (`caches`), whatever its own `caches` says.
#include <algorithm>
#include <stdexcept>

#include "policies/policy.hpp"
#include "policies/selection.hpp"

namespace kvsim {
namespace {

// "NAME" or "NAME[key=value,...]" -> the policy it names with those parameters, the budget
// defaulting to the oracle's own. Throws std::invalid_argument with what is wrong.
PolicyConfig matched_policy(const std::string& spec, const std::string& budget) {
  std::string name = spec;
  std::map<std::string, std::string> params;
  if (const auto open = spec.find('['); open != std::string::npos) {
    if (spec.back() != ']') throw std::invalid_argument("is not NAME or NAME[key=value,...]");
    name = spec.substr(0, open);
    const std::string body = spec.substr(open + 1, spec.size() - open - 2);
    for (std::size_t start = 0; start <= body.size();) {
      const std::size_t end = std::min(body.find(',', start), body.size());
      const std::string item = body.substr(start, end - start);
      const auto eq = item.find('=');
      if (eq == std::string::npos || eq == 0)
        throw std::invalid_argument("has '" + item + "' where key=value belongs");
      params[item.substr(0, eq)] = item.substr(eq + 1);
      start = end + 1;
    }
  }
  if (name == "oracle" || name.rfind("oracle:", 0) == 0)
    throw std::invalid_argument("names the oracle itself");
  const PolicyConfig probe = make_policy_config(name, params);
  if (probe.info->lookahead) throw std::invalid_argument("names a lookahead policy");
  if (probe.attention_source(1) != 1 || probe.attention_source(2) != 2)
    throw std::invalid_argument("names a policy that attends with other layers' queries");
  if (!params.count("budget") && !params.count("compression_ratio") &&
      probe.params.values().count("budget"))
    params["budget"] = budget;
  return make_policy_config(name, params);
}

// The oracle's needs plus those of the policy it matches.
AttentionNeeds oracle_needs(const ParamSet& p) {
  if (p.get_string("match").empty()) return {};
  return matched_policy(p.get_string("match"), p.get_string("budget")).needs();
}

class Oracle final : public Policy {
 public:
  Oracle(const ParamSet& p, const SampleInfo& s)
      : budget_(resolve_budget(p, s.prompt_len, "oracle")) {
    if (p.get_string("match").empty()) return;
    const PolicyConfig match = matched_policy(p.get_string("match"), p.get_string("budget"));
    matched_ = match.info->create(match.params, s);
  }

  void on_prefill(const LayerView& view, KvCache& cache) override {
    // future_[g][t * T + j] = Σ_{t' >= t} Σ_r p_full[t', g*group + r, j] (suffix sums, exact).
    const int G = view.future_gen_len(), T = view.prompt_len() + G, group = view.group_size();
    T_ = T;
    // Every row but the last (zero) is overwritten below: reuse the storage across layers.
    future_.resize(cache.kv_heads());
    for (auto& f : future_) {
      f.resize(static_cast<std::size_t>(G + 1) * T);
      std::fill(f.end() - T, f.end(), 0.0);
    }
    for (int g = 0; g < cache.kv_heads(); ++g)
      for (int t = G - 1; t >= 0; --t) {
        double* cur = &future_[g][static_cast<std::size_t>(t) * T];
        const double* next = cur + T;
        const float* first = view.future_decode_probs(t, g * group);
        for (int j = 0; j < T; ++j) cur[j] = next[j] + first[j];
        for (int r = 1; r < group; ++r) {
          const float* p = view.future_decode_probs(t, g * group + r);
          for (int j = 0; j < T; ++j) cur[j] += p[j];
        }
      }
    if (matched_) {
      shadow_ = KvCache(cache.kv_heads(), cache.head_dim());
      shadow_.fill_prompt(view.prompt_len());
      shadow_.set_step(-1);
      matched_->on_prefill(view.causal(), shadow_);
      next_position_ = view.prompt_len();
    }
    trim(cache, 0);
  }

  void on_decode(const LayerView& view, const StepAttention& att, KvCache& cache) override {
    if (matched_) {
      shadow_.set_step(att.step);
      // Every position since the last hook: a question appended without one (question = append).
      for (; next_position_ <= att.position; ++next_position_)
        for (int g = 0; g < shadow_.kv_heads(); ++g) shadow_.append(g, next_position_);
      matched_->on_decode(view.causal(), shadow_attention(view, att.step), shadow_);
    }
    trim(cache, att.step + 1);
  }

  int capacity(int, int g) const override { return target(g); }

 private:
  // Entries KV head g may hold now: the budget, or what the matched policy holds.
  int target(int g) const { return matched_ ? shadow_.size(g) : budget_; }

  // The matched policy's decode step t: full-cache probabilities renormalised over the entries
  // it attends (StepAttention's layout), filled when it reads them.
  StepAttention shadow_attention(const LayerView& view, int t) const {
    StepAttention sa;
    sa.step = t;
    sa.position = view.prompt_len() + t;
    sa.group = view.group_size();
    sa.probs.resize(shadow_.kv_heads());
    sa.filled.assign(shadow_.kv_heads(), 0);
    sa.fill = [this, view, t, group = sa.group](int g, std::vector<float>& out) {
      const int n = shadow_.size(g);
      out.assign(static_cast<std::size_t>(group) * n, 0.0f);
      for (int r = 0; r < group; ++r) {
        const float* p = view.decode_probs(t, g * group + r);
        double sum = 0;
        for (int e = 0; e < n; ++e)
          if (shadow_.attended(g, e)) sum += p[shadow_.position(g, e)];
        for (int e = 0; e < n; ++e)
          if (shadow_.attended(g, e) && sum > 0)
            out[static_cast<std::size_t>(r) * n + e] =
                static_cast<float>(p[shadow_.position(g, e)] / sum);
      }
    };
    return sa;
  }

  void trim(KvCache& cache, int from_step) const {
    for (int g = 0; g < cache.kv_heads(); ++g) {
      const int n = cache.size(g), budget = target(g);
      if (n <= budget) continue;
      const double* fut = &future_[g][static_cast<std::size_t>(from_step) * T_];
      if (n == budget + 1) {  // a decode step's new token: drop the single worst, in one pass
        const int one[1] = {lowest_score_entry(cache.positions(g), fut, n)};
        cache.evict(g, one);
        continue;
      }
      std::vector<double> s(n);
      for (int e = 0; e < n; ++e) s[e] = fut[cache.position(g, e)];
      cache.keep_only(g, keep_top_scores(s, budget));
    }
  }
  int budget_;
  std::unique_ptr<Policy> matched_;  // match: the policy whose sizes the oracle holds
  KvCache shadow_{0, 0};             // match: its cache in the current layer
  int next_position_ = 0;            // match: the next position the shadow cache appends
  int T_ = 0;
  std::vector<std::vector<double>> future_;
};

const PolicyRegistration reg({
    .name = "oracle",
    .summary = "Upper reference (lookahead) at equal memory: keeps the entries the remaining "
               "decode steps will attend most, as many as its budget or, with match=POLICY, "
               "exactly as many as that policy holds.",
    .provenance = "kvsim (offline reference: future full-cache attention mass)",
    .params = {budget_param(),
               budget_rounding_param(false),
               {"match",
                ParamType::kString,
                "",
                "hold exactly what this policy holds, head by head and step by step (a policy or "
                "preset, optionally NAME[key=value,...]; the oracle's budget unless it sets one); "
                "empty: the budget",
                0,
                0,
                {},
                [](const std::string& v) -> std::string {
                  if (v.empty()) return "";
                  try {
                    matched_policy(v, "20%");
                    return "";
                  } catch (const std::invalid_argument& e) {
                    return e.what();
                  }
                }}},
    .switches = {.caches = true},
    .lookahead = true,
    .needs_for = oracle_needs,
    .create = [](const ParamSet& p, const SampleInfo& s) -> std::unique_ptr<Policy> {
      return std::make_unique<Oracle>(p, s);
    },
    .attention_source = {},
    .query_head_caches =
        [](const ParamSet& p) {
          if (!p.get_string("match").empty())
            return matched_policy(p.get_string("match"), p.get_string("budget"))
                .query_head_caches();
          return p.get_string("caches") == "query_head";
        },
    .appends_question =
        [](const ParamSet& p) {
          const std::string& match = p.get_string("match");
          return !match.empty() && matched_policy(match, p.get_string("budget")).appends_question();
        },
    .regret_reference_for = [](const ParamSet& p) { return p.get_string("match"); },
});

}  // namespace
}  // namespace kvsim
