// kvsim.replay: the engine of `kvsim replay`, returning its per-step results as a dict of numpy
// columns named and ordered as the columns of `kvsim replay --out` (rows in the same order), with
// the same float32 values (the CSV prints them with %.9g, which round-trips float32 exactly).
// Empty CSV cells are NaN. The GIL is released while the engine works; Ctrl-C (KeyboardInterrupt)
// is checked after every layer and stops the replay with the exception.
#include <algorithm>
#include <map>

#include "core/params.hpp"
#include "policies/policy_config.hpp"
#include "python/bindings/python_policy.hpp"
#include "sim/replay/engine.hpp"
#include "sim/replay/step_metric.hpp"
#include "sim/run/note_tally.hpp"

namespace kvsim::python {

namespace {

// One column per CSV column, filled in CSV row order.
struct Columns {
  std::vector<std::string> policy, sample;
  std::vector<std::int64_t> layer, kv_head, step, position, cache_size, attended_size, kv_bytes;
  std::vector<float> mass_recall, output_rel_error, output_value_error;
  // The registered metrics' columns (sim/replay/step_metric.hpp): float32, counts as float64
  // (NaN where the CSV cell is empty).
  std::vector<MetricColumn> metric_columns = observed_columns();
  std::vector<std::vector<float>> metrics{metric_columns.size()};

  void add(const std::string& label, const LayerResult& r) {
    for (std::size_t g = 0; g < r.steps.size(); ++g)
      for (std::size_t t = 0; t < r.steps[g].size(); ++t) {
        const StepMetrics& m = r.steps[g][t];
        policy.push_back(label), sample.push_back(r.sample);
        layer.push_back(r.layer), kv_head.push_back(g), step.push_back(t);
        position.push_back(m.position), cache_size.push_back(m.cache_size);
        attended_size.push_back(m.attended_size), kv_bytes.push_back(m.kv_bytes);
        mass_recall.push_back(m.mass_recall), output_rel_error.push_back(m.output_rel_error);
        output_value_error.push_back(m.output_value_error);
        for (std::size_t c = 0; c < metrics.size(); ++c)
          metrics[c].push_back(r.observed.empty() ? NAN
                                                  : r.observed[g][t * r.observed_columns + c]);
      }
  }

  py::dict to_dict() const {
    py::dict d;
    d["policy"] = to_numpy(policy);
    d["sample"] = to_numpy(sample);
    d["layer"] = to_numpy(layer), d["kv_head"] = to_numpy(kv_head), d["step"] = to_numpy(step);
    d["position"] = to_numpy(position), d["cache_size"] = to_numpy(cache_size);
    d["attended_size"] = to_numpy(attended_size), d["mass_recall"] = to_numpy(mass_recall);
    d["output_rel_error"] = to_numpy(output_rel_error);
    d["output_value_error"] = to_numpy(output_value_error), d["kv_bytes"] = to_numpy(kv_bytes);
    for (std::size_t c = 0; c < metrics.size(); ++c) {
      const char* name = metric_columns[c].name.c_str();
      if (metric_columns[c].count)
        d[name] = to_numpy(std::vector<double>(metrics[c].begin(), metrics[c].end()));
      else
        d[name] = to_numpy(metrics[c]);
    }
    return d;
  }
};

// Evictions and merges, one row each, in the order the engine logged them.
struct Decisions {
  std::vector<std::string> policy, sample;
  std::vector<std::int64_t> layer, kv_head, step, position, into_position;

  void add(const std::string& label, const LayerResult& r) {
    auto row = [&](std::size_t g, int step_, int pos, int into) {
      policy.push_back(label), sample.push_back(r.sample), layer.push_back(r.layer);
      kv_head.push_back(g), step.push_back(step_), position.push_back(pos);
      into_position.push_back(into);
    };
    for (std::size_t g = 0; g < r.evicted.size(); ++g)
      for (const auto& e : r.evicted[g]) row(g, e.step, e.position, -1);
    for (std::size_t g = 0; g < r.merged.size(); ++g)
      for (const auto& m : r.merged[g]) row(g, m.step, m.position, m.into_position);
  }

  py::dict to_dict() const {
    py::dict d;
    d["policy"] = to_numpy(policy), d["sample"] = to_numpy(sample);
    d["layer"] = to_numpy(layer), d["kv_head"] = to_numpy(kv_head);
    d["step"] = to_numpy(step), d["position"] = to_numpy(position);
    d["into_position"] = to_numpy(into_position);
    return d;
  }
};

// The run's policies. `policies`: a name (policy or preset), a list of names, or a dict whose
// values are None, {parameter: value}, or a Python policy object (a kvsim.Policy).
struct PolicySet {
  std::vector<PolicyRequest> requests;                    // what the user asked for, in order
  std::vector<std::unique_ptr<PolicyInfo>> python_infos;  // owned here, pointed to by configs
  std::vector<PolicyConfig> configs;                      // build(): the run's policies
  std::vector<std::string> warnings;  // build(): what `kvsim replay` would warn of first

  // A named policy with the parameters the user chose for it.
  void add(const std::string& label, std::map<std::string, std::string> params) {
    check_new(label);
    requests.push_back({.name = label, .chosen = std::move(params)});
  }
  void add_python(const std::string& label, py::object obj) {
    check_new(label);
    python_infos.push_back(python_policy_info(label, std::move(obj)));
    PolicyConfig c;
    c.label = label;
    c.info = python_infos.back().get();
    requests.push_back({.name = label, .made = std::move(c)});
  }
  void check_new(const std::string& label) const {
    for (const auto& r : requests)
      if (r.name == label)
        throw py::value_error("kvsim.replay: policy '" + label + "' given twice");
  }
  // The configurations by the one builder of `kvsim replay` (budget, seeds, equal memory).
  void build(const PolicyListRules& rules) {
    configs =
        build_policy_list(requests, rules, [this](const std::string& w) { warnings.push_back(w); });
  }
};

std::map<std::string, std::string> param_strings(const py::handle& params) {
  std::map<std::string, std::string> values;
  for (const auto& [key, value] : params.cast<py::dict>()) values[py::str(key)] = param_text(value);
  return values;
}

// A Python policy given without a label is labelled by its class name ("BoolKeep", then
// "BoolKeep@2", ... for more instances).
std::string unique_label(const PolicySet& set, const py::handle& obj) {
  const std::string base = py::str(obj.get_type().attr("__name__"));
  std::string label = base;
  for (int n = 2;; ++n) {
    bool taken = false;
    for (const auto& r : set.requests) taken = taken || r.name == label;
    if (!taken) return label;
    label = base + "@" + std::to_string(n);
  }
}

PolicySet policy_set(const py::object& policies, const std::string& budget, int seeds,
                     bool equal_memory) {
  PolicySet set;
  if (py::isinstance<py::str>(policies)) {
    set.add(policies.cast<std::string>(), {});
  } else if (py::isinstance<py::dict>(policies)) {
    for (const auto& [name, value] : policies.cast<py::dict>()) {
      const std::string label = py::str(name);
      if (value.is_none())
        set.add(label, {});
      else if (py::isinstance<py::dict>(value))
        set.add(label, param_strings(value));
      else if (is_python_policy(value))
        set.add_python(label, py::reinterpret_borrow<py::object>(value));
      else
        throw py::type_error("kvsim.replay: policy '" + label +
                             "': expected None, a dict of parameters or a kvsim.Policy");
    }
  } else if (is_python_policy(policies)) {
    set.add_python(unique_label(set, policies), policies);
  } else {
    for (const auto& item : policies) {
      if (py::isinstance<py::str>(item))
        set.add(py::str(item), {});
      else if (is_python_policy(item))
        set.add_python(unique_label(set, item), py::reinterpret_borrow<py::object>(item));
      else
        throw py::type_error(
            "kvsim.replay: expected a policy name or a kvsim.Policy in the list, "
            "not " +
            std::string(py::str(item.get_type().attr("__name__"))));
    }
  }
  if (set.requests.empty()) throw py::value_error("kvsim.replay: no policy given");
  set.build({.budget = budget, .seeds = seeds, .equal_memory = equal_memory});
  return set;
}

// What `kvsim replay` warns of before it starts, as Python warnings: a budget some policies do
// not take, one that replaces a self-sizing default, policies equal memory cannot hold, and what
// the named policies adjusted on these samples (e.g. a window clamped to a small budget; Python
// policies are left out, so that their start() runs once per sample, in the replay).
void warn_before_replay(const PolicySet& set, const TraceReader& reader,
                        const std::vector<std::string>& samples, int prompt_tail) {
  for (const std::string& w : set.warnings) warn_python(w);
  std::vector<PolicyConfig> named;
  for (const PolicyConfig& c : set.configs)
    if (std::none_of(set.python_infos.begin(), set.python_infos.end(),
                     [&](const auto& info) { return info.get() == c.info; }))
      named.push_back(c);
  if (named.empty()) return;
  for (const auto& [label, notes] :
       Replayer(reader, named, {.prompt_tail = prompt_tail}).validate(samples))
    for (const std::string& note : notes) warn_python(note);
}

// kvsim.replay's prompt_tail: None or 0 (none), a whole number of tokens, or "question".
int prompt_tail_of(const py::object& tail) {
  if (tail.is_none()) return 0;
  if (py::isinstance<py::str>(tail)) return parse_prompt_tail(tail.cast<std::string>());
  if (!py::isinstance<py::int_>(tail) || py::isinstance<py::bool_>(tail))
    throw py::type_error("prompt_tail: a whole number of tokens or \"question\", not " +
                         std::string(py::str(tail.get_type().attr("__name__"))));
  return parse_prompt_tail(std::to_string(tail.cast<long long>()));
}

py::object replay(const std::string& trace, const py::object& policies, const py::object& samples,
                  int threads, const std::string& budget, bool diagnostics, bool decisions,
                  const py::object& progress, int seeds, bool equal_memory,
                  const py::object& prompt_tail, std::vector<std::string> metrics) {
  if (diagnostics && std::find(metrics.begin(), metrics.end(), "diagnostics") == metrics.end())
    metrics.push_back("diagnostics");
  const int tail = prompt_tail_of(prompt_tail);
  const PolicySet set = policy_set(policies, budget, seeds, equal_memory);
  const auto opened = open_trace(trace);
  const TraceReader& reader = *opened;
  std::vector<std::string> names =
      samples.is_none() ? reader.sample_names() : samples.cast<std::vector<std::string>>();
  check_samples(reader, names);
  const long layers_total = static_cast<long>(names.size()) * reader.info().num_layers;
  long layers_done = 0;
  Replayer replayer(
      reader, set.configs,
      ReplayOptions{.threads = thread_count(threads), .metrics = metrics, .prompt_tail = tail});
  warn_before_replay(set, reader, names, tail);
  Columns columns;
  Decisions log;
  NoteTally noted;  // what the policies note while replaying (e.g. MadaKV's dry budget)
  run_without_gil([&] {
    for (const auto& s : names)
      replayer.replay_sample(
          s,
          [&](const LayerResult& r) {
            const std::string& label = set.configs[r.policy_index].label;
            columns.add(label, r);
            if (decisions) log.add(label, r);
            for (const std::string& n : r.notes) noted.add(r.policy_index, s, n);
          },
          [&](int) {
            interruption_point();
            if (progress.is_none()) return;
            py::gil_scoped_acquire gil;
            try {
              progress(++layers_done, layers_total);
            } catch (py::error_already_set& e) {
              throw PythonError(std::move(e), "in the progress callback");
            }
          });
  });
  for (const auto& [policy, note] : noted.lines(names.size())) warn_python(note);
  if (!decisions) return columns.to_dict();
  return py::make_tuple(columns.to_dict(), log.to_dict());
}

// The registered per-step metrics: name, description, whether always run, and their columns.
py::list step_metric_list() {
  py::list out;
  for (const StepMetricInfo& m : step_metrics()) {
    py::list columns, counts;
    for (const MetricColumn& c : m.columns) {
      columns.append(c.name);
      if (c.count) counts.append(c.name);
    }
    out.append(py::dict(py::arg("name") = m.name, py::arg("description") = m.description,
                        py::arg("always") = m.always, py::arg("columns") = columns,
                        py::arg("counts") = counts));
  }
  return out;
}

}  // namespace

void bind_replay(py::module_& m) {
  m.def("step_metrics", &step_metric_list,
        "The per-step metrics replay can compute: a list of dicts with name, description, always "
        "(runs in every replay, else only when named in metrics=), columns (their names in the "
        "results) and counts (those of them that are integer counts).");
  m.def("replay", &replay, py::arg("trace"), py::arg("policies"), py::arg("samples") = py::none(),
        py::arg("threads") = 0, py::arg("budget") = "", py::arg("diagnostics") = false,
        py::arg("decisions") = false, py::arg("progress") = py::none(), py::arg("seeds") = 1,
        py::arg("equal_memory") = false, py::arg("prompt_tail") = py::none(),
        py::arg("metrics") = std::vector<std::string>{},
        R"doc(Replays samples of a trace through policies, as `kvsim replay --out` does.

policies: a policy or preset name, a list of names, or a dict whose keys are labels (policy or
preset names, or any label for a Python policy) and whose values are None, {parameter: value},
or a kvsim.Policy object.
samples: names (default: every sample). threads: 0 = all cores (results do not depend on it).
budget: for every policy that declares one and is given none (like --budget).
diagnostics: also fill the hit-rate, miss and evicted-mass columns (like --diagnostics).
metrics: optional per-step metrics to run, by name (like --metrics; see step_metrics()).
Returns a dict of numpy columns named as the CSV's; pandas.DataFrame(result) is the CSV. With
decisions=True, returns (results, decisions): decisions has one row per eviction (into_position
-1) and per merge, with columns policy, sample, layer, kv_head, step (-1: end of prefill),
position, into_position.
progress: called as progress(layers_done, layers_total) after every replayed layer.
seeds: a policy with a `seed` parameter (random) and none given runs once per seed 0..seeds-1,
labelled NAME@seedK (like --seeds). equal_memory: hold every budgeted policy to its budget at
every step (like --equal-memory). prompt_tail: N or "question": compress the prompt less its last
N tokens (or its question), then feed them as the first decode steps (like --prompt-tail).)doc");
}

}  // namespace kvsim::python
