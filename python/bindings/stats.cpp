// kvsim.stats: the metrics of `kvsim stats`, as numpy arrays named and shaped as the datasets of
// its results file (docs/outputs.md, "kvsim stats file").
#include "analysis/attention_stats.hpp"
#include "python/bindings/common.hpp"

namespace kvsim::python {

namespace {

py::dict stats(const std::string& trace, const py::object& samples, double epsilon,
               std::vector<double> concentration, std::vector<double> ppci,
               std::vector<double> dap_r, double dap_alpha, std::vector<double> key_quantiles,
               int threads) {
  StatsOptions o;
  o.epsilon = epsilon;
  o.concentration = std::move(concentration);
  o.ppci = std::move(ppci);
  o.dap_r = std::move(dap_r);
  o.dap_alpha = dap_alpha;
  o.key_quantiles = std::move(key_quantiles);
  o.threads = thread_count(threads);
  const auto opened = open_trace(trace);
  const TraceReader& reader = *opened;
  const std::vector<std::string> names =
      samples.is_none() ? reader.sample_names() : samples.cast<std::vector<std::string>>();
  check_samples(reader, names);
  py::dict out;
  for (const auto& name : names) {
    SampleAttentionStats s;
    run_without_gil([&] {
      s = compute_attention_stats(reader, reader.read_sample(name), o, interruption_point);
    });
    py::dict d;
    for (const StatsDataset& ds : stats_datasets(s, o))
      d[ds.name] = to_numpy(*ds.data, {ds.shape.begin(), ds.shape.end()});
    out[py::str(name)] = d;
  }
  return out;
}

}  // namespace

void bind_stats(py::module_& m) {
  const StatsOptions defaults;
  m.def("stats", &stats, py::arg("trace"), py::arg("samples") = py::none(),
        py::arg("epsilon") = defaults.epsilon, py::arg("concentration") = defaults.concentration,
        py::arg("ppci") = defaults.ppci, py::arg("dap_r") = defaults.dap_r,
        py::arg("dap_alpha") = defaults.dap_alpha,
        py::arg("key_quantiles") = defaults.key_quantiles, py::arg("threads") = 0,
        R"doc(The observation metrics of `kvsim stats` (options as its command line), per sample:
{sample: {dataset: float64 numpy array}}, named and shaped as the results file's datasets.)doc");
}

}  // namespace kvsim::python
