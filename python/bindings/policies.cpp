// kvsim.policies() / kvsim.presets(): the registry as `kvsim policies` prints it, as data.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "policies/policy.hpp"

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
}

}  // namespace kvsim::python
