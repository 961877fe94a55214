// kvsim.replay: the engine of `kvsim replay`, returning its per-step results as a dict of numpy
// columns named and ordered as the columns of `kvsim replay --out` (rows in the same order), with
// the same float32 values (the CSV prints them with %.9g, which round-trips float32 exactly).
// Empty CSV cells are NaN. The GIL is released while the engine works; Ctrl-C (KeyboardInterrupt)
// is checked after every layer and stops the replay with the exception.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <thread>

#include "sim/engine.hpp"
#include "sim/params.hpp"

namespace py = pybind11;

namespace kvsim::python {

namespace {

// One column per CSV column, filled in CSV row order.
struct Columns {
  std::vector<std::string> policy, sample;
  std::vector<std::int64_t> layer, kv_head, step, position, cache_size, attended_size, kv_bytes;
  std::vector<float> mass_recall, output_rel_error, output_value_error, hit_rate_top10,
      hit_rate_mass90, evicted_mass, cumulative_evicted_mass, regret;
  std::vector<double> misses_top10;  // NaN where the CSV cell is empty

  void add(const std::string& label, const LayerResult& r) {
    for (std::size_t g = 0; g < r.steps.size(); ++g)
      for (std::size_t t = 0; t < r.steps[g].size(); ++t) {
        const StepMetrics& m = r.steps[g][t];
        policy.push_back(label), sample.push_back(r.sample);
        layer.push_back(r.layer), kv_head.push_back(g), step.push_back(t);
        position.push_back(m.position), cache_size.push_back(m.cache_size);
        attended_size.push_back(m.attended_size), kv_bytes.push_back(m.kv_bytes);
        mass_recall.push_back(m.mass_recall), output_rel_error.push_back(m.output_rel_error);
        output_value_error.push_back(m.output_value_error), hit_rate_top10.push_back(m.hit_top);
        hit_rate_mass90.push_back(m.hit_mass90);
        misses_top10.push_back(m.misses_top >= 0 ? m.misses_top : NAN);
        evicted_mass.push_back(m.evicted_mass);
        cumulative_evicted_mass.push_back(m.cumulative_evicted_mass), regret.push_back(m.regret);
      }
  }

  template <typename T>
  static py::array_t<T> array(const std::vector<T>& v) {
    py::array_t<T> out(static_cast<py::ssize_t>(v.size()));
    std::copy(v.begin(), v.end(), out.mutable_data());
    return out;
  }

  static py::object strings(const std::vector<std::string>& v) {
    return py::module_::import("numpy").attr("array")(py::cast(v), py::arg("dtype") = "object");
  }

  py::dict to_dict() const {
    py::dict d;
    d["policy"] = strings(policy);
    d["sample"] = strings(sample);
    d["layer"] = array(layer), d["kv_head"] = array(kv_head), d["step"] = array(step);
    d["position"] = array(position), d["cache_size"] = array(cache_size);
    d["attended_size"] = array(attended_size), d["mass_recall"] = array(mass_recall);
    d["output_rel_error"] = array(output_rel_error);
    d["output_value_error"] = array(output_value_error), d["kv_bytes"] = array(kv_bytes);
    d["hit_rate_top10"] = array(hit_rate_top10), d["hit_rate_mass90"] = array(hit_rate_mass90);
    d["misses_top10"] = array(misses_top10), d["evicted_mass"] = array(evicted_mass);
    d["cumulative_evicted_mass"] = array(cumulative_evicted_mass), d["regret"] = array(regret);
    return d;
  }
};

// `policies`: a name (policy or preset), a list of names, or a dict name -> {key: value}.
std::vector<std::pair<std::string, std::map<std::string, std::string>>> policy_list(
    const py::object& policies) {
  std::vector<std::pair<std::string, std::map<std::string, std::string>>> out;
  if (py::isinstance<py::str>(policies)) {
    out.emplace_back(policies.cast<std::string>(), std::map<std::string, std::string>{});
  } else if (py::isinstance<py::dict>(policies)) {
    for (const auto& [name, params] : policies.cast<py::dict>()) {
      std::map<std::string, std::string> values;
      if (!params.is_none())
        for (const auto& [key, value] : params.cast<py::dict>())
          values[py::str(key)] = py::isinstance<py::bool_>(value)
                                     ? (value.cast<bool>() ? "true" : "false")
                                     : std::string(py::str(value));
      out.emplace_back(py::str(name), values);
    }
  } else {
    for (const auto& name : policies)
      out.emplace_back(py::str(name), std::map<std::string, std::string>{});
  }
  if (out.empty()) throw py::value_error("kvsim.replay: no policy given");
  return out;
}

py::dict replay(const std::string& trace, const py::object& policies, const py::object& samples,
                int threads, const std::string& budget, bool diagnostics) {
  std::vector<PolicyConfig> configs;
  for (auto& [name, params] : policy_list(policies)) {
    for (const auto& c : configs)
      if (c.label == name) throw py::value_error("kvsim.replay: policy '" + name + "' given twice");
    if (!budget.empty()) apply_default_budget(name, budget, params);
    configs.push_back(make_policy_config(name, params));
  }
  const TraceReader reader(trace);
  std::vector<std::string> names =
      samples.is_none() ? reader.sample_names() : samples.cast<std::vector<std::string>>();
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  Replayer replayer(reader, configs, ReplayOptions{.threads = threads, .diagnostics = diagnostics});
  Columns columns;
  struct Interrupted {};  // the Python error (KeyboardInterrupt) stays set on this thread
  try {
    py::gil_scoped_release release;
    for (const auto& s : names)
      replayer.replay_sample(
          s, [&](const LayerResult& r) { columns.add(configs[r.policy_index].label, r); },
          [&](int) {
            py::gil_scoped_acquire acquire;
            if (PyErr_CheckSignals() != 0) throw Interrupted{};
          });
  } catch (const Interrupted&) {
    throw py::error_already_set();
  }
  return columns.to_dict();
}

}  // namespace

void bind_replay(py::module_& m) {
  m.def("replay", &replay, py::arg("trace"), py::arg("policies"), py::arg("samples") = py::none(),
        py::arg("threads") = 0, py::arg("budget") = "", py::arg("diagnostics") = false,
        R"doc(Replays samples of a trace through policies, as `kvsim replay --out` does.

policies: a policy or preset name, a list of names, or a dict name -> {parameter: value}.
samples: names (default: every sample). threads: 0 = all cores (results do not depend on it).
budget: for every policy that declares one and is given none (like --budget).
diagnostics: also fill the hit-rate, miss and evicted-mass columns (like --diagnostics).
Returns a dict of numpy columns named as the CSV's; pandas.DataFrame(result) is the CSV.)doc");
}

}  // namespace kvsim::python
