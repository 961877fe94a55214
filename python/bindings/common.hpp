// Pieces every binding file uses: C++ containers to numpy arrays, Python values to kvsim's
// parameter text, and running engine work without the GIL while Ctrl-C still stops it.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "core/blas_threads.hpp"
#include "traces/kvtrace.hpp"

namespace kvsim::python {

namespace py = pybind11;

// kvsim's output guard (sim/run/output_guard.hpp) with Python's errors: FileExistsError for a
// conflict, OSError where an output cannot be written. outputs: (path, option, kind), kind
// "result", "trace" or "prompts"; inputs: (path, role).
void check_outputs_py(const std::vector<std::tuple<std::string, std::string, std::string>>& outputs,
                      const std::vector<std::pair<std::string, std::string>>& inputs, bool force);

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

// A trace opened for Python: FileNotFoundError when the path does not exist (other errors, which
// name the file and dataset, stay RuntimeError).
inline std::shared_ptr<TraceReader> open_trace(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    PyErr_SetObject(PyExc_FileNotFoundError,
                    py::make_tuple(2, "no such kvtrace file", path).ptr());  // errno ENOENT
    throw py::error_already_set();
  }
  return std::make_shared<TraceReader>(path);
}

// KeyError naming the sample and the trace's samples, unless every name is in the trace.
inline void check_samples(const TraceReader& reader, const std::vector<std::string>& names) {
  const std::vector<std::string> known = reader.sample_names();
  for (const auto& name : names) {
    if (std::find(known.begin(), known.end(), name) != known.end()) continue;
    std::string list;
    for (std::size_t i = 0; i < known.size() && i < 20; ++i)
      list += (i ? ", '" : "'") + known[i] + "'";
    if (known.size() > 20) list += ", ... (" + std::to_string(known.size()) + " in all)";
    throw py::key_error(reader.path() + ": no sample '" + name + "'; it has " + list);
  }
}

// A warning the command line prints as "kvsim: warning: TEXT", given to Python as a UserWarning
// attributed to the caller of the kvsim function (a leading "warning: " is dropped; "" is none).
inline void warn_python(std::string text) {
  if (text.empty()) return;
  if (text.rfind("warning: ", 0) == 0) text.erase(0, 9);
  if (PyErr_WarnEx(PyExc_UserWarning, text.c_str(), 2) < 0) throw py::error_already_set();
}

// An exception raised by the user's Python code inside the engine, carried across the engine's
// threads as a C++ error and raised again in Python as itself (its type and traceback, so that a
// debugger lands in the user's code), with `where` added as a note.
struct PythonError : std::runtime_error {
  PythonError(py::error_already_set e, const std::string& where)
      : std::runtime_error(where + ": " + e.what()), error(std::move(e)), where(where) {}
  py::error_already_set error;
  std::string where;
};

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

// Runs `work` without the GIL, and gives the process back its OpenBLAS thread count after it;
// an interruption or a Ctrl-C in a Python policy surfaces as KeyboardInterrupt.
template <typename Work>
void run_without_gil(Work&& work) {
  try {
    BlasThreadsRestored blas;
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
