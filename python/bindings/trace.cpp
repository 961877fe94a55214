// kvsim.Trace / kvsim.Sample: a kvtrace v1 file's attributes, samples, token metadata and any
// layer's q/k/v as numpy arrays (float32 [T, heads, d], whatever the stored dtype).
#include <memory>

#include "python/bindings/common.hpp"
#include "traces/kvtrace.hpp"

namespace kvsim::python {

namespace {

py::array_t<float> to_numpy(const xt::xtensor<float, 3>& x) {
  py::array_t<float> out({static_cast<py::ssize_t>(x.shape(0)),
                          static_cast<py::ssize_t>(x.shape(1)),
                          static_cast<py::ssize_t>(x.shape(2))});
  std::copy(x.begin(), x.end(), out.mutable_data());
  return out;
}

// A sample of an open trace; keeps the reader alive.
struct Sample {
  std::shared_ptr<TraceReader> reader;
  SampleInfo info;

  py::dict layer(int l) const {
    if (l < 0 || l >= reader->info().num_layers)
      throw py::index_error(reader->path() + ": sample '" + info.name + "': layer " +
                            std::to_string(l) + " out of range [0, " +
                            std::to_string(reader->info().num_layers) + ")");
    LayerTensors t;
    {
      py::gil_scoped_release release;
      t = reader->read_layer(info, l);
    }
    py::dict d;
    d["q"] = to_numpy(t.q);
    if (t.q_first_row > 0) d["q_first_row"] = t.q_first_row;  // a compact trace's first row
    d["k"] = to_numpy(t.k);
    if (t.has_v()) d["v"] = to_numpy(t.v);
    return d;
  }
};

}  // namespace

void bind_trace(py::module_& m) {
  py::class_<Sample>(m, "Sample", "One sample of a trace: token metadata and per-layer q/k/v.")
      .def_property_readonly("name", [](const Sample& s) { return s.info.name; })
      .def_property_readonly("prompt_len", [](const Sample& s) { return s.info.prompt_len; })
      .def_property_readonly("gen_len", [](const Sample& s) { return s.info.gen_len; })
      .def_property_readonly("total_len", [](const Sample& s) { return s.info.total_len(); })
      .def_property_readonly("task", [](const Sample& s) { return s.info.task; })
      .def_property_readonly(
          "question_len", [](const Sample& s) { return question_length(s.info); },
          "prompt tokens of the question: the question_len attribute, else those after the last "
          "image or video token, else 0")
      .def_property_readonly("has_v", [](const Sample& s) { return s.info.has_v; })
      .def_property_readonly(
          "dtype",
          [](const Sample& s) { return s.info.dtype == DType::kFloat16 ? "float16" : "float32"; })
      .def_property_readonly(
          "modality", [](const Sample& s) { return to_numpy(s.info.modality); },
          "uint8 [T]: 0 text, 1 image, 2 video")
      .def_property_readonly(
          "segment", [](const Sample& s) { return to_numpy(s.info.segment); },
          "uint8 [T]: 0 system, 1 user, 2 generated")
      .def_property_readonly(
          "media_id", [](const Sample& s) { return to_numpy(s.info.media_id); },
          "int32 [T] (empty when the trace has none)")
      .def_property_readonly(
          "token_ids", [](const Sample& s) { return to_numpy(s.info.token_ids); },
          "int32 [T] (empty when the trace has none)")
      .def_property_readonly(
          "position_ids",
          [](const Sample& s) -> py::object {
            if (s.info.position_ids.empty()) return py::none();
            py::array_t<std::int32_t> a({std::size_t{3}, std::size_t(s.info.total_len())});
            std::copy(s.info.position_ids.begin(), s.info.position_ids.end(), a.mutable_data());
            return a;
          },
          "int32 [3, T]: the M-RoPE ids (temporal, height, width), or None (position i is i)")
      .def("layer", &Sample::layer, py::arg("layer"),
           "dict of float32 numpy arrays: 'q' [T, H, d], 'k' and (when stored) 'v' [T, Hkv, d]")
      .def("__repr__", [](const Sample& s) {
        return "<kvsim.Sample '" + s.info.name + "' P=" + std::to_string(s.info.prompt_len) +
               " G=" + std::to_string(s.info.gen_len) + ">";
      });

  py::class_<TraceReader, std::shared_ptr<TraceReader>>(
      m, "Trace", "A kvtrace v1 file, opened and validated (errors name the file and dataset).")
      .def(py::init(&open_trace), py::arg("path"))
      .def_property_readonly("path", &TraceReader::path)
      .def_property_readonly("model", [](const TraceReader& r) { return r.info().model; })
      .def_property_readonly("num_layers", [](const TraceReader& r) { return r.info().num_layers; })
      .def_property_readonly("num_heads", [](const TraceReader& r) { return r.info().num_heads; })
      .def_property_readonly("num_kv_heads",
                             [](const TraceReader& r) { return r.info().num_kv_heads; })
      .def_property_readonly("head_dim", [](const TraceReader& r) { return r.info().head_dim; })
      .def_property_readonly("scale", [](const TraceReader& r) { return r.info().scale; })
      .def_property_readonly(
          "rope_theta",
          [](const TraceReader& r) -> py::object {
            if (r.info().rope_theta > 0) return py::float_(r.info().rope_theta);
            return py::none();
          },
          "the rotary base the queries and keys carry, or None when the trace does not say")
      .def_property_readonly(
          "mrope_section",
          [](const TraceReader& r) -> py::object {
            if (r.info().mrope_section.empty()) return py::none();
            return py::cast(r.info().mrope_section);
          },
          "M-RoPE's rotary pairs per axis (temporal, height, width), or None for plain RoPE")
      .def_property_readonly(
          "compact_window",
          [](const TraceReader& r) -> py::object {
            if (!r.info().compact()) return py::none();
            return py::int_(r.info().compact_window);
          },
          "a compact trace's longest window of prompt rows kept (kvsim compact), or None for a "
          "full trace")
      .def("samples", &TraceReader::sample_names, "names of the samples, in file order")
      .def(
          "sample",
          [](const std::shared_ptr<TraceReader>& r, const std::string& name) {
            check_samples(*r, {name});
            return Sample{r, r->read_sample(name)};
          },
          py::arg("name"))
      .def("__repr__", [](const TraceReader& r) {
        return "<kvsim.Trace '" + r.path() + "' L=" + std::to_string(r.info().num_layers) +
               " H=" + std::to_string(r.info().num_heads) +
               " Hkv=" + std::to_string(r.info().num_kv_heads) +
               " d=" + std::to_string(r.info().head_dim) + ">";
      });
}

}  // namespace kvsim::python
