// kvsim.check_outputs, the output guard every writer runs first, and
// kvsim.write_trace: a kvtrace v1 file from numpy arrays, through kvsim's own writer, then read
// back with kvsim's validating reader before it takes its final name (errors name the sample,
// layer and array; nothing is left under the final name on error).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdio>

#include "core/partial_files.hpp"
#include "python/bindings/common.hpp"
#include "sim/run/output_guard.hpp"
#include "traces/kvtrace_writer.hpp"

namespace py = pybind11;

namespace kvsim::python {

namespace {

OutputKind output_kind(const std::string& kind) {
  if (kind == "result") return OutputKind::result;
  if (kind == "trace") return OutputKind::trace;
  if (kind == "prompts") return OutputKind::prompts;
  throw py::value_error("kvsim.check_outputs: kind '" + kind +
                        "': expected result, trace or prompts");
}

}  // namespace

void check_outputs_py(const std::vector<std::tuple<std::string, std::string, std::string>>& outputs,
                      const std::vector<std::pair<std::string, std::string>>& inputs, bool force) {
  std::vector<OutputPath> out;
  for (const auto& [path, option, kind] : outputs) out.push_back({path, option, output_kind(kind)});
  std::vector<InputPath> in;
  for (const auto& [path, role] : inputs) in.push_back({path, role});
  try {
    check_outputs(out, in, force);
  } catch (const OutputConflict&) {
    throw;  // FileExistsError (python/bindings/module.cpp)
  } catch (const std::runtime_error& e) {
    PyErr_SetString(PyExc_OSError, e.what());
    throw py::error_already_set();
  }
}

namespace {

template <typename T>
std::vector<T> vector_of(const py::handle& obj, std::size_t n, const std::string& where) {
  const auto a = py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(obj);
  if (!a || a.ndim() != 1 || static_cast<std::size_t>(a.shape(0)) != n)
    throw py::value_error(where + ": expected a 1-D array of " + std::to_string(n) + " values");
  return std::vector<T>(a.data(), a.data() + n);
}

xt::xtensor<float, 3> tensor_of(const py::handle& obj, std::size_t T, std::size_t heads,
                                std::size_t d, const std::string& where) {
  const auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(obj);
  if (!a || a.ndim() != 3 || static_cast<std::size_t>(a.shape(0)) != T ||
      static_cast<std::size_t>(a.shape(1)) != heads || static_cast<std::size_t>(a.shape(2)) != d)
    throw py::value_error(where + ": expected shape [" + std::to_string(T) + ", " +
                          std::to_string(heads) + ", " + std::to_string(d) + "]");
  xt::xtensor<float, 3> t = xt::empty<float>({T, heads, d});
  std::copy(a.data(), a.data() + a.size(), t.begin());
  return t;
}

struct Shape {
  std::size_t L = 0, H = 0, Hkv = 0, d = 0;
};

Shape shape_of(const py::dict& samples) {
  if (samples.empty()) throw py::value_error("kvsim.write_trace: no sample");
  const py::handle first = samples.begin()->second;
  const py::list layers = first["layers"];
  if (layers.empty()) throw py::value_error("kvsim.write_trace: the first sample has no layer");
  const auto q = py::array::ensure(layers[0]["q"]), k = py::array::ensure(layers[0]["k"]);
  if (!q || !k || q.ndim() != 3 || k.ndim() != 3)
    throw py::value_error("kvsim.write_trace: layer 0 needs 'q' [T, H, d] and 'k' [T, Hkv, d]");
  return {layers.size(), static_cast<std::size_t>(q.shape(1)), static_cast<std::size_t>(k.shape(1)),
          static_cast<std::size_t>(q.shape(2))};
}

SampleInfo sample_info(const std::string& name, const py::dict& s, DType dtype) {
  SampleInfo info;
  info.name = name;
  const std::string where = "kvsim.write_trace: sample '" + name + "'";
  info.prompt_len = s["prompt_len"].cast<int>();
  const py::list layers = s["layers"];
  const auto q0 = py::array::ensure(layers[0]["q"]);
  if (!q0 || q0.ndim() != 3) throw py::value_error(where + ", layer 0: 'q' must be [T, H, d]");
  const std::size_t T = q0.shape(0);
  info.gen_len = static_cast<int>(T) - info.prompt_len;
  info.modality = vector_of<std::uint8_t>(s["modality"], T, where + ", modality");
  info.segment = vector_of<std::uint8_t>(s["segment"], T, where + ", segment");
  if (s.contains("media_id"))
    info.media_id = vector_of<std::int32_t>(s["media_id"], T, where + ", media_id");
  if (s.contains("token_ids"))
    info.token_ids = vector_of<std::int32_t>(s["token_ids"], T, where + ", token_ids");
  if (s.contains("task")) info.task = py::str(s["task"]);
  if (s.contains("reference")) info.reference = py::str(s["reference"]);
  if (s.contains("question_len")) info.question_len = s["question_len"].cast<int>();
  if (s.contains("position_ids")) {
    const auto a = py::array_t<std::int32_t, py::array::c_style | py::array::forcecast>::ensure(
        s["position_ids"]);
    if (!a || a.ndim() != 2 || a.shape(0) != 3 || static_cast<std::size_t>(a.shape(1)) != T)
      throw py::value_error(where + ", position_ids: expected [3, " + std::to_string(T) +
                            "] M-RoPE ids (temporal, height, width)");
    info.position_ids.assign(a.data(), a.data() + a.size());
  }
  info.has_v = py::dict(layers[0]).contains("v");
  info.dtype = dtype;
  return info;
}

void write_trace(const std::string& path, const py::dict& samples, const std::string& model,
                 const py::object& scale, const std::string& dtype, int gzip, bool shuffle,
                 const py::object& rope_theta, const py::object& mrope_section, bool force) {
  if (dtype != "float16" && dtype != "float32")
    throw py::value_error("kvsim.write_trace: dtype '" + dtype + "': expected float16 or float32");
  check_outputs_py({{path, "path", "trace"}}, {}, force);
  const Shape shape = shape_of(samples);
  TraceInfo info{.model = model,
                 .num_layers = static_cast<int>(shape.L),
                 .num_heads = static_cast<int>(shape.H),
                 .num_kv_heads = static_cast<int>(shape.Hkv),
                 .head_dim = static_cast<int>(shape.d)};
  if (!scale.is_none()) info.scale = scale.cast<double>(), info.scale_given = true;
  if (!rope_theta.is_none()) info.rope_theta = rope_theta.cast<double>();
  if (!mrope_section.is_none()) info.mrope_section = mrope_section.cast<std::vector<int>>();
  const WriteOptions options{.dtype = dtype == "float16" ? DType::kFloat16 : DType::kFloat32,
                             .gzip_level = gzip,
                             .shuffle = shuffle};
  const std::string partial = begin_partial(path);
  try {
    {
      TraceWriter w(partial, info, options);
      for (const auto& [key, value] : samples) {
        const std::string name = py::str(key);
        const py::dict s = value.cast<py::dict>();
        const SampleInfo si = sample_info(name, s, options.dtype);
        const py::list layers = s["layers"];
        if (layers.size() != shape.L)
          throw py::value_error("kvsim.write_trace: sample '" + name + "' has " +
                                std::to_string(layers.size()) + " layers, the first sample " +
                                std::to_string(shape.L));
        w.write_sample(si);
        const std::size_t T = si.modality.size();
        for (std::size_t l = 0; l < shape.L; ++l) {
          const std::string where =
              "kvsim.write_trace: sample '" + name + "', layer " + std::to_string(l) + ", ";
          const py::dict layer = layers[l].cast<py::dict>();
          LayerTensors t;
          t.layer = static_cast<int>(l);
          t.q = tensor_of(layer["q"], T, shape.H, shape.d, where + "q");
          t.k = tensor_of(layer["k"], T, shape.Hkv, shape.d, where + "k");
          if (layer.contains("v") != si.has_v)
            throw py::value_error(where + "'v' must be given in every layer or in none");
          if (si.has_v) t.v = tensor_of(layer["v"], T, shape.Hkv, shape.d, where + "v");
          w.write_layer(si, t);
        }
      }
      w.close();
    }
    const TraceReader check(partial);  // the reader's validation, every layer
    LayerTensors t;
    for (const auto& name : check.sample_names()) {
      const SampleInfo s = check.read_sample(name);
      for (int l = 0; l < info.num_layers; ++l) check.read_layer_into(s, l, t);
    }
  } catch (...) {
    discard_partial(path);
    throw;
  }
  publish(path);
}

}  // namespace

void bind_write(py::module_& m) {
  m.def("write_trace", &write_trace, py::arg("path"), py::arg("samples"), py::arg("model") = "",
        py::arg("scale") = py::none(), py::arg("dtype") = "float16", py::arg("gzip") = 0,
        py::arg("shuffle") = false, py::arg("rope_theta") = py::none(),
        py::arg("mrope_section") = py::none(), py::arg("force") = false,
        R"doc(Writes a kvtrace v1 file from numpy arrays.

samples: dict name -> {"prompt_len": P, "modality": [T], "segment": [T], optional "media_id",
"token_ids" [T], "task", "reference", "question_len", "position_ids" [3, T] (M-RoPE ids: temporal,
height, width; with mrope_section), and "layers": a list (one per layer) of dicts with "q"
[T, H, d], "k" [T, Hkv, d] and optional "v" [T, Hkv, d]}. L, H, Hkv and d come from the first
sample. mrope_section: the rotary pairs of each M-RoPE axis (Qwen2-VL: [16, 24, 24]). The file is read back and validated (as `kvsim inspect`) before it takes its name. An existing trace at `path` is replaced only with force=True; any other
kvtrace or kvprompt file there is never replaced (FileExistsError).)doc");
  m.def("check_outputs", &check_outputs_py, py::arg("outputs"), py::arg("inputs") = py::list(),
        py::arg("force") = false,
        R"doc(What every kvsim command checks before it writes: outputs is a list of (path, option,
kind) with kind "result", "trace" or "prompts", inputs a list of (path, role). Raises
FileExistsError naming both when an output is an input (same path or inode) or another output, or
when an existing kvtrace or kvprompt file would be replaced by an output of another kind, or by
one of its kind without force; OSError when an output's place cannot be written.)doc");
}

}  // namespace kvsim::python
