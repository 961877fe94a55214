#include "analysis/comparison.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <stdexcept>

#include "core/csv_format.hpp"
#include "core/run_labels.hpp"

namespace kvsim {

int SampleTable::index(const std::string& policy) const {
  const auto it = std::find(policies.begin(), policies.end(), policy);
  return it == policies.end() ? -1 : static_cast<int>(it - policies.begin());
}

namespace {

// Per (run label, sample): Σ w·v and Σ w over the rows, and the first row's budget; the runs in
// the order they first appear.
struct RunSums {
  std::map<std::pair<std::string, std::string>, std::pair<double, double>> sums;
  std::map<std::pair<std::string, std::string>, std::string> budgets;
  std::vector<std::string> runs;
};

RunSums sum_runs(const std::vector<std::string>& policy, const std::vector<std::string>& sample,
                 const std::vector<double>& value, const std::vector<double>& weight,
                 const std::vector<std::string>& budget) {
  RunSums r;
  for (std::size_t i = 0; i < policy.size(); ++i) {
    if (sample[i] == "all" || std::isnan(value[i])) continue;
    const double w = weight.empty() || std::isnan(weight[i]) ? 1.0 : weight[i];
    auto& s = r.sums[{policy[i], sample[i]}];
    if (!budget.empty()) r.budgets.emplace(std::pair{policy[i], sample[i]}, budget[i]);
    s.first += w * value[i];
    s.second += w;
    if (std::find(r.runs.begin(), r.runs.end(), policy[i]) == r.runs.end())
      r.runs.push_back(policy[i]);
  }
  return r;
}

// A run's budgets, sample by sample ("b1;b2;...;"), standing for its seed group's; "" without any.
std::string run_memory(const RunSums& r, const std::string& run,
                       const std::vector<std::string>& samples) {
  std::string memory;
  bool any = false;
  for (const std::string& sample_name : samples) {
    const auto b = r.budgets.find({run, sample_name});
    if (b != r.budgets.end()) memory += b->second, any = any || !b->second.empty();
    memory += ";";
  }
  return any ? memory : "";
}

}  // namespace

SampleTable per_sample_values(const std::vector<std::string>& policy,
                              const std::vector<std::string>& sample,
                              const std::vector<double>& value, const std::vector<double>& weight,
                              bool pool_seeds, const std::vector<std::string>& budget) {
  if (policy.size() != sample.size() || value.size() != sample.size() ||
      (!weight.empty() && weight.size() != sample.size()) ||
      (!budget.empty() && budget.size() != sample.size()))
    throw std::invalid_argument("compare: the columns differ in length");
  const RunSums r = sum_runs(policy, sample, value, weight, budget);
  SampleTable t;
  for (const auto& [key, _] : r.sums)
    if (std::find(t.samples.begin(), t.samples.end(), key.second) == t.samples.end())
      t.samples.push_back(key.second);
  std::sort(t.samples.begin(), t.samples.end());
  std::map<std::string, std::size_t> sample_index;
  for (std::size_t i = 0; i < t.samples.size(); ++i) sample_index[t.samples[i]] = i;
  // A seed group's value on a sample: the mean over its runs that have one.
  std::vector<std::vector<double>> total, count;
  for (const std::string& run : r.runs) {
    const std::string group = pool_seeds ? seed_group_of(run) : "";
    const std::string name = group.empty() ? run : group;
    int p = t.index(name);
    if (p < 0) {
      p = static_cast<int>(t.policies.size());
      t.policies.push_back(name);
      t.seeds.push_back(0);
      t.memory.push_back(run_memory(r, run, t.samples));  // the group's first run's budgets
      total.emplace_back(t.samples.size(), 0.0);
      count.emplace_back(t.samples.size(), 0.0);
    }
    ++t.seeds[p];
    double run_total = 0, run_count = 0;
    for (const auto& [key, s] : r.sums) {
      if (key.first != run || s.second <= 0) continue;
      const std::size_t j = sample_index.at(key.second);
      total[p][j] += s.first / s.second;
      count[p][j] += 1;
      run_total += s.first / s.second;
      run_count += 1;
    }
    if (t.run_means.size() <= static_cast<std::size_t>(p)) t.run_means.resize(p + 1);
    t.run_means[p].push_back(run_count > 0 ? run_total / run_count : NAN);
  }
  for (std::size_t p = 0; p < t.policies.size(); ++p) {
    t.values.emplace_back(t.samples.size(), NAN);
    for (std::size_t j = 0; j < t.samples.size(); ++j)
      if (count[p][j] > 0) t.values[p][j] = total[p][j] / count[p][j];
  }
  return t;
}

MeanSummary summarize(const SampleTable& table, int policy, const BootstrapOptions& options) {
  MeanSummary out;
  if (policy < 0) return out;  // no value in the table
  std::vector<double> values;
  for (double v : table.values.at(policy))
    if (!std::isnan(v)) values.push_back(v);
  out.n = static_cast<long>(values.size());
  out.mean = mean_sd(values).mean;
  out.interval = bootstrap_mean(values, options);
  if (table.seeds.at(policy) > 1) out.seed_sd = mean_sd(table.run_means.at(policy)).sd;
  return out;
}

std::optional<bool> higher_is_better(const std::string& metric) {
  auto has = [&](const char* word) { return metric.find(word) != std::string::npos; };
  for (const char* lower : {"error", "kl", "nll", "ppl", "miss", "evicted", "regret", "bytes",
                            "cache_size", "kv_fraction", "ms_per_token"})
    if (has(lower)) return false;
  for (const char* higher : {"recall", "answer", "accuracy", "agree", "match", "hit_", "overlap",
                             "loglik", "contains", "exact"})
    if (has(higher)) return true;
  return std::nullopt;
}

namespace {

// "budget 40", or "budget 38 to 49 by sample", from a memory signature ("40;40;;41;").
std::string budget_class(const std::string& signature) {
  std::vector<std::string> values;
  std::stringstream entries(signature);
  for (std::string v; std::getline(entries, v, ';');)
    if (!v.empty()) values.push_back(v);
  const auto [lo, hi] = std::minmax_element(
      values.begin(), values.end(), [](const std::string& a, const std::string& b) {
        return std::strtod(a.c_str(), nullptr) < std::strtod(b.c_str(), nullptr);
      });
  return *lo == *hi ? "budget " + *lo : "budget " + *lo + " to " + *hi + " by sample";
}

// What a row held, for grouping rows into comparisons and Holm families: its per-sample budgets,
// or the cache of a policy that keeps every entry or sizes itself; unknown when the table has no
// budget at all.
struct MemoryClass {
  enum class Kind { unknown, budget, keeps_everything, sizes_itself } kind = Kind::unknown;
  std::string budgets;  // the signature "40;40;..." of a budgeted row

  bool operator==(const MemoryClass&) const = default;
  std::string describe() const {
    switch (kind) {
      case Kind::unknown:
        return "memory not in the table";
      case Kind::budget:
        return budget_class(budgets);
      case Kind::keeps_everything:
        return "keeps everything";
      case Kind::sizes_itself:
        return "sizes itself";
    }
    return "";
  }
};

bool is_full_label(const std::string& label) {
  return label.substr(0, label.find('@')) == "full";
}

// The smallest two-sided p the comparison's test can give with n pairs: 2^(1-n) for McNemar's
// exact test and the exact sign-flip test (every pair one way), 1 / (1 + draws) when drawn.
double smallest_possible_p(const PairedComparison& c, const PairedOptions& o) {
  if (!c.binary && c.n > o.exact_up_to) return 1.0 / (1.0 + o.permutations);
  return std::pow(2.0, 1.0 - static_cast<double>(c.n));
}

// (z_{1−α/(2m)} + z_power) / (z_{1−α/2} + z_power): how much larger a difference must be to have
// the same power at Holm's first step in a family of m as at α alone.
double holm_power_scale(std::size_t m, const PairedOptions& o) {
  const double z_power = normal_quantile(o.power);
  return (normal_quantile(1 - o.alpha / (2.0 * static_cast<double>(m))) + z_power) /
         (normal_quantile(1 - o.alpha / 2) + z_power);
}

// Holm within each memory class: a family never mixes rows that held different memory.
void holm_within_memory_classes(ComparisonTable& out, const std::vector<MemoryClass>& family_keys,
                                const PairedOptions& options) {
  std::vector<MemoryClass> done;
  for (const MemoryClass& k : family_keys) {
    if (std::find(done.begin(), done.end(), k) != done.end()) continue;
    done.push_back(k);
    std::vector<PairedComparison> family;
    for (std::size_t i = 0; i < out.rows.size(); ++i)
      if (family_keys[i] == k) family.push_back(out.rows[i]);
    holm_adjust(family, options);
    const double first_step = options.alpha / static_cast<double>(family.size());
    for (std::size_t i = 0, f = 0; i < out.rows.size(); ++i) {
      if (family_keys[i] != k) continue;
      out.rows[i] = family[f++];
      out.rows[i].smallest_p = smallest_possible_p(out.rows[i], options);
      out.rows[i].family_size = static_cast<long>(family.size());
      // No difference can be shown: a "detectable" figure would promise what the test cannot do.
      if (!(out.rows[i].smallest_p < first_step)) out.rows[i].detectable = NAN;
      // Power at Holm's level: the figure compare_paired gives at alpha, restated for the
      // first step (alpha / m) that any verdict of the family must pass.
      out.rows[i].detectable *= holm_power_scale(family.size(), options);
    }
  }
}

}  // namespace

ComparisonTable compare_to_reference(const SampleTable& table, const std::string& metric,
                                     const std::string& reference,
                                     const std::vector<std::string>& policies,
                                     const PairedOptions& options, const CompareScope& scope) {
  auto known = [&] {
    std::string s;
    for (const auto& p : table.policies) s += (s.empty() ? "" : ", ") + p;
    return s;
  };
  const int ref = table.index(reference);
  if (ref < 0)
    throw std::invalid_argument("compare: no reference '" + reference + "' among the policies (" +
                                known() + ")");
  const auto keeps = scope.keeps_everything ? scope.keeps_everything : is_full_label;
  // Without any budget in the table nothing says what was held: one class, as given.
  const bool memory_known =
      std::any_of(table.memory.begin(), table.memory.end(), [](auto& m) { return !m.empty(); });
  using Kind = MemoryClass::Kind;
  auto key = [&](int p) -> MemoryClass {
    if (!memory_known) return {};
    if (!table.memory[p].empty()) return {Kind::budget, table.memory[p]};
    return {keeps(table.policies[p]) ? Kind::keeps_everything : Kind::sizes_itself, ""};
  };
  const MemoryClass ref_key = key(ref);
  const bool ref_budgeted = memory_known && !table.memory[ref].empty();
  const bool ref_full = memory_known && !ref_budgeted && keeps(reference);
  if (memory_known && !ref_budgeted && !ref_full && !scope.any_memory)
    throw std::invalid_argument("compare: the reference '" + reference +
                                "' sizes its own cache, so no other row held its memory; compare "
                                "against a budgeted policy or the full cache, or give "
                                "--any-memory (any_memory=True) to compare across memory");
  ComparisonTable out{metric, reference, options.higher_is_better, {}, {}, {}};
  std::vector<std::string> names = policies;
  if (names.empty())
    for (const auto& p : table.policies)
      if (p != reference) names.push_back(p);
  std::vector<MemoryClass> family_keys;
  for (const std::string& name : names) {
    const int p = table.index(name);
    if (p < 0)
      throw std::invalid_argument("compare: no policy '" + name + "' (the table has: " + known() +
                                  ")");
    if (p == ref) continue;
    if (ref_budgeted && key(p) != ref_key && !scope.any_memory) {
      const std::string why = name + " (" + key(p).describe() + ")";
      if (!policies.empty())
        throw std::invalid_argument("compare: " + why +
                                    " did not hold the memory of the "
                                    "reference " +
                                    reference + " (" + ref_key.describe() +
                                    "); give --any-memory (any_memory=True) to compare anyway");
      out.skipped.push_back(why);
      continue;
    }
    out.rows.push_back(
        compare_paired(name, table.values[p], reference, table.values[ref], options));
    out.memory.push_back(key(p).describe());
    family_keys.push_back(key(p));
  }
  holm_within_memory_classes(out, family_keys, options);
  return out;
}

namespace {

std::string number(double x, const char* format = "%.9g") {
  if (std::isnan(x)) return "";
  char s[48];
  std::snprintf(s, sizeof s, format, x);
  return s;
}

}  // namespace

std::string comparison_csv(const ComparisonTable& t) {
  std::string out =
      "policy,reference,metric,higher_is_better,n,test,mean,reference_mean,difference,ci_low,"
      "ci_high,wins,ties,losses,effect_size,p_value,p_holm,detectable,verdict,memory,"
      "family_size,smallest_p\n";
  for (std::size_t i = 0; i < t.rows.size(); ++i) {
    const PairedComparison& c = t.rows[i];
    out += csv_quote(c.label) + "," + csv_quote(c.reference) + "," + csv_quote(t.metric) + "," +
           (t.higher_is_better ? "1" : "0") + "," + std::to_string(c.n) + "," +
           (c.binary ? "mcnemar" : "sign_flip");
    for (double x : {c.mean, c.reference_mean, c.difference, c.interval.low, c.interval.high})
      out += "," + number(x);
    out += "," + std::to_string(c.wins) + "," + std::to_string(c.ties) + "," +
           std::to_string(c.losses);
    for (double x : {c.effect_size, c.p_value, c.p_holm, c.detectable}) out += "," + number(x);
    out += "," + c.verdict + "," + csv_quote(t.memory[i]) + "," + std::to_string(c.family_size) +
           "," + number(c.smallest_p) + "\n";
  }
  return out;
}

namespace {

std::string comparison_row(const PairedComparison& c, std::size_t width) {
  const std::string interval =
      c.interval.valid() ? number(c.interval.low, "%.4f") + " to " + number(c.interval.high, "%.4f")
                         : "-";
  const std::string wtl =
      std::to_string(c.wins) + "/" + std::to_string(c.ties) + "/" + std::to_string(c.losses);
  char line[512];
  std::snprintf(
      line, sizeof line, "%-*s %5ld %9.4f %9.4f %+9.4f %21s %13s %7s %9.3g %9.3g %10s  %s\n",
      static_cast<int>(width), c.label.c_str(), c.n, c.mean, c.reference_mean, c.difference,
      interval.c_str(), wtl.c_str(),
      std::isnan(c.effect_size) ? "-" : number(c.effect_size, "%+.2f").c_str(), c.p_value, c.p_holm,
      std::isnan(c.detectable) ? "-" : number(c.detectable, "%.4f").c_str(), c.verdict.c_str());
  return line;
}

// The line under a memory class whose test cannot reach alpha: what n allows, and why.
std::string unreachable_note(const std::vector<const PairedComparison*>& family,
                             const PairedOptions& o) {
  long n = 0;
  double smallest = 1;
  for (const PairedComparison* c : family)
    if (c->smallest_p < smallest || n == 0) n = c->n, smallest = c->smallest_p;
  const double first_step = o.alpha / static_cast<double>(family.size());
  if (smallest < first_step) return "";
  char line[320];
  std::snprintf(line, sizeof line,
                "  with n = %ld the smallest possible p is %.3g, not below alpha / %zu = %.3g "
                "(Holm's first step): no difference can be shown here, whatever the values; "
                "more samples are needed\n",
                n, smallest, family.size(), first_step);
  return line;
}

}  // namespace

std::string comparison_text(const ComparisonTable& t, const PairedOptions& options) {
  std::size_t w = 14;
  for (const auto& c : t.rows) w = std::max(w, c.label.size());
  std::vector<std::string> classes;  // in order of first appearance
  for (const std::string& m : t.memory)
    if (std::find(classes.begin(), classes.end(), m) == classes.end()) classes.push_back(m);
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line,
                "%s (%s is better) against %s: paired over samples, 95%% bootstrap interval of "
                "the difference, Holm at alpha %.3g within each memory class (%zu comparison(s) "
                "in %zu class(es))\n",
                t.metric.c_str(), t.higher_is_better ? "higher" : "lower", t.reference.c_str(),
                options.alpha, t.rows.size(), classes.size());
  out += line;
  std::snprintf(line, sizeof line, "%-*s %5s %9s %9s %9s %21s %13s %7s %9s %9s %10s  %s\n",
                static_cast<int>(w), "policy", "n", "mean", "ref", "diff", "diff_95%",
                "win/tie/loss", "d_z", "p", "p_holm", "detectable", "verdict");
  out += line;
  for (const std::string& m : classes) {
    std::vector<const PairedComparison*> family;
    for (std::size_t i = 0; i < t.rows.size(); ++i)
      if (t.memory[i] == m) family.push_back(&t.rows[i]);
    if (!m.empty())
      out += "[" + m + ": " + std::to_string(family.size()) + " comparison(s), one Holm family]\n";
    for (const PairedComparison* c : family) out += comparison_row(*c, w);
    out += unreachable_note(family, options);
  }
  if (t.rows.empty()) out += "(no row held the reference's memory: nothing to compare)\n";
  if (!t.skipped.empty()) {
    out += "not compared, another memory than the reference's (--any-memory compares them):";
    for (std::size_t i = 0; i < t.skipped.size(); ++i) out += (i ? ", " : " ") + t.skipped[i];
    out += "\n";
  }
  out +=
      "verdict: better / worse than the reference where Holm's adjusted p < alpha, else no "
      "difference shown (never an order); detectable: the difference n samples detect with 80% "
      "power at Holm's first step, alpha / family size ('-' where the test cannot reach it)\n";
  return out;
}

}  // namespace kvsim
