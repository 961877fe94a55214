// kvsim.policies() / kvsim.presets(): the registry as `kvsim policies` prints it, as data; the
// budget rule and the selectors, for policies written in Python.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>

#include "policies/policy.hpp"
#include "policies/selection.hpp"
#include "python/bindings/common.hpp"

namespace py = pybind11;

namespace kvsim::python {

namespace {

py::dict param_dict(const ParamSpec& s) {
  py::dict d;
  d["name"] = s.name;
  d["type"] = param_type_name(s);
  d["default"] = s.default_value;
  d["doc"] = s.doc;
  if (s.type == ParamType::kInt || s.type == ParamType::kFloat) {
    d["min"] = s.min;
    d["max"] = s.max;
  }
  if (!s.choices.empty()) d["choices"] = s.choices;
  return d;
}

py::list policies() {
  py::list out;
  for (const auto& name : PolicyRegistry::instance().names()) {
    const PolicyInfo& p = PolicyRegistry::instance().get(name);
    py::dict d;
    d["name"] = p.name;
    d["summary"] = p.summary;
    d["provenance"] = p.provenance;
    d["lookahead"] = p.lookahead;
    d["merges"] = p.merges || static_cast<bool>(p.merges_for);  // may merge
    py::list params;
    for (const auto& s : p.params) params.append(param_dict(s));
    d["params"] = params;
    out.append(d);
  }
  return out;
}

py::list presets() {
  py::list out;
  for (const auto& preset : policy_presets()) {
    py::dict d;
    d["name"] = preset.name;
    d["policy"] = preset.policy;
    d["summary"] = preset.summary;
    d["provenance"] = preset.provenance;
    d["params"] = make_policy_config(preset.name, {}).params.values();
    out.append(d);
  }
  return out;
}

}  // namespace

void bind_policies(py::module_& m) {
  m.def("policies", &policies,
        "Every registered policy: name, summary, provenance, lookahead, merges and its "
        "parameters (name, type, default, doc, and min/max or choices where they apply).");
  m.def("presets", &presets,
        "Every preset: name, the policy it configures, summary, provenance and its fully "
        "resolved parameters.");
  m.def(
      "_select",
      [](const std::vector<std::vector<double>>& scores, int keep, int sinks, int window,
         double alpha) {
        std::vector<std::vector<std::uint8_t>> forced;
        for (std::size_t g = 0; g < scores.size(); ++g) {
          for (double x : scores[g])
            if (std::isnan(x))
              throw py::value_error("score() gave NaN for KV head " + std::to_string(g));
          forced.push_back(sink_and_recent_mask(static_cast<int>(scores[g].size()), sinks, window));
        }
        py::list out;
        for (const auto& k : keep_by_scores(scores, keep, alpha, forced)) out.append(to_numpy(k));
        return out;
      },
      py::arg("scores"), py::arg("keep"), py::arg("sinks"), py::arg("window"), py::arg("alpha"),
      "kvsim.ScorerPolicy's selection, by the C++ selectors (policies/selection.hpp): per KV head "
      "a keep flag per entry. alpha < 0: each head keeps its `keep` best; else head-adaptive.");
  m.def(
      "resolve_budget",
      [](const std::string& budget, int prompt_len, const std::string& rounding) {
        if (prompt_len < 0) throw py::value_error("resolve_budget: prompt_len must be >= 0");
        return Size::parse(budget).resolve(prompt_len, parse_rounding(rounding));
      },
      py::arg("budget"), py::arg("prompt_len"), py::arg("rounding") = "ceil",
      "The entries a budget keeps on a prompt of prompt_len tokens, as every policy resolves it: "
      "a count ('128'), a percentage rounded by `rounding` (a policy's budget_rounding: ceil, "
      "'20%' of 640 = 128; floor; round; kvpress, 127), or kvpress's compression ratio "
      "('compression_ratio:0.8' keeps int(P * (1 - 0.8))). ValueError when it is none of these.");
}

}  // namespace kvsim::python
