#include "sim/replay/sweep.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

#include "analysis/bootstrap.hpp"
#include "analysis/csv_table.hpp"
#include "core/parallel.hpp"
#include "core/partial_files.hpp"
#include "core/splitmix.hpp"
#include "policies/policy_config.hpp"
#include "sim/replay/engine.hpp"
#include "sim/replay/results.hpp"
#include "sim/run/note_tally.hpp"
#include "sim/run/output_guard.hpp"
#include "sim/run/resume_store.hpp"

#ifdef KVSIM_WITH_MPI
#include <mpi.h>
#endif

namespace kvsim {

namespace {
// Bounds on what one command line may ask for, so that a typo (1:1e9:1) fails at once rather than
// after exhausting memory.
constexpr double kMaxAxisValues = 100000;
constexpr double kMaxConfigurations = 100000;
}  // namespace

namespace fs = std::filesystem;

namespace {

// The values of one range part "start:stop:step" of axis `text` (inclusive stop; all three
// percentages, or none).
std::vector<std::string> range_values(const std::string& part, const std::string& text) {
  const long percents = std::count(part.begin(), part.end(), '%');
  if (percents != 0 && percents != 3)
    throw std::invalid_argument("--grid '" + text + "': range '" + part +
                                "': give start, stop and step all as percentages, or none");
  std::string numbers = part;
  numbers.erase(std::remove(numbers.begin(), numbers.end(), '%'), numbers.end());
  double start = 0, stop = 0, step = 0;
  char c1 = 0, c2 = 0;
  std::istringstream in(numbers);
  if (!(in >> start >> c1 >> stop >> c2 >> step) || !(step > 0) || stop < start ||
      !(in >> std::ws).eof())
    throw std::invalid_argument("--grid '" + text + "': range '" + part +
                                "' needs start:stop:step with step > 0 and stop >= start");
  const double count = std::floor((stop - start) / step + 1e-9) + 1;
  if (!(count <= kMaxAxisValues)) {
    char many[32];
    std::snprintf(many, sizeof many, "%.3g", count);
    throw std::invalid_argument("--grid '" + text + "': the range '" + part + "' has " + many +
                                " values; an axis may have at most " +
                                std::to_string(static_cast<long long>(kMaxAxisValues)));
  }
  std::vector<std::string> values;
  for (long i = 0; i < static_cast<long>(count); ++i) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.10g%s", start + i * step, percents ? "%" : "");
    values.push_back(buf);
  }
  return values;
}

// Refuses a value given twice on one axis, naming it: two runs of one configuration under one
// label would be counted twice in every mean and test.
void refuse_repeats(const GridAxis& a, const std::string& where) {
  std::set<std::string> seen;
  for (const std::string& v : a.values)
    if (!seen.insert(v).second)
      throw std::invalid_argument(where + ": value '" + v + "' of " + a.policy + "." + a.key +
                                  " is given twice; give each value once");
}

}  // namespace

GridAxis parse_grid_axis(const std::string& text) {
  const auto eq = text.find('='), dot = text.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq || dot == 0 ||
      eq + 1 == text.size())
    throw std::invalid_argument("--grid '" + text +
                                "': expected NAME.key=v1,v2,... or NAME.key=start:stop:step");
  GridAxis a{text.substr(0, dot), text.substr(dot + 1, eq - dot - 1), {}};
  const auto parts = std::count(a.key.begin(), a.key.end(), '+') + 1;
  // Values and ranges mix: "5%:40%:5%,60%" is 5%, 10%, ..., 40%, 60%.
  std::stringstream ss(text.substr(eq + 1));
  for (std::string v; std::getline(ss, v, ',');) {
    if (std::count(v.begin(), v.end(), ':') == 2 && parts == 1) {
      for (std::string& r : range_values(v, text)) a.values.push_back(std::move(r));
      continue;
    }
    if (v.empty() || std::count(v.begin(), v.end(), '/') + 1 != parts)
      throw std::invalid_argument("--grid '" + text + "': value '" + v + "' needs " +
                                  std::to_string(parts) + " part(s) separated by '/'");
    a.values.push_back(v);
  }
  if (text.back() == ',')
    throw std::invalid_argument("--grid '" + text + "': an empty value after the last comma");
  refuse_repeats(a, "--grid '" + text + "'");
  return a;
}

std::vector<GridAxis> merge_grid_axes(const std::vector<GridAxis>& axes) {
  std::vector<GridAxis> out;
  for (const GridAxis& a : axes) {
    auto same = std::find_if(out.begin(), out.end(), [&](const GridAxis& o) {
      return o.policy == a.policy && o.key == a.key;
    });
    if (same == out.end()) {
      // A parameter may move on one axis only: on two, one would silently set it for the other.
      std::stringstream keys(a.key);
      for (std::string k; std::getline(keys, k, '+');)
        for (const GridAxis& o : out) {
          if (o.policy != a.policy) continue;
          std::stringstream other(o.key);
          for (std::string ok; std::getline(other, ok, '+');)
            if (ok == k)
              throw std::invalid_argument("--grid " + a.policy + "." + a.key + " and --grid " +
                                          o.policy + "." + o.key + " both move '" + k +
                                          "'; give it on one axis");
        }
      out.push_back(a);
      continue;
    }
    same->values.insert(same->values.end(), a.values.begin(), a.values.end());
    refuse_repeats(*same, "--grid " + a.policy + "." + a.key + " (given on several --grid)");
  }
  return out;
}

namespace {
// "*.key" axes become one axis per swept policy that declares every key.
std::vector<GridAxis> expand_wildcards(const std::vector<std::string>& policies,
                                       const std::vector<GridAxis>& axes) {
  std::vector<GridAxis> out;
  for (const auto& a : axes) {
    if (a.policy != "*") {
      out.push_back(a);
      continue;
    }
    bool any = false;
    for (const auto& name : policies) {
      const auto declared = make_policy_config(name, {}).params.values();
      std::stringstream keys(a.key);
      std::string k;
      bool all = true;
      while (std::getline(keys, k, '+')) all = all && declared.count(k) > 0;
      if (!all) continue;
      out.push_back({name, a.key, a.values});
      any = true;
    }
    if (!any)
      throw std::invalid_argument("--grid *." + a.key + ": no swept policy has parameter '" +
                                  a.key + "'");
  }
  return out;
}
}  // namespace

namespace {
// "name[key=value,...]" from the values the configuration holds for its axes' keys (what runs;
// a key the policy turns into another, compression_ratio into budget, as given), a coupled axis
// as "k1+k2=v1/v2".
std::string grid_label(const std::string& name, const std::vector<GridAxis>& axes,
                       const std::vector<std::size_t>& index, const PolicyConfig& c) {
  if (axes.empty()) return name;
  const auto& held_values = c.params.values();
  std::string label = name;
  for (std::size_t i = 0; i < axes.size(); ++i) {
    std::stringstream keys(axes[i].key), given(axes[i].values[index[i]]);
    std::string held;
    for (std::string k, v; std::getline(keys, k, '+') && std::getline(given, v, '/');) {
      const auto it = held_values.find(k);
      held += (held.empty() ? "" : "/") + (it != held_values.end() ? it->second : v);
    }
    label += (i == 0 ? "[" : ",") + axes[i].key + "=" + held;
  }
  return label + "]";
}
}  // namespace

namespace {

// One request per configuration of `policies` over the axes that name them (what expand_grid
// builds), each with the fixed values and its grid point's, labelled by grid_label.
std::vector<PolicyRequest> grid_requests(const std::vector<std::string>& policies,
                                         const std::vector<GridAxis>& given_axes,
                                         const PolicyOverrides& fixed) {
  const std::vector<GridAxis> axes = merge_grid_axes(expand_wildcards(policies, given_axes));
  for (const auto& a : axes)
    if (std::find(policies.begin(), policies.end(), a.policy) == policies.end())
      throw std::invalid_argument("--grid " + a.policy + "." + a.key + ": policy '" + a.policy +
                                  "' is not swept (add --policy " + a.policy + ")");
  double total = 0;
  for (const auto& name : policies) {
    double n = 1;
    for (const auto& a : axes) n *= a.policy == name ? static_cast<double>(a.values.size()) : 1.0;
    total += n;
  }
  if (total > kMaxConfigurations) {
    char many[32];
    std::snprintf(many, sizeof many, "%.3g", total);
    throw std::invalid_argument(std::string("--grid: the axes make ") + many +
                                " configurations; a sweep may have at most " +
                                std::to_string(static_cast<long long>(kMaxConfigurations)));
  }
  std::vector<PolicyRequest> out;
  for (const auto& name : policies) {
    std::vector<GridAxis> mine;  // the policy's axes (each label holds a copy)
    for (const auto& a : axes)
      if (a.policy == name) mine.push_back(a);
    std::vector<std::size_t> index(mine.size(), 0);
    while (true) {
      PolicyRequest r{.name = name};
      if (const auto it = fixed.find(name); it != fixed.end()) r.chosen = it->second;
      for (std::size_t i = 0; i < mine.size(); ++i) {
        std::stringstream keys(mine[i].key), values(mine[i].values[index[i]]);
        std::string k, v;
        while (std::getline(keys, k, '+') && std::getline(values, v, '/')) r.chosen[k] = v;
      }
      r.label = [name, mine, index](const PolicyConfig& c) {
        return grid_label(name, mine, index, c);
      };
      out.push_back(std::move(r));
      std::size_t i = 0;  // odometer over the axes
      while (i < mine.size() && ++index[i] == mine[i].values.size()) index[i++] = 0;
      if (i == mine.size()) break;
    }
  }
  return out;
}

}  // namespace

std::vector<PolicyConfig> expand_grid(const std::vector<std::string>& policies,
                                      const std::vector<GridAxis>& axes,
                                      const PolicyOverrides& fixed) {
  return build_policy_list(grid_requests(policies, axes, fixed), {}, {});
}

std::vector<PolicyConfig> sweep_configs(const std::vector<std::string>& policies,
                                        const std::vector<std::string>& grids,
                                        const std::vector<std::string>& sets,
                                        const std::string& budget,
                                        const SweepConfigOptions& options) {
  std::vector<GridAxis> axes;
  for (const auto& g : grids) axes.push_back(parse_grid_axis(g));
  PolicyOverrides fixed;
  for (const auto& s : sets) apply_set_option(s, fixed);
  if (const std::string w = expand_wildcard_sets(fixed, policies); !w.empty())
    std::fprintf(stderr, "kvsim: warning: %s\n", w.c_str());
  // --seeds: a seed axis for every policy that draws and is given no seed.
  if (options.seeds > 1) {
    PolicyOverrides chosen = fixed;  // the keys --set and the grid give each policy
    for (const auto& axis : expand_wildcards(policies, axes)) {
      std::stringstream keys(axis.key);
      for (std::string k; std::getline(keys, k, '+');) chosen[axis.policy][k] = "";
    }
    for (const auto& name : policies)
      if (policy_declares(name, "seed") && !chosen[name].count("seed")) {
        GridAxis seeds{name, "seed", {}};
        for (int k = 0; k < options.seeds; ++k) seeds.values.push_back(std::to_string(k));
        axes.push_back(seeds);
      }
  }
  // A grid axis on the budget wins over --budget: a request's own budget is kept.
  return build_policy_list(
      grid_requests(policies, axes, fixed),
      {.budget = budget, .seeds = 1, .equal_memory = options.equal_memory},
      [](const std::string& w) { std::fprintf(stderr, "kvsim: %s\n", w.c_str()); });
}

std::string file_content_hash(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open for hashing");
  // Four independent lanes over 8-byte words, so the multiplications overlap (a byte-serial FNV-1a
  // chain hashed the demo's 528 MiB in ~0.7 s; this runs at the speed of reading it). The rotation
  // carries high bits down; splitmix64's finaliser mixes the lanes and the length.
  constexpr std::uint64_t kPrime = 1099511628211ull;
  std::uint64_t lane[4] = {kStoreKeyOffset, 1ull, 2ull, 3ull}, length = 0;
  std::vector<char> buf(1 << 20);  // a multiple of 32: only the last read leaves a tail
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto n = static_cast<std::size_t>(in.gcount());
    length += n;
    std::size_t i = 0;
    for (; i + 32 <= n; i += 32)
      for (int k = 0; k < 4; ++k) {
        std::uint64_t w;
        std::memcpy(&w, &buf[i + 8 * k], 8);
        const std::uint64_t x = (lane[k] ^ w) * kPrime;
        lane[k] = (x << 31) | (x >> 33);
      }
    for (; i < n; ++i) lane[0] = (lane[0] ^ static_cast<unsigned char>(buf[i])) * kPrime;
  }
  std::uint64_t h = length;
  for (std::uint64_t l : lane) h = splitmix_mix(h ^ l);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

namespace {

std::string num(double x) {
  std::string out;
  append_float(out, x);  // the result files' number format (empty for NaN)
  return out;
}

// Item files hold the measurements only; the results file prefixes them with who made them.
const char* kItemHeader =
    "layer,kv_head,steps,mean_cache_size,mean_attended_size,mean_mass_recall,min_mass_recall,"
    "mean_output_rel_error,mean_output_value_error,mean_kv_bytes,peak_cache_size\n";
const char* kPrefixHeader = "trace,trace_hash,sample,label,policy,params,";
// After an item's rows: one line per distinct note the policy made on the sample (Policy::notes).
const char* kItemNote = "#note ";

// A parameter's column in the results file: its name, unless a fixed column has it.
std::string parameter_column(const std::string& key) {
  static const std::set<std::string> fixed = {
      "trace",          "trace_hash",      "sample", "label",   "policy", "params",
      "budget_entries", "budget_fraction", "layer",  "kv_head", "steps"};
  return fixed.count(key) || key.rfind("mean_", 0) == 0 || key.rfind("min_", 0) == 0
             ? "param_" + key
             : key;
}

// One configuration's item rows (kItemHeader's columns, read back by name), summed per (trace,
// sample): the table printed at the end of a sweep pools them and resamples the samples for its
// intervals. It reads the item files, so items finished by an earlier run count alike.
struct ConfigMeans {
  struct Sums {
    double cache = 0, recall = 0, err = 0;
    long rows = 0, err_rows = 0;
  };
  std::map<std::string, Sums> by_sample;
  // The peak entries held (stored minus the step's own token) per (layer, KV head) over the
  // budget, averaged over a sample's rows; the sample furthest from 1.
  std::map<std::string, std::pair<double, long>> held;  // sample -> Σ peak held, rows
  // A row without decode steps (a sample that generates nothing) measures nothing: its sample
  // counts in n, as in replay's table, and adds to no mean.
  void add(const std::string& sample, const CsvTable& rows, int budget) {
    const std::vector<double> steps = rows.numbers("steps"),
                              cache = rows.numbers("mean_cache_size"),
                              recall = rows.numbers("mean_mass_recall"),
                              err = rows.numbers("mean_output_rel_error"),
                              peak = rows.numbers("peak_cache_size");
    for (std::size_t i = 0; i < steps.size(); ++i) {
      Sums& s = by_sample[sample];
      if (!(steps[i] > 0)) continue;
      s.cache += cache[i], s.recall += recall[i], ++s.rows;
      if (!std::isnan(err[i])) s.err += err[i], ++s.err_rows;
      if (budget <= 0 || std::isnan(peak[i])) continue;
      auto& h = held[sample];
      h.first += (peak[i] - 1) / budget, ++h.second;
    }
  }
  double worst_held() const {
    double worst = NAN;
    for (const auto& [sample, h] : held) {
      const double r = h.first / h.second;
      if (std::isnan(worst) || std::fabs(r - 1) > std::fabs(worst - 1)) worst = r;
    }
    return worst;
  }
  void merge(const ConfigMeans& o) {
    for (const auto& [k, v] : o.held) {
      auto& h = held[k];
      h.first += v.first, h.second += v.second;
    }
    for (const auto& [k, v] : o.by_sample) {
      Sums& s = by_sample[k];
      s.cache += v.cache, s.recall += v.recall, s.err += v.err;
      s.rows += v.rows, s.err_rows += v.err_rows;
    }
  }
};

// Per configuration (the runs of one policy over seeds pooled): samples, mean cache, recall and
// output error, each mean with its 95% bootstrap interval over samples.
std::string means_table(const std::vector<PolicyConfig>& configs,
                        const std::vector<ConfigMeans>& means) {
  std::vector<std::pair<std::string, ConfigMeans>> rows;
  std::map<std::string, int> seeds;
  for (std::size_t i = 0; i < configs.size(); ++i) {
    const std::string group = seed_group_of(configs[i].label);
    const std::string name = group.empty() ? configs[i].label : group;
    auto it =
        std::find_if(rows.begin(), rows.end(), [&](const auto& r) { return r.first == name; });
    if (it == rows.end()) it = rows.insert(rows.end(), {name, ConfigMeans{}});
    it->second.merge(means[i]);
    ++seeds[name];
  }
  std::size_t width = 6;
  for (const auto& [name, _] : rows) width = std::max(width, name.size() + 10);
  char line[512];
  std::snprintf(line, sizeof line, "%-*s %4s %10s %7s %8s %13s %11s %13s\n",
                static_cast<int>(width), "config", "n", "mean_cache", "held/B", "recall",
                "recall_95%", "out_rel_err", "out_rel_95%");
  std::string out = line;
  std::size_t most = 0;
  bool flagged = false;
  for (const auto& [name, m] : rows) {
    ConfigMeans::Sums t;
    std::vector<double> recall, count, err, err_count;
    for (const auto& [sample, s] : m.by_sample) {
      t.cache += s.cache, t.recall += s.recall, t.err += s.err;
      t.rows += s.rows, t.err_rows += s.err_rows;
      if (s.rows) recall.push_back(s.recall), count.push_back(static_cast<double>(s.rows));
      if (s.err_rows) err.push_back(s.err), err_count.push_back(static_cast<double>(s.err_rows));
    }
    most = std::max(most, m.by_sample.size());
    const std::string label = seed_group_text(name, seeds[name]);
    const std::string held = held_over_budget_cell(m.worst_held(), flagged);
    std::snprintf(line, sizeof line, "%-*s %4zu %10.1f %7s %8.4f %13s %11.4f %13s\n",
                  static_cast<int>(width), label.c_str(), m.by_sample.size(),
                  t.rows ? t.cache / t.rows : NAN, held.c_str(), t.rows ? t.recall / t.rows : NAN,
                  interval_text(bootstrap_ratio(recall, count)).c_str(),
                  t.err_rows ? t.err / t.err_rows : NAN,
                  interval_text(bootstrap_ratio(err, err_count)).c_str());
    out += line;
  }
  if (flagged) out += kHeldFootnote;
  out += most < 2 ? "n = 1 sample: no intervals (the 95% intervals resample samples)\n"
                  : "n: samples (trace, sample); 95% intervals: percentile bootstrap over them\n";
  return out;
}

// One configuration's rows for one layer: means over the decode steps of each KV head (the sums
// replay's summary takes, StepSums), and the peak entries stored.
std::string layer_rows(const LayerResult& r) {
  std::string out;
  for (std::size_t g = 0; g < r.steps.size(); ++g) {
    StepSums sums;
    int peak = -1;
    for (const auto& m : r.steps[g]) {
      sums.add(m);
      peak = std::max(peak, m.cache_size);
    }
    const double n = static_cast<double>(sums.count);
    const auto mean = [n](double x) { return num(n ? x / n : NAN); };
    const auto error_mean = [&](double x) {
      return num(sums.error_count ? x / sums.error_count : NAN);
    };
    out += std::to_string(r.layer) + "," + std::to_string(g) + "," + std::to_string(sums.count) +
           "," + mean(sums.cache) + "," + mean(sums.attended) + "," + mean(sums.recall) + "," +
           num(n ? sums.min_recall : NAN) + "," + error_mean(sums.error) + "," +
           error_mean(sums.value_error) + "," + mean(sums.kv_bytes) + "," +
           (peak < 0 ? std::string() : std::to_string(peak)) + "\n";
  }
  return out;
}

// Replayer::validate over every trace: one error listing every offender, and the notes.
void validate_configurations(const std::vector<std::string>& traces,
                             const std::vector<PolicyConfig>& configs, const SweepOptions& o) {
  std::string errors;
  std::set<std::string> notes;
  for (const auto& t : traces) {
    TraceReader reader(t);
    try {
      for (const auto& [label, list] :
           Replayer(reader, configs, {.threads = 1})
               .validate(o.samples.empty() ? reader.sample_names() : o.samples))
        for (const auto& n : list) notes.insert(t + ": " + n);
    } catch (const std::invalid_argument& e) {
      errors += std::string(errors.empty() ? "" : "\n") + t + ": " + e.what();
    }
  }
  if (!errors.empty()) throw std::invalid_argument(errors);
  if (o.on_note)
    for (const auto& n : notes) o.on_note(n);
}

// One (trace, sample) of a sweep: all its configurations replay together.
struct SweepItem {
  std::string trace, hash, sample;
  int prompt_len = 0, layers = 0;
  double layer_bytes = 0;  // one layer's tensors in flight (layer_tensor_bytes)
};

std::vector<SweepItem> list_items(const std::vector<std::string>& traces,
                                  const std::vector<std::string>& samples) {
  std::vector<SweepItem> items;
  for (const auto& t : traces) {
    TraceReader reader(t);
    const std::string hash = file_content_hash(t);
    for (const auto& s : samples.empty() ? reader.sample_names() : samples) {
      const SampleInfo sample = reader.read_sample(s);
      items.push_back({t, hash, s, sample.prompt_len, reader.info().num_layers,
                       layer_tensor_bytes(reader.info(), sample)});
    }
  }
  return items;
}

// The file name of one (trace, sample, configuration). The item format is part of the key: a
// finished item of another format is not reused.
std::string item_key(const SweepItem& it, const PolicyConfig& c) {
  return hex16(fnv1a64(it.hash + "\n" + it.sample + "\n" + c.info->name + "\n" + c.params.str() +
                           "\n" KVSIM_VERSION "\n" + kItemHeader,
                       kStoreKeyOffset));
}

// The sweep's finished work: per (item, configuration) its item file, `KEY.csv` (item_key), and
// per (trace, sample) being replayed its progress (progress_key).
ResumeStore prepare_items(const std::string& out_dir) {
  ResumeStore items((fs::path(out_dir) / "items").string(),
                    "--out " + out_dir + ": cannot write there: ");
  check_writable(items.path("probe"), "--out");
  return items;
}

// What one configuration of an item has measured so far: the rows of its first `layers` layers
// and the distinct notes it made on them.
struct ItemProgress {
  int layers = 0;
  std::string rows;
  std::vector<std::string> notes;

  void add(const LayerResult& r) {
    rows += layer_rows(r);
    for (const std::string& n : r.notes) {
      const std::string line = note_on_one_line(n);
      if (std::find(notes.begin(), notes.end(), line) == notes.end()) notes.push_back(line);
    }
  }
  // The item file's text: header, rows, one kItemNote line per note.
  std::string text() const {
    std::string out = std::string(kItemHeader) + rows;
    for (const std::string& n : notes) out += kItemNote + n + "\n";
    return out;
  }
};

// While a (trace, sample) replays, its configurations' progress is kept in one progress file
// (rewritten atomically after every layer, so a resumed sweep loses at most the layer in flight):
// kProgressHead, then per configuration a line "#item KEY LAYERS" followed by its item file's text
// of those layers without the header.
const char* kProgressHead = "kvsim sweep progress of a (trace, sample)\n";
const char* kProgressItem = "#item ";

std::string progress_key(const SweepItem& it) {
  return hex16(fnv1a64(
             it.hash + "\n" + it.sample + "\n" KVSIM_VERSION "\n" + kItemHeader + kProgressHead,
             kStoreKeyOffset)) +
         ".progress";
}

std::string progress_text(const std::vector<std::string>& keys,
                          const std::vector<ItemProgress>& done) {
  std::string out = kProgressHead;
  for (std::size_t c = 0; c < keys.size(); ++c) {
    if (done[c].layers == 0) continue;
    out += kProgressItem + keys[c] + " " + std::to_string(done[c].layers) + "\n" + done[c].rows;
    for (const std::string& n : done[c].notes) out += kItemNote + n + "\n";
  }
  return out;
}

// The layers an interrupted run finished of each configuration (by item key) of an item of
// `layers` layers, from its progress text: none when there is none or it is not one this format
// wrote (the item is then replayed whole), and none for a configuration it lacks.
std::map<std::string, ItemProgress> read_progress(const std::optional<std::string>& kept,
                                                  int layers) {
  std::map<std::string, ItemProgress> found;
  if (!kept) return {};
  const std::string& text = *kept;
  if (text.rfind(kProgressHead, 0) != 0) return {};
  std::istringstream lines(text.substr(std::char_traits<char>::length(kProgressHead)));
  ItemProgress* current = nullptr;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(kProgressItem, 0) == 0) {
      std::istringstream head(line.substr(std::char_traits<char>::length(kProgressItem)));
      std::string key;
      int done = 0;
      if (!(head >> key >> done) || done <= 0 || done >= layers) return {};
      current = &(found[key] = ItemProgress{});  // configurations alike share a key
      current->layers = done;
    } else if (!current) {
      return {};
    } else if (line.rfind(kItemNote, 0) == 0) {
      current->notes.push_back(line.substr(std::char_traits<char>::length(kItemNote)));
    } else {
      current->rows += line + "\n";
    }
  }
  return found;
}

// Replays one item's configurations `run` (item keys `keys`) together, each from the layer
// `done` says it reached, keeping their progress in `items` after every layer: per
// configuration, its item file's text (its rows, then one kItemNote line per distinct note).
std::vector<std::string> replay_item(const SweepItem& it, const std::vector<PolicyConfig>& run,
                                     const std::vector<std::string>& keys,
                                     std::vector<ItemProgress> done, const ResumeStore& items,
                                     int threads, const std::function<void()>& on_layer) {
  TraceReader reader(it.trace);
  std::vector<int> first_layers;
  for (const ItemProgress& p : done) first_layers.push_back(p.layers);
  Replayer(reader, run, {.threads = threads})
      .replay_sample(
          it.sample, [&](const LayerResult& r) { done[r.policy_index].add(r); },
          [&](int l) {
            for (std::size_t c = 0; c < run.size(); ++c)
              if (first_layers[c] <= l) done[c].layers = l + 1;
            if (l + 1 < it.layers) items.write(progress_key(it), progress_text(keys, done));
            on_layer();
          },
          first_layers);
  std::vector<std::string> text;
  for (const ItemProgress& p : done) text.push_back(p.text());
  return text;
}

#ifdef KVSIM_WITH_MPI
// Under mpirun with more than one rank: rank 0 hands out the items with work one at a time
// (dynamic load balancing), the others replay them; returns false on a single process. Item
// files are keyed and atomic, so the order of completion is irrelevant.
bool run_items_over_ranks(std::size_t items, const std::vector<std::vector<std::size_t>>& todo,
                          const std::function<void(std::size_t)>& run_item,
                          const std::function<void(long, long)>& progress, long& items_run,
                          bool& writes_results) {
  int ranks = 1, rank = 0, initialized = 0;
  MPI_Initialized(&initialized);  // library callers (tests) run without MPI_Init: one process
  if (initialized) {
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  }
  if (ranks <= 1) return false;
  enum { kRequest = 1, kAssign = 2 };
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    std::size_t next = 0;
    for (int active = ranks - 1; active > 0;) {
      int dummy = 0;
      MPI_Status st;
      MPI_Recv(&dummy, 1, MPI_INT, MPI_ANY_SOURCE, kRequest, MPI_COMM_WORLD, &st);
      while (next < items && todo[next].empty()) ++next;
      int assign = next < items ? static_cast<int>(next++) : -1;
      if (assign < 0) --active;
      if (assign >= 0 && progress) progress(assign + 1, static_cast<long>(items));
      MPI_Send(&assign, 1, MPI_INT, st.MPI_SOURCE, kAssign, MPI_COMM_WORLD);
    }
  } else {
    for (;;) {
      int dummy = 0, assign = -1;
      MPI_Send(&dummy, 1, MPI_INT, 0, kRequest, MPI_COMM_WORLD);
      MPI_Recv(&assign, 1, MPI_INT, 0, kAssign, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      if (assign < 0) break;
      run_item(static_cast<std::size_t>(assign));
    }
  }
  long run_here = items_run;
  MPI_Reduce(&run_here, &items_run, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);  // every item file is in place
  writes_results = rank == 0;   // rank 0 writes the results file
  return true;
}
#endif

// The results file from every item of this sweep, in a fixed order (trace, sample,
// configuration), notes.csv beside it, and the report's notes and table.
void assemble_results(const std::vector<SweepItem>& items, const std::vector<PolicyConfig>& configs,
                      const ResumeStore& store, const std::string& out_dir, SweepReport& report) {
  std::set<std::string> keys;  // one column per parameter of any configuration
  for (const auto& c : configs)
    for (const auto& kv : c.params.values()) keys.insert(kv.first);
  std::string all = std::string(kPrefixHeader) + "budget_entries,budget_fraction,";
  for (const auto& k : keys) all += parameter_column(k) + ",";
  all += kItemHeader;
  std::vector<ConfigMeans> means(configs.size());
  NoteTally noted;
  std::string notes_csv = "trace,sample,label,note\n";
  for (const auto& it : items)
    for (std::size_t ci = 0; ci < configs.size(); ++ci) {
      const PolicyConfig& c = configs[ci];
      const int entries = budget_entries(c, it.prompt_len);
      std::string prefix =
          csv_quote(it.trace) + "," + it.hash + "," + csv_quote(it.sample) + "," +
          csv_quote(c.label) + "," + c.info->name + "," + csv_quote(c.params.str()) + "," +
          (entries < 0 ? ","
                       : std::to_string(entries) + "," +
                             num(static_cast<double>(entries) / it.prompt_len) + ",");
      for (const auto& k : keys) {
        const auto v = c.params.values().find(k);
        prefix += (v == c.params.values().end() ? "" : csv_quote(v->second)) + ",";
      }
      const std::string key = item_key(it, c) + ".csv";
      std::istringstream in(store.read(key));
      std::string line, table;
      std::getline(in, table);  // header
      table += "\n";
      while (std::getline(in, line)) {
        if (line.rfind(kItemNote, 0) == 0) {
          const std::string note = line.substr(std::char_traits<char>::length(kItemNote));
          noted.add(static_cast<int>(ci), it.trace + "\n" + it.sample, note);
          notes_csv += csv_quote(it.trace) + "," + csv_quote(it.sample) + "," + csv_quote(c.label) +
                       "," + csv_quote(note) + "\n";
          continue;
        }
        all += prefix + line + "\n";
        table += line + "\n";
      }
      means[ci].add(it.trace + "\n" + it.sample, parse_csv_table(table, store.path(key)), entries);
    }
  write_file_atomically((fs::path(out_dir) / "results.csv").string(), all);
  write_file_atomically((fs::path(out_dir) / "notes.csv").string(), notes_csv);
  for (const auto& [config, note] : noted.lines(items.size()))
    report.notes.push_back(configs[config].label + ": " + note);
  report.table = means_table(configs, means);
}

// What is left of a sweep: per item, the configurations without an item file (counting the
// others as done and those a progress file resumes) and what its progress file kept; the items
// with work, their layers and the largest layer's bytes.
struct SweepPlan {
  std::vector<std::vector<std::size_t>> todo;             // [item]: configuration indices
  std::vector<std::map<std::string, ItemProgress>> kept;  // [item]: by item key
  std::vector<std::size_t> pending;                       // items with work
  long layers_total = 0;
  double largest_layer = 0;
};

SweepPlan plan_sweep(const std::vector<SweepItem>& items, const std::vector<PolicyConfig>& configs,
                     const ResumeStore& store, SweepReport& report) {
  SweepPlan plan;
  plan.todo.resize(items.size());
  plan.kept.resize(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    for (std::size_t c = 0; c < configs.size(); ++c)
      if (store.has(item_key(items[i], configs[c]) + ".csv"))
        ++report.items_done_before;
      else
        plan.todo[i].push_back(c);
    if (plan.todo[i].empty()) continue;
    plan.kept[i] = read_progress(store.try_read(progress_key(items[i])), items[i].layers);
    for (std::size_t c : plan.todo[i]) {
      const auto found = plan.kept[i].find(item_key(items[i], configs[c]));
      if (found == plan.kept[i].end()) continue;
      ++report.items_resumed;
      report.layers_resumed += found->second.layers;
      report.layers_of_resumed += items[i].layers;
    }
    plan.pending.push_back(i);
    plan.layers_total += items[i].layers;
    plan.largest_layer = std::max(plan.largest_layer, items[i].layer_bytes);
  }
  return plan;
}

// The configurations `todo` of item `it` as one replay: their item keys and the layers its
// progress file kept of each (`kept`).
struct ItemRun {
  std::vector<PolicyConfig> configs;
  std::vector<std::string> keys;
  std::vector<ItemProgress> done;
};

ItemRun item_run(const SweepItem& it, const std::vector<PolicyConfig>& configs,
                 const std::vector<std::size_t>& todo,
                 const std::map<std::string, ItemProgress>& kept) {
  ItemRun run;
  for (std::size_t c : todo) {
    run.configs.push_back(configs[c]);
    run.keys.push_back(item_key(it, configs[c]));
    const auto found = kept.find(run.keys.back());
    run.done.push_back(found == kept.end() ? ItemProgress{} : found->second);
  }
  return run;
}

}  // namespace

namespace {

// The results and notes files may not overwrite a trace (checked before any work).
void check_sweep_outputs(const std::string& out_dir, const std::vector<std::string>& traces) {
  std::vector<InputPath> inputs;
  for (const std::string& t : traces) inputs.push_back({t, "trace"});
  check_outputs({{(fs::path(out_dir) / "results.csv").string(), "--out's results.csv"},
                 {(fs::path(out_dir) / "notes.csv").string(), "--out's notes.csv"}},
                inputs);
}

// What an interrupt keeps: every item finished so far (they are written as each (trace, sample)
// ends), and the finished layers of those being replayed.
std::string kept_note(const SweepReport& report, const std::string& dir) {
  return std::to_string(report.items_done_before + report.items_run) + " of " +
         std::to_string(report.items_total) + " items (trace, sample, configuration) are kept in " +
         dir +
         ", and the finished layers of the (trace, sample)s being replayed; rerun the same command "
         "to resume";
}

}  // namespace

SweepReport run_sweep(const std::vector<std::string>& traces,
                      const std::vector<PolicyConfig>& configs, const SweepOptions& o,
                      const std::function<void(long, long)>& progress) {
  validate_configurations(traces, configs, o);  // before anything is written
  const ResumeStore store = prepare_items(o.out_dir);
  check_sweep_outputs(o.out_dir, traces);
  const std::vector<SweepItem> items = list_items(traces, o.samples);
  SweepReport report;
  report.items_total = static_cast<long>(items.size() * configs.size());
  const SweepPlan plan = plan_sweep(items, configs, store, report);
  long layers_done = 0;
  // Items side by side, each on a share of the threads, as Replayer::replay_samples runs samples:
  // they are independent, so this scales where one sample's heads and configurations run out (and
  // on two threads beats one pipelined item at a time).
  const int side_by_side =
      samples_side_by_side(o.threads, static_cast<int>(plan.pending.size()), plan.largest_layer,
                           ReplayOptions{}.prefetch_limit_bytes);
  int item_threads = o.threads;  // MPI ranks run their items one at a time
  std::mutex report_mutex;       // progress and the report, from side-by-side items
  auto note_kept = [&] { set_interrupt_note(kept_note(report, store.dir())); };
  note_kept();
  auto run_item = [&](std::size_t i) {
    ItemRun run = item_run(items[i], configs, plan.todo[i], plan.kept[i]);
    const std::vector<std::string> text =
        replay_item(items[i], run.configs, run.keys, std::move(run.done), store, item_threads, [&] {
          const std::lock_guard<std::mutex> lock(report_mutex);
          if (progress) progress(++layers_done, plan.layers_total);
        });
    // Counted as each is stored, so that an interrupt's count lags the files by at most one.
    for (std::size_t c = 0; c < run.keys.size(); ++c) {
      store.write(run.keys[c] + ".csv", text[c]);
      const std::lock_guard<std::mutex> lock(report_mutex);
      ++report.items_run;
      note_kept();
    }
    store.remove(progress_key(items[i]));  // one left behind is ignored once its items exist
  };
  bool distributed = false, writes_results = true;
#ifdef KVSIM_WITH_MPI
  distributed = run_items_over_ranks(items.size(), plan.todo, run_item, progress, report.items_run,
                                     writes_results);
#endif
  if (!distributed) {
    item_threads = std::max(1, o.threads / side_by_side);
    parallel_for(static_cast<int>(plan.pending.size()), side_by_side,
                 [&](int p) { run_item(plan.pending[p]); });
  }
  if (!writes_results) return report;
  set_interrupt_note("");
  assemble_results(items, configs, store, o.out_dir, report);
  return report;
}

}  // namespace kvsim
