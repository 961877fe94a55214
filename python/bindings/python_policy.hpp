// Policies written in Python (subclasses of kvsim.Policy) run inside the C++ engine: an adapter
// Policy calls the object's hooks with handles on the layer's statistics and the cache, which
// expose numpy views (no copies) valid for the duration of the call.
#pragma once

#include <memory>
#include <stdexcept>

#include "policies/policy.hpp"
#include "python/bindings/common.hpp"

namespace kvsim::python {

// A PolicyInfo (needs, factory) for a Python policy object, labelled `label`. The object's
// `needs` attribute (a dict) declares the statistics it reads; its `start(sample)` method, if
// any, is called before each sample.
std::unique_ptr<PolicyInfo> python_policy_info(const std::string& label, pybind11::object obj);

// A PolicyInfo whose instances are made per sample by calling `factory(**parameters)` (the
// resolved ParamSet converted to Python values by type) — what kvsim.register installs.
PolicyInfo registered_python_policy(const std::string& name, pybind11::object factory,
                                    std::vector<ParamSpec> params, const std::string& summary,
                                    const std::string& provenance);

// Whether `obj` is a Python policy (has on_prefill and on_decode).
bool is_python_policy(const pybind11::handle& obj);

void bind_python_policy(pybind11::module_& m);

}  // namespace kvsim::python
