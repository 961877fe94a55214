// kvsim._compare, kvsim._compare_seeds and kvsim._summarize: the paired comparisons of `kvsim
// compare`, those over trained models and items, and the means with intervals of the result
// tables, on columns Python passes (kvsim.compare, kvsim.compare_seeds and kvsim.summarize in
// python/kvsim/__init__.py take DataFrames and paths).
#include "analysis/bootstrap.hpp"
#include "analysis/comparison.hpp"
#include "analysis/seed_comparison.hpp"
#include "policies/policy_config.hpp"
#include "python/bindings/common.hpp"

namespace kvsim::python {

namespace {

PairedOptions paired_options(const std::string& metric, const py::object& higher, double alpha,
                             int resamples, std::uint64_t seed) {
  PairedOptions o;
  o.alpha = alpha;
  o.bootstrap.resamples = resamples;
  o.bootstrap.seed = seed;
  if (!higher.is_none()) {
    o.higher_is_better = higher.cast<bool>();
  } else if (const auto known = higher_is_better(metric)) {
    o.higher_is_better = *known;
  } else {
    throw py::value_error("kvsim.compare: say whether a higher " + metric +
                          " is better (higher_is_better=True or False)");
  }
  return o;
}

// The columns of kvsim.compare and kvsim.compare_seeds, one entry per comparison; `memory`, each
// row's memory class, where the comparison has them.
py::dict comparison_columns(const std::vector<PairedComparison>& rows,
                            const std::vector<std::string>* memory = nullptr) {
  std::vector<std::string> label, ref, test, verdict;
  std::vector<std::int64_t> n, wins, ties, losses, family;
  std::vector<double> mean, ref_mean, diff, lo, hi, d, p, holm, detect, smallest;
  for (const PairedComparison& c : rows) {
    label.push_back(c.label), ref.push_back(c.reference);
    test.push_back(c.seeds > 0 ? "crossed_bootstrap" : c.binary ? "mcnemar" : "sign_flip");
    verdict.push_back(c.verdict);
    n.push_back(c.n), wins.push_back(c.wins), ties.push_back(c.ties), losses.push_back(c.losses);
    mean.push_back(c.mean), ref_mean.push_back(c.reference_mean), diff.push_back(c.difference);
    lo.push_back(c.interval.low), hi.push_back(c.interval.high), d.push_back(c.effect_size);
    p.push_back(c.p_value), holm.push_back(c.p_holm), detect.push_back(c.detectable);
    family.push_back(c.family_size), smallest.push_back(c.smallest_p);
  }
  py::dict out;
  out["policy"] = to_numpy(label), out["reference"] = to_numpy(ref);
  out["n"] = to_numpy(n), out["test"] = to_numpy(test);
  out["mean"] = to_numpy(mean), out["reference_mean"] = to_numpy(ref_mean);
  out["difference"] = to_numpy(diff), out["ci_low"] = to_numpy(lo), out["ci_high"] = to_numpy(hi);
  out["wins"] = to_numpy(wins), out["ties"] = to_numpy(ties), out["losses"] = to_numpy(losses);
  out["effect_size"] = to_numpy(d), out["p_value"] = to_numpy(p), out["p_holm"] = to_numpy(holm);
  out["detectable"] = to_numpy(detect), out["verdict"] = to_numpy(verdict);
  if (memory) out["memory"] = to_numpy(*memory);
  out["family_size"] = to_numpy(family), out["smallest_p"] = to_numpy(smallest);
  return out;
}

py::dict compare(const std::vector<std::string>& policy, const std::vector<std::string>& sample,
                 const std::vector<double>& value, const std::vector<double>& weight,
                 const std::string& metric, const std::string& reference,
                 const std::vector<std::string>& policies, const py::object& higher, double alpha,
                 int resamples, std::uint64_t seed, const std::vector<std::string>& budget,
                 bool any_memory) {
  const PairedOptions o = paired_options(metric, higher, alpha, resamples, seed);
  const SampleTable table = per_sample_values(policy, sample, value, weight, true, budget);
  ComparisonTable r;
  try {
    r = compare_to_reference(
        table, metric, reference, policies, o,
        {.any_memory = any_memory, .keeps_everything = label_keeps_everything});
  } catch (const std::invalid_argument& e) {
    throw py::key_error(e.what());
  }
  py::dict out = comparison_columns(r.rows, &r.memory);
  out["skipped"] = py::cast(r.skipped);
  out["higher_is_better"] = o.higher_is_better;
  return out;
}

py::dict summarize_values(const std::vector<std::string>& policy,
                          const std::vector<std::string>& sample, const std::vector<double>& value,
                          const std::vector<double>& weight, int resamples, std::uint64_t seed) {
  const SampleTable table = per_sample_values(policy, sample, value, weight);
  std::vector<std::int64_t> n, seeds;
  std::vector<double> mean, lo, hi, sd;
  for (std::size_t p = 0; p < table.policies.size(); ++p) {
    const MeanSummary s =
        summarize(table, static_cast<int>(p), {.resamples = resamples, .seed = seed});
    n.push_back(s.n), seeds.push_back(table.seeds[p]);
    mean.push_back(s.mean), lo.push_back(s.interval.low), hi.push_back(s.interval.high);
    sd.push_back(s.seed_sd);
  }
  py::dict out;
  out["policy"] = to_numpy(table.policies);
  out["n"] = to_numpy(n), out["seeds"] = to_numpy(seeds), out["mean"] = to_numpy(mean);
  out["ci_low"] = to_numpy(lo), out["ci_high"] = to_numpy(hi), out["seed_sd"] = to_numpy(sd);
  return out;
}

py::dict compare_seeds(const std::vector<std::string>& labels,
                       const std::vector<std::vector<std::vector<double>>>& cells,
                       const std::string& reference,
                       const std::vector<std::vector<double>>& reference_cells,
                       const std::string& metric, const py::object& higher, double alpha,
                       int resamples, std::uint64_t seed) {
  const PairedOptions o = paired_options(metric, higher, alpha, resamples, seed);
  std::vector<SeedItemValues> policies;
  for (std::size_t i = 0; i < labels.size(); ++i) policies.push_back({labels[i], cells.at(i)});
  std::vector<PairedComparison> rows;
  try {
    rows = compare_over_seeds(policies, {reference, reference_cells}, o);
  } catch (const std::invalid_argument& e) {
    throw py::value_error(e.what());
  }
  py::dict out = comparison_columns(rows);
  std::vector<std::int64_t> seeds;
  for (const PairedComparison& c : rows) seeds.push_back(c.seeds);
  out["seeds"] = to_numpy(seeds);
  out["higher_is_better"] = o.higher_is_better;
  return out;
}

py::dict crossed(const std::vector<std::vector<double>>& values, int resamples,
                 std::uint64_t seed) {
  const CrossedBootstrap b = crossed_bootstrap(values, {.resamples = resamples, .seed = seed});
  py::dict out;
  out["seeds"] = b.seeds, out["items"] = b.items, out["mean"] = b.mean;
  out["ci_low"] = b.interval.low, out["ci_high"] = b.interval.high, out["p_value"] = b.p_value;
  return out;
}

}  // namespace

void bind_compare(py::module_& m) {
  m.def("_crossed_bootstrap", &crossed, py::arg("values"), py::arg("resamples"), py::arg("seed"));
  m.def("_compare_seeds", &compare_seeds, py::arg("labels"), py::arg("cells"), py::arg("reference"),
        py::arg("reference_cells"), py::arg("metric"), py::arg("higher_is_better"),
        py::arg("alpha"), py::arg("resamples"), py::arg("seed"));
  m.def("_compare", &compare, py::arg("policy"), py::arg("sample"), py::arg("value"),
        py::arg("weight"), py::arg("metric"), py::arg("reference"), py::arg("policies"),
        py::arg("higher_is_better"), py::arg("alpha"), py::arg("resamples"), py::arg("seed"),
        py::arg("budget"), py::arg("any_memory"));
  m.def("_summarize", &summarize_values, py::arg("policy"), py::arg("sample"), py::arg("value"),
        py::arg("weight"), py::arg("resamples"), py::arg("seed"));
}

}  // namespace kvsim::python
