#include "python/bindings/python_policy.hpp"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <set>
#include <stdexcept>

namespace py = pybind11;

namespace kvsim::python {

namespace {

// A read-only numpy view on memory owned by C++ (no copy): valid while the hook runs.
template <typename T>
py::array view(const T* data, std::vector<py::ssize_t> shape, std::vector<py::ssize_t> strides) {
  py::array a(py::dtype::of<T>(), std::move(shape), std::move(strides), data,
              py::capsule(data, [](void*) {}));
  py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return a;
}

void in_range(int i, int n, const char* what) {
  if (i < 0 || i >= n)
    throw py::index_error(std::string(what) + " " + std::to_string(i) + " out of range [0, " +
                          std::to_string(n) + ")");
}

// Handles passed to the hooks; every method checks that the hook is still running.
struct Alive {
  std::shared_ptr<bool> alive;
  void check() const {
    if (!*alive)
      throw std::runtime_error(
          "kvsim: a LayerView, StepAttention or Cache was used after its hook returned");
  }
};

// The hook's LayerView: token rows of the positions that exist (the prompt at the prefill,
// positions <= P + t at decode step t), prompt statistics, never the generation's length.
struct ViewHandle : Alive {
  const LayerView* v;
  const LayerView& view() const {
    check();
    return *v;
  }
};

struct StepHandle : Alive {
  const StepAttention* a;
  const KvCache* cache;
};

struct CacheHandle : Alive {
  KvCache* c;
  KvCache& get() const {
    check();
    return *c;
  }
  void head_in_range(int g) const {
    if (g < 0 || g >= get().kv_heads())
      throw py::index_error("kv head " + std::to_string(g) + " out of range [0, " +
                            std::to_string(get().kv_heads()) + ")");
  }
};

py::dict sample_dict(const SampleInfo& s) {
  py::dict d;
  d["name"] = s.name;
  d["prompt_len"] = s.prompt_len;
  d["modality"] = to_numpy(s.modality);
  return d;
}

class PythonPolicy final : public Policy {
 public:
  PythonPolicy(std::string label, py::object obj) : label_(std::move(label)), obj_(std::move(obj)) {
    has_capacity_ = py::hasattr(obj_, "capacity");
  }
  ~PythonPolicy() override {
    py::gil_scoped_acquire gil;
    obj_ = py::object();
  }

  void start(const SampleInfo& s) {
    py::gil_scoped_acquire gil;
    if (py::hasattr(obj_, "start")) call([&] { obj_.attr("start")(sample_dict(s)); });
  }

  void on_prefill(const LayerView& view, KvCache& cache) override {
    py::gil_scoped_acquire gil;
    auto alive = std::make_shared<bool>(true);
    call([&] {
      obj_.attr("on_prefill")(ViewHandle{{alive}, &view}, CacheHandle{{alive}, &cache});
    });
    *alive = false;
  }

  void on_decode(const LayerView& view, const StepAttention& att, KvCache& cache) override {
    py::gil_scoped_acquire gil;
    auto alive = std::make_shared<bool>(true);
    call([&] {
      obj_.attr("on_decode")(ViewHandle{{alive}, &view}, StepHandle{{alive}, &att, &cache},
                             CacheHandle{{alive}, &cache});
    });
    *alive = false;
  }

  int capacity(int layer, int g) const override {
    if (!has_capacity_) return -1;
    py::gil_scoped_acquire gil;
    int cap = -1;
    call([&] { cap = obj_.attr("capacity")(layer, g).cast<int>(); });
    return cap;
  }

 private:
  // Python errors become C++ errors here, under the GIL, so that they can cross threads.
  template <typename Fn>
  void call(Fn&& fn) const {
    try {
      fn();
    } catch (py::error_already_set& e) {
      if (e.matches(PyExc_KeyboardInterrupt)) throw PythonInterrupted();
      throw PythonError(std::move(e), "in Python policy '" + label_ + "'");
    } catch (const py::cast_error& e) {
      throw std::runtime_error("Python policy '" + label_ + "': " + e.what());
    }
  }

  std::string label_;
  py::object obj_;
  bool has_capacity_ = false;
};

AttentionNeeds needs_of(const py::object& obj, const std::string& label) {
  AttentionNeeds n;
  if (!py::hasattr(obj, "needs")) return n;
  // Every field of AttentionNeeds by its name, as text (a list: its items comma-separated).
  for (const auto& [key, value] : obj.attr("needs").cast<py::dict>()) {
    std::string text;
    if (py::isinstance<py::bool_>(value))
      text = value.cast<bool>() ? "true" : "false";
    else if (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value))
      for (const auto& item : value) text += (text.empty() ? "" : ",") + std::string(py::str(item));
    else
      text = py::str(value);
    try {
      set_attention_need(n, py::str(key), text);
    } catch (const std::invalid_argument& e) {
      throw py::value_error("Python policy '" + label + "': " + e.what());
    }
  }
  return n;
}

// kvsim.LayerView: what a Python policy reads of the current layer.
void bind_view_handle(py::module_& m) {
  py::class_<ViewHandle>(m, "LayerView",
                         "The statistics of the current layer a policy may read (numpy views, "
                         "valid during the hook; copy to keep).")
      .def_property_readonly("layer", [](const ViewHandle& v) { return v.view().layer(); })
      .def_property_readonly("num_layers",
                             [](const ViewHandle& v) { return v.view().num_layers(); })
      .def_property_readonly("prompt_len",
                             [](const ViewHandle& v) { return v.view().prompt_len(); })
      .def_property_readonly("visible_len",
                             [](const ViewHandle& v) { return v.view().visible_len(); })
      .def_property_readonly("group_size",
                             [](const ViewHandle& v) { return v.view().group_size(); })
      .def_property_readonly("num_kv_heads",
                             [](const ViewHandle& v) { return v.view().num_kv_heads(); })
      .def_property_readonly("modality",
                             [](const ViewHandle& v) {
                               const VisibleModality m = v.view().modality();
                               return view(m.data(), {static_cast<py::ssize_t>(m.size())}, {1});
                             })
      .def(
          "prefill_column_sums",
          [](const ViewHandle& v, int h) {
            in_range(h, v.view().num_heads(), "query head");
            return view(v.view().prefill_column_sums(h), {v.view().prompt_len()}, {4});
          },
          py::arg("head"),
          "float32 [P]: Σ over causal prompt rows of p_ij (needs prefill_column_sums)")
      .def(
          "prefill_window",
          [](const ViewHandle& v, int h) {
            const auto& a = v.view();
            in_range(h, a.num_heads(), "query head");
            const int w = a.prefill_window(), P = a.prompt_len();
            if (w == 0) throw std::logic_error("prefill window rows were not requested");
            return view(a.prefill_window_row(h, 0), {w, P}, {4 * P, 4});
          },
          py::arg("head"), "float32 [window, P]: the last prompt rows' probabilities")
      .def(
          "window_group_sums",
          [](const ViewHandle& v, int g, int width) {
            in_range(g, v.view().num_kv_heads(), "kv head");
            if (width < 1) throw std::invalid_argument("window width must be at least 1");
            const std::vector<double> s = v.view().window_group_sums(g, width);
            return py::array_t<double>(static_cast<py::ssize_t>(s.size()), s.data());
          },
          py::arg("kv_head"), py::arg("width"),
          "float64 [P]: Σ over the KV head's query heads and its last `width` prompt rows of p_ij "
          "(needs window_group_sums)")
      .def(
          "last_row_head_mean",
          [](const ViewHandle& v) {
            const std::vector<double> s = v.view().last_row_head_mean();
            return py::array_t<double>(static_cast<py::ssize_t>(s.size()), s.data());
          },
          "float64 [P]: the last prompt row's attention averaged over the query heads (needs "
          "last_row_head_mean)")
      .def(
          "text_query_column_sums",
          [](const ViewHandle& v) {
            return view(v.view().text_query_column_sums(), {v.view().prompt_len()}, {4});
          },
          "float32 [P]: head-averaged column sums over the prompt's text queries")
      .def(
          "text_query_column_max",
          [](const ViewHandle& v) {
            return view(v.view().text_query_column_max(), {v.view().prompt_len()}, {4});
          },
          "float32 [P]: head-averaged column maxima over the prompt's text queries")
      .def(
          "keys",
          [](const ViewHandle& v, int g) {
            const auto& a = v.view();
            in_range(g, a.num_kv_heads(), "kv head");
            const auto T = static_cast<py::ssize_t>(a.visible_len()),
                       H = static_cast<py::ssize_t>(a.num_kv_heads()),
                       d = static_cast<py::ssize_t>(a.head_dim());
            return view(a.key(0, g), {T, d}, {4 * H * d, 4});
          },
          py::arg("kv_head"),
          "float32 [n, d]: the recorded keys of a KV head at the positions that exist so far (the "
          "prompt at on_prefill, positions <= P + t at decode step t)")
      .def(
          "values",
          [](const ViewHandle& v, int g) {
            const auto& a = v.view();
            if (!a.has_values()) throw std::logic_error("the trace has no values");
            in_range(g, a.num_kv_heads(), "kv head");
            const auto T = static_cast<py::ssize_t>(a.visible_len()),
                       H = static_cast<py::ssize_t>(a.num_kv_heads()),
                       d = static_cast<py::ssize_t>(a.head_dim());
            return view(a.value(0, g), {T, d}, {4 * H * d, 4});
          },
          py::arg("kv_head"),
          "float32 [n, d]: the recorded values of a KV head at the positions that exist so far");
}

// kvsim.StepAttention: a decode step's attention.
void bind_step_handle(py::module_& m) {
  py::class_<StepHandle>(m, "StepAttention", "One decode step's renormalised attention.")
      .def_property_readonly("step",
                             [](const StepHandle& s) {
                               s.check();
                               return s.a->step;
                             })
      .def_property_readonly("position",
                             [](const StepHandle& s) {
                               s.check();
                               return s.a->position;
                             })
      .def_property_readonly("group",
                             [](const StepHandle& s) {
                               s.check();
                               return s.a->group;
                             })
      .def(
          "probs",
          [](const StepHandle& s, int g) {
            s.check();
            in_range(g, static_cast<int>(s.a->probs.size()), "kv head");
            const int n = s.cache->size(g);
            return view(s.a->head(g, 0, n), {s.a->group, n}, {4 * n, 4});
          },
          py::arg("kv_head"),
          "float32 [group, n]: each query head's probabilities over the KV head's n entries, in "
          "cache order (0 for stored-but-unused entries)");
}

// kvsim.Cache: the entries a Python policy keeps, evicts and merges.
void bind_cache_handle(py::module_& m) {
  py::class_<CacheHandle>(m, "Cache", "The retained entries of the current layer, per KV head.")
      .def_property_readonly("kv_heads", [](const CacheHandle& c) { return c.get().kv_heads(); })
      .def_property_readonly("step", [](const CacheHandle& c) { return c.get().step(); })
      .def("size",
           [](const CacheHandle& c, int g) {
             c.head_in_range(g);
             return c.get().size(g);
           })
      .def("attended_size",
           [](const CacheHandle& c, int g) {
             c.head_in_range(g);
             return c.get().attended_size(g);
           })
      .def(
          "positions",
          [](const CacheHandle& c, int g) {
            c.head_in_range(g);
            const auto& p = c.get().positions(g);
            return view(p.data(), {static_cast<py::ssize_t>(p.size())}, {4});
          },
          py::arg("kv_head"), "int32 [n]: positions of the entries, ascending")
      .def("attended",
           [](const CacheHandle& c, int g, int e) {
             c.head_in_range(g);
             in_range(e, c.get().size(g), "entry");
             return c.get().attended(g, e);
           })
      .def(
          "evict",
          [](const CacheHandle& c, int g, const std::vector<int>& entries) {
            c.head_in_range(g);
            for (int e : entries) in_range(e, c.get().size(g), "entry");
            c.get().evict(g, entries);
          },
          py::arg("kv_head"), py::arg("entries"), "removes entries (indices in cache order)")
      .def(
          "keep_only",
          [](const CacheHandle& c, int g, const py::array_t<std::uint8_t>& keep) {
            c.head_in_range(g);
            if (keep.ndim() != 1 || keep.shape(0) != c.get().size(g))
              throw py::value_error("keep_only: expected " + std::to_string(c.get().size(g)) +
                                    " flags for kv head " + std::to_string(g));
            std::vector<std::uint8_t> k(keep.data(), keep.data() + keep.shape(0));
            c.get().keep_only(g, k);
          },
          py::arg("kv_head"), py::arg("keep"), "keeps exactly the entries whose flag is set")
      .def(
          "set_attended",
          [](const CacheHandle& c, int g, int e, bool attended) {
            c.head_in_range(g);
            in_range(e, c.get().size(g), "entry");
            c.get().set_attended(g, e, attended);
          },
          py::arg("kv_head"), py::arg("entry"), py::arg("attended"))
      .def(
          "merge",
          [](const CacheHandle& c, int g, int from, int into, const py::array_t<float>& key,
             const py::array_t<float>& value) {
            c.head_in_range(g);
            in_range(from, c.get().size(g), "entry");
            in_range(into, c.get().size(g), "entry");
            if (from == into) throw py::value_error("merge: an entry cannot merge into itself");
            const int d = c.get().head_dim();
            if (key.size() != d || value.size() != d)
              throw py::value_error("merge: key and value need " + std::to_string(d) + " floats");
            c.get().merge(g, from, into, key.data(), value.data());
          },
          py::arg("kv_head"), py::arg("entry"), py::arg("into"), py::arg("key"), py::arg("value"),
          "entry disappears into `into`, which then holds key and value");
}

void bind_handles(py::module_& m) {
  bind_view_handle(m);
  bind_step_handle(m);
  bind_cache_handle(m);
}

}  // namespace

bool is_python_policy(const py::handle& obj) {
  return py::hasattr(obj, "on_prefill") && py::hasattr(obj, "on_decode");
}

std::unique_ptr<PolicyInfo> python_policy_info(const std::string& label, py::object obj) {
  auto info = std::make_unique<PolicyInfo>();
  info->name = label;
  info->summary = "Python policy " + std::string(py::str(obj.get_type().attr("__name__")));
  info->provenance = "Python";
  info->needs = needs_of(obj, label);
  info->merges = py::hasattr(obj, "merges") && obj.attr("merges").cast<bool>();
  auto shared = std::make_shared<py::object>(std::move(obj));
  info->create = [label, shared](const ParamSet&, const SampleInfo& s) -> std::unique_ptr<Policy> {
    std::unique_ptr<PythonPolicy> p;
    {
      py::gil_scoped_acquire gil;
      p = std::make_unique<PythonPolicy>(label, *shared);
    }
    p->start(s);
    return p;
  };
  return info;
}

namespace {

py::object python_value(const ParamSpec& spec, const ParamSet& p) {
  switch (spec.type) {
    case ParamType::kInt:
      return py::int_(p.get_int(spec.name));
    case ParamType::kFloat:
      return py::float_(p.get_float(spec.name));
    case ParamType::kBool:
      return py::bool_(p.get_bool(spec.name));
    default:
      return py::str(p.get_string(spec.name));
  }
}

ParamType param_type(const std::string& type, const std::string& where) {
  if (type == "int") return ParamType::kInt;
  if (type == "float") return ParamType::kFloat;
  if (type == "bool") return ParamType::kBool;
  if (type == "size") return ParamType::kSize;
  if (type == "choice") return ParamType::kChoice;
  if (type == "string") return ParamType::kString;
  throw py::value_error(where + ": type '" + type +
                        "' (expected int, float, bool, size, choice or string)");
}

std::vector<ParamSpec> param_specs(const std::string& name, const py::list& params) {
  std::vector<ParamSpec> specs;
  for (const auto& item : params) {
    const py::dict d = item.cast<py::dict>();
    ParamSpec s;
    s.name = py::str(d["name"]);
    const std::string where = "kvsim.register('" + name + "'), parameter '" + s.name + "'";
    s.type = param_type(d.contains("type") ? std::string(py::str(d["type"])) : "string", where);
    if (!d.contains("default")) throw py::value_error(where + ": no default");
    s.default_value = param_text(d["default"]);
    if (d.contains("doc")) s.doc = py::str(d["doc"]);
    if (d.contains("min")) s.min = d["min"].cast<double>();
    if (d.contains("max")) s.max = d["max"].cast<double>();
    if (d.contains("choices")) s.choices = d["choices"].cast<std::vector<std::string>>();
    if (s.type == ParamType::kSize && !d.contains("max")) s.max = 1e9;
    specs.push_back(std::move(s));
  }
  resolve_params(name, specs, {});  // the defaults must satisfy their own declarations
  return specs;
}

// Names this process registered from Python: those, and only those, may be registered again.
std::set<std::string>& python_names() {
  static std::set<std::string> names;
  return names;
}

// The switches a Python policy may offer: those the registry and the engine implement (`decode`
// by the registry's wrapper, `caches` and `question` by the engine). `compress` changes when a
// policy evicts, which only the policy itself can do.
PolicySwitches switches_offered(const std::string& name, const std::vector<std::string>& offered) {
  PolicySwitches s;
  for (const std::string& o : offered) {
    if (o == "decode")
      s.decode = true;
    else if (o == "caches")
      s.caches = true;
    else if (o == "question")
      s.question = true;
    else
      throw py::value_error("kvsim.register('" + name + "'): unknown switch '" + o +
                            "' (a Python policy may offer decode, caches and question)");
  }
  return s;
}

void register_policy(const std::string& name, py::object factory, const py::list& params,
                     const std::string& summary, const std::string& provenance,
                     const std::vector<std::string>& switches) {
  PolicyInfo info = registered_python_policy(name, std::move(factory), param_specs(name, params),
                                             summary, provenance);
  info.switches = switches_offered(name, switches);
  if (python_names().count(name)) {
    PolicyRegistry::instance().replace(std::move(info));
    return;
  }
  for (const auto& known : PolicyRegistry::instance().names())
    if (known == name) throw py::value_error("kvsim.register: '" + name + "' is a built-in policy");
  PolicyRegistry::instance().add(std::move(info));
  python_names().insert(name);
}

}  // namespace

PolicyInfo registered_python_policy(const std::string& name, py::object factory,
                                    std::vector<ParamSpec> params, const std::string& summary,
                                    const std::string& provenance) {
  // Kept for the life of the process: the registry is static and must not release a Python
  // object without the GIL at exit.
  auto* held = new py::object(std::move(factory));
  PolicyInfo info;
  info.name = name;
  info.summary = summary.empty() ? "Python policy" : summary;
  info.provenance = provenance;
  info.params = params;
  info.needs = needs_of(*held, name);
  info.merges = py::hasattr(*held, "merges") && held->attr("merges").cast<bool>();
  info.create = [name, held, params](const ParamSet& p,
                                     const SampleInfo& s) -> std::unique_ptr<Policy> {
    std::unique_ptr<PythonPolicy> policy;
    {
      py::gil_scoped_acquire gil;
      py::dict kwargs;
      for (const auto& spec : params) kwargs[py::str(spec.name)] = python_value(spec, p);
      py::object instance;
      try {
        instance = (*held)(**kwargs);
      } catch (py::error_already_set& e) {
        throw PythonError(std::move(e), "creating Python policy '" + name + "'");
      }
      policy = std::make_unique<PythonPolicy>(name, instance);
    }
    policy->start(s);
    return policy;
  };
  return info;
}

void bind_python_policy(py::module_& m) {
  bind_handles(m);
  m.def("_register", &register_policy, py::arg("name"), py::arg("factory"), py::arg("params"),
        py::arg("summary"), py::arg("provenance"), py::arg("switches"));
}

}  // namespace kvsim::python
