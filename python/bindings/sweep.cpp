// kvsim._sweep: `kvsim sweep` on one machine (kvsim.sweep in python/kvsim/__init__.py builds its
// arguments and reads OUT/results.csv back as numpy columns).
#include "sim/replay/sweep.hpp"

#include "python/bindings/common.hpp"

namespace kvsim::python {

namespace {

py::dict sweep(const std::vector<std::string>& traces, const std::vector<std::string>& policies,
               const std::vector<std::string>& grids, const std::vector<std::string>& sets,
               const std::string& budget, const std::string& out,
               const std::vector<std::string>& samples, int threads, const py::object& progress,
               int seeds, bool equal_memory) {
  if (traces.empty() || policies.empty())
    throw py::value_error("kvsim.sweep: give at least one trace and one policy");
  const auto configs =
      sweep_configs(policies, grids, sets, budget, {.seeds = seeds, .equal_memory = equal_memory});
  SweepReport r;
  run_without_gil([&] {
    r = run_sweep(traces, configs, {out, thread_count(threads), samples},
                  [&](long done, long total) {
                    interruption_point();
                    if (progress.is_none()) return;
                    py::gil_scoped_acquire gil;
                    try {
                      progress(done, total);
                    } catch (py::error_already_set& e) {
                      throw PythonError(std::move(e), "in the progress callback");
                    }
                  });
  });
  for (const std::string& note : r.notes) warn_python(note);
  py::dict d;
  d["configurations"] = configs.size();
  d["items"] = r.items_total;
  d["done_before"] = r.items_done_before;
  d["run"] = r.items_run;
  d["resumed"] = r.items_resumed;
  return d;
}

}  // namespace

void bind_sweep(py::module_& m) {
  m.def("_sweep", &sweep, py::arg("traces"), py::arg("policies"), py::arg("grids"), py::arg("sets"),
        py::arg("budget"), py::arg("out"), py::arg("samples"), py::arg("threads"),
        py::arg("progress") = py::none(), py::arg("seeds") = 1, py::arg("equal_memory") = false);
}

}  // namespace kvsim::python
