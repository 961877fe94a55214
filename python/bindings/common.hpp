// Pieces every binding file uses: C++ containers to numpy arrays, Python values to kvsim's
// parameter text, and running engine work without the GIL while Ctrl-C still stops it.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace kvsim::python {

namespace py = pybind11;

// A numpy copy of `v` with the given shape (default: 1-D).
template <typename T>
py::array_t<T> to_numpy(const std::vector<T>& v, std::vector<py::ssize_t> shape = {}) {
  if (shape.empty()) shape = {static_cast<py::ssize_t>(v.size())};
  py::array_t<T> out(shape);
  std::copy(v.begin(), v.end(), out.mutable_data());
  return out;
}

// A numpy object array of Python strings (what pandas makes of a text column).
inline py::object to_numpy(const std::vector<std::string>& v) {
  return py::module_::import("numpy").attr("array")(py::cast(v), py::arg("dtype") = "object");
}

// A parameter value as kvsim reads it: booleans as true/false, anything else as str(value).
inline std::string param_text(const py::handle& value) {
  if (py::isinstance<py::bool_>(value)) return value.cast<bool>() ? "true" : "false";
  return py::str(value);
}

// `threads` as the Python calls take it: 0 (or less) means every core.
inline int thread_count(int threads) {
  return threads > 0 ? threads
                     : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// Thrown (as a C++ error, to cross the engine's threads) when Ctrl-C lands in a Python hook.
struct PythonInterrupted : std::runtime_error {
  PythonInterrupted() : std::runtime_error("KeyboardInterrupt") {}
};

// Called by engine work between units (a layer, an item): takes the GIL for a moment and stops
// the work when a signal handler raised (KeyboardInterrupt stays set on this thread).
struct Interrupted {};
inline void interruption_point() {
  py::gil_scoped_acquire acquire;
  if (PyErr_CheckSignals() != 0) throw Interrupted{};
}

// Runs `work` without the GIL; an interruption or a Ctrl-C in a Python policy surfaces as
// KeyboardInterrupt.
template <typename Work>
void run_without_gil(Work&& work) {
  try {
    py::gil_scoped_release release;
    work();
  } catch (const Interrupted&) {
    throw py::error_already_set();
  } catch (const PythonInterrupted&) {
    PyErr_SetNone(PyExc_KeyboardInterrupt);
    throw py::error_already_set();
  }
}

}  // namespace kvsim::python
