// Compact traces from Python: `compact_trace` converts a file (kvsim compact), and
// `prompt_statistics` computes one layer's stored statistics from its prompt rows as they are
// captured (kvsim.capture writes compact traces with it, without keeping the prompt queries).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>

#include "policies/policy.hpp"
#include "python/bindings/common.hpp"
#include "sim/run/compact_trace.hpp"
#include "traces/kvtrace.hpp"

namespace py = pybind11;

namespace kvsim::python {

namespace {

xt::xtensor<float, 3> rows_of(const py::handle& obj, const char* name, std::size_t rows) {
  const auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(obj);
  if (!a || a.ndim() != 3 || static_cast<std::size_t>(a.shape(0)) < rows)
    throw py::value_error(std::string("kvsim.prompt_statistics: '") + name +
                          "' must be [rows, heads, d] with at least prompt_len rows");
  xt::xtensor<float, 3> t = xt::empty<float>(
      {rows, static_cast<std::size_t>(a.shape(1)), static_cast<std::size_t>(a.shape(2))});
  std::copy(a.data(), a.data() + t.size(), t.begin());
  return t;
}

py::array_t<float> array_of(const std::vector<float>& v, std::size_t rows, std::size_t cols) {
  py::array_t<float> a(rows == 0 ? std::vector<std::size_t>{cols}
                                 : std::vector<std::size_t>{rows, cols});
  std::copy(v.begin(), v.end(), a.mutable_data());
  return a;
}

// The stored statistics of one layer (traces/kvtrace-v1.md, "Compact traces") from its prompt's
// q [P, H, d] and k [P, Hkv, d], as the file will store them (round to float16 first for a
// float16 file).
py::dict prompt_statistics(const py::handle& q, const py::handle& k, const py::handle& modality,
                           int question_len, double scale, bool entropies, int window,
                           const std::string& dtype, int threads) {
  if (dtype != "float16" && dtype != "float32")
    throw py::value_error("kvsim.prompt_statistics: dtype '" + dtype +
                          "': expected float16 or float32");
  const auto mod =
      py::array_t<std::uint8_t, py::array::c_style | py::array::forcecast>::ensure(modality);
  if (!mod || mod.ndim() != 1) throw py::value_error("kvsim.prompt_statistics: modality [P]");
  const int P = static_cast<int>(mod.shape(0));
  LayerTensors t;
  t.q = rows_of(q, "q", P);
  t.k = rows_of(k, "k", P);
  TraceInfo info;
  info.num_layers = 1;
  info.num_heads = static_cast<int>(t.q.shape(1));
  info.num_kv_heads = static_cast<int>(t.k.shape(1));
  info.head_dim = static_cast<int>(t.q.shape(2));
  if (info.num_kv_heads < 1 || info.num_heads % info.num_kv_heads != 0 ||
      t.k.shape(2) != t.q.shape(2))
    throw py::value_error("kvsim.prompt_statistics: q and k shapes do not match");
  info.scale = scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(info.head_dim));
  SampleInfo s;
  s.name = "layer";
  s.prompt_len = P;
  s.modality.assign(mod.data(), mod.data() + P);
  s.segment.assign(P, 1);
  s.question_len = question_len;
  s.dtype = dtype == "float16" ? DType::kFloat16 : DType::kFloat32;  // the rounded column sums
  if (question_len >= P) throw py::value_error("kvsim.prompt_statistics: question_len >= P");
  StoredPromptStats stats;
  {
    BlasThreadsRestored blas;  // PyTorch in this process keeps its OpenBLAS threads
    py::gil_scoped_release release;
    stats = prompt_stats_of_layer(info, s, t, entropies, thread_count(threads));
  }
  const std::size_t H = info.num_heads;
  auto part = [&](int len) {
    const StoredPromptStats::Prompt& p = stats.prompt(len, "prompt statistics");
    py::dict d;
    d["column_sums"] = array_of(p.column_sums, H, len);
    d["column_sums_rounded"] = array_of(p.column_sums_rounded, H, len);
    d["text_column_sums"] = array_of(p.text_column_sums, 0, len);
    d["text_column_max"] = array_of(p.text_column_max, 0, len);
    return d;
  };
  py::dict out;
  out["prompt"] = part(P);
  const int question = question_length(s);
  if (question > 0) out["context"] = part(P - question);
  if (entropies)
    out["entropies"] =
        py::cast(std::vector<double>(stats.entropies.begin(), stats.entropies.end()));
  out["context_len"] = question > 0 ? P - question : 0;
  out["first_row"] = compact_first_row(s, window);
  return out;
}

}  // namespace

void bind_compact(py::module_& m) {
  // The version a compact trace written now carries (kvtrace-v1.md, "Compact traces").
  m.attr("COMPACT_TRACE_VERSION") = kCompactTraceVersion;
  m.def(
      "compact_trace",
      [](const std::string& trace, const std::string& out, int window, bool entropies, int threads,
         bool force) {
        const TraceReader reader(trace);
        check_outputs_py({{out, "out", "trace"}}, {{trace, "trace"}}, force);
        BlasThreadsRestored blas;
        py::gil_scoped_release release;
        write_compact_trace(reader, out,
                            CompactOptions{.window = window,
                                           .entropies = entropies,
                                           .window_widths = default_window_widths(window),
                                           .threads = thread_count(threads)});
      },
      py::arg("trace"), py::arg("out"), py::arg("window") = 64, py::arg("entropies") = true,
      py::arg("threads") = 0, py::arg("force") = false,
      R"doc(Writes a compact copy of a kvtrace file (as `kvsim compact`): the prompt statistics
replay computes in place of the prompt queries, which it keeps only for windows up to `window`
rows, and the window statistics of the widths the policies and presets read at their defaults;
entropies=False leaves out MEDA's entropies; threads=0 uses every core (the file does not
depend on it). Replay of it gives the full trace's results. An existing trace at `out` is replaced
only with force=True; `out` is never `trace` (FileExistsError).)doc");
  m.def("prompt_statistics", &prompt_statistics, py::arg("q"), py::arg("k"), py::arg("modality"),
        py::arg("question_len") = -1, py::arg("scale") = 0.0, py::arg("entropies") = true,
        py::arg("window") = 64, py::arg("dtype") = "float16", py::arg("threads") = 0,
        R"doc(One layer's compact-trace statistics from its prompt rows: q [P, H, d] and k
[P, Hkv, d] (as the file stores them: rounded to float16 first for a float16 file), modality [P],
question_len (-1: the tokens after the last image or video token), the scale on q·k (0:
1/sqrt(d)), the file's dtype (whose rounding the rounded column sums apply). Returns
{"prompt": {...}, "context": {...} (with a question), "entropies", "context_len", "first_row"},
the arrays named as the file's stats/ datasets. threads: 0 uses every core (the values do not
depend on it, as with `kvsim compact -j`).)doc");
}

}  // namespace kvsim::python
