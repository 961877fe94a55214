// The `kvsim` Python module's C++ half (`kvsim._kvsim`): traces as numpy arrays, replay results
// as numpy columns, the policy registry. The pure-Python package (python/kvsim/) re-exports it.
#include <pybind11/pybind11.h>

#include "python/bindings/common.hpp"
#include "sim/run/output_guard.hpp"

namespace py = pybind11;

namespace kvsim::python {
void bind_trace(py::module_& m);
void bind_replay(py::module_& m);
void bind_policies(py::module_& m);
void bind_python_policy(py::module_& m);
void bind_write(py::module_& m);
void bind_stats(py::module_& m);
void bind_sweep(py::module_& m);
void bind_compare(py::module_& m);
void bind_compact(py::module_& m);
void bind_attention(py::module_& m);
}  // namespace kvsim::python

PYBIND11_MODULE(_kvsim, m) {
  m.doc() = "kvsim: KV-cache eviction policies of multimodal LLMs, replayed on attention traces";
  m.attr("__version__") = KVSIM_VERSION;
  kvsim::python::bind_trace(m);
  kvsim::python::bind_replay(m);
  kvsim::python::bind_policies(m);
  kvsim::python::bind_python_policy(m);
  kvsim::python::bind_write(m);
  kvsim::python::bind_stats(m);
  kvsim::python::bind_sweep(m);
  kvsim::python::bind_compare(m);
  kvsim::python::bind_compact(m);
  kvsim::python::bind_attention(m);
  // The user's own exception from a Python policy, raised as itself; an output in the way of an
  // input or of a trace (sim/run/output_guard.hpp) as FileExistsError.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const kvsim::OutputConflict& e) {
      PyErr_SetString(PyExc_FileExistsError, e.what());
    } catch (kvsim::python::PythonError& e) {
      py::object value = e.error.value();
      if (py::hasattr(value, "add_note")) value.attr("add_note")(e.where);
      e.error.restore();
    }
  });
}
