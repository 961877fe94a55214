#include "sim/replay/results.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>

#include "core/partial_files.hpp"
#include "sim/replay/step_metric.hpp"

namespace kvsim {

std::string StepCsvWriter::header() {
  std::string h =
      "policy,sample,layer,kv_head,step,position,cache_size,attended_size,mass_recall,"
      "output_rel_error,output_value_error,kv_bytes";
  for (const MetricColumn& c : observed_columns()) h += "," + c.name;
  return h + "\n";
}

StepCsvWriter::StepCsvWriter(const std::string& path, const std::vector<PolicyConfig>& policies)
    : path_(path), file_(open_partial(path)) {
  for (const auto& p : policies) labels_.push_back(p.label);
  for (const MetricColumn& c : observed_columns()) counts_.push_back(c.count);
  std::fputs(header().c_str(), file_);
}

StepCsvWriter::~StepCsvWriter() {
  if (file_) std::fclose(file_);
}

void StepCsvWriter::write(const LayerResult& r) {
  const std::string prefix = csv_quote(labels_[r.policy_index]) + "," + csv_quote(r.sample) + "," +
                             std::to_string(r.layer) + ",";
  for (std::size_t g = 0; g < r.steps.size(); ++g) {
    for (std::size_t t = 0; t < r.steps[g].size(); ++t) {
      const StepMetrics& m = r.steps[g][t];
      buffer_ += prefix;
      buffer_ += std::to_string(g) + "," + std::to_string(t) + ",";
      buffer_ += std::to_string(m.position) + ",";
      buffer_ += std::to_string(m.cache_size) + "," + std::to_string(m.attended_size) + ",";
      append_float(buffer_, m.mass_recall);
      buffer_ += ",";
      append_float(buffer_, m.output_rel_error);
      buffer_ += ",";
      append_float(buffer_, m.output_value_error);
      buffer_ += "," + std::to_string(m.kv_bytes);
      // A result made without the metrics (none ran) leaves their cells empty.
      const float* observed =
          r.observed.empty() ? nullptr : r.observed[g].data() + t * r.observed_columns;
      for (std::size_t c = 0; c < counts_.size(); ++c) {
        buffer_ += ",";
        const float x = observed ? observed[c] : NAN;
        if (!counts_[c])
          append_float(buffer_, x);
        else if (!std::isnan(x))
          buffer_ += std::to_string(static_cast<long>(x));
      }
      buffer_ += "\n";
    }
  }
  if (buffer_.size() > (1 << 20)) {
    std::fwrite(buffer_.data(), 1, buffer_.size(), file_);
    buffer_.clear();
  }
}

void StepCsvWriter::close() {
  if (!file_) return;
  std::fwrite(buffer_.data(), 1, buffer_.size(), file_);
  buffer_.clear();
  const bool failed = std::ferror(file_) != 0;
  const bool close_failed = std::fclose(file_) != 0;
  file_ = nullptr;
  if (failed || close_failed) throw std::runtime_error(path_ + ": write failed (disk full?)");
  publish(path_);
}

std::string policies_sidecar_path(const std::string& csv_path) {
  std::string stem = csv_path;
  if (stem.size() > 4 && stem.compare(stem.size() - 4, 4, ".csv") == 0)
    stem.resize(stem.size() - 4);
  return stem + ".policies.csv";
}

void write_policies_sidecar(const std::string& csv_path, const std::vector<PolicyConfig>& policies,
                            const std::map<std::string, std::vector<std::string>>& notes) {
  std::string out = "label,policy,lookahead,params,notes\n";
  for (const auto& p : policies) {
    std::string joined;
    if (const auto it = notes.find(p.label); it != notes.end())
      for (const std::string& n : it->second) joined += (joined.empty() ? "" : "; ") + n;
    out += csv_quote(p.label) + "," + p.info->name + "," + (p.info->lookahead ? "true" : "false") +
           "," + csv_quote(p.params.str()) + "," + csv_quote(joined) + "\n";
  }
  write_whole(policies_sidecar_path(csv_path), out);
}

void StepSums::add(const StepMetrics& m) {
  cache += m.cache_size;
  attended += m.attended_size;
  recall += m.mass_recall;
  min_recall = std::min(min_recall, static_cast<double>(m.mass_recall));
  kv_bytes += m.kv_bytes;
  ++count;
  if (!std::isnan(m.output_rel_error)) {
    error += m.output_rel_error;
    value_error += m.output_value_error;
    ++error_count;
  }
}

void StepSums::merge(const StepSums& a) {
  cache += a.cache;
  attended += a.attended;
  recall += a.recall;
  error += a.error;
  value_error += a.value_error;
  kv_bytes += a.kv_bytes;
  min_recall = std::min(min_recall, a.min_recall);
  prefill_kept += a.prefill_kept;
  count += a.count;
  error_count += a.error_count;
}

void Summary::add(const LayerResult& r) {
  StepSums& layer = per_layer_[{r.policy_index, r.sample, r.layer}];
  for (const auto& head : r.steps)
    for (const auto& m : head) layer.add(m);
  layer.prefill_kept += r.prefill_kept_min;
  PerSample& sample = per_sample_[{r.policy_index, r.sample}];
  if (r.layer == 0 && !r.steps.empty()) sample.steps = static_cast<long>(r.steps[0].size());
  sample.budget = r.budget_entries;
  ++sample.layers;
  sample.cache_heads = static_cast<int>(r.steps.size());
  for (const auto& head : r.steps) {
    if (sample.held_by_step.size() < head.size()) sample.held_by_step.resize(head.size(), 0);
    for (std::size_t t = 0; t < head.size(); ++t) sample.held_by_step[t] += head[t].cache_size - 1;
  }
}

long Summary::PerSample::peak_held() const {
  long peak = peak_restored;
  for (long h : held_by_step) peak = std::max(peak, h);
  return peak;
}

std::map<int, Summary::Total> Summary::totals() const {
  std::map<int, Total> out;
  for (const auto& [key, acc] : per_layer_) {
    Total& t = out[std::get<0>(key)];
    t.acc.merge(acc);
    ++t.layers;
  }
  for (const auto& [key, s] : per_sample_) out[key.first].steps += s.steps;
  return out;
}

std::string Summary::sample_state(const std::string& sample) const {
  std::string out;
  char line[512];
  for (const auto& [key, a] : per_layer_) {
    if (std::get<1>(key) != sample) continue;
    std::snprintf(line, sizeof line, "layer %d %d %ld %ld %a %a %a %a %a %a %a %a\n",
                  std::get<0>(key), std::get<2>(key), a.count, a.error_count, a.cache, a.attended,
                  a.recall, a.error, a.value_error, a.kv_bytes, a.min_recall, a.prefill_kept);
    out += line;
  }
  for (const auto& [key, s] : per_sample_) {
    if (key.second != sample) continue;
    std::snprintf(line, sizeof line, "sample %d %ld %d %ld %d %d\n", key.first, s.steps, s.budget,
                  s.peak_held(), s.layers, s.cache_heads);
    out += line;
  }
  return out;
}

void Summary::add_sample_state(const std::string& sample, const std::string& state,
                               const std::string& origin) {
  std::istringstream in(state);
  std::string line;
  const int policies = static_cast<int>(policies_.size());
  while (std::getline(in, line)) {
    int policy = -1, layer = -1, budget = -1, layers = 0, cache_heads = 0;
    long steps = 0, peak = -1;
    StepSums a;
    if (std::sscanf(line.c_str(), "layer %d %d %ld %ld %la %la %la %la %la %la %la %la", &policy,
                    &layer, &a.count, &a.error_count, &a.cache, &a.attended, &a.recall, &a.error,
                    &a.value_error, &a.kv_bytes, &a.min_recall, &a.prefill_kept) == 12 &&
        policy >= 0 && policy < policies && layer >= 0) {
      per_layer_[{policy, sample, layer}] = a;
    } else if (std::sscanf(line.c_str(), "sample %d %ld %d %ld %d %d", &policy, &steps, &budget,
                           &peak, &layers, &cache_heads) == 6 &&
               policy >= 0 && policy < policies) {
      per_sample_[{policy, sample}] = PerSample{.steps = steps,
                                                .budget = budget,
                                                .peak_restored = peak,
                                                .layers = layers,
                                                .cache_heads = cache_heads};
    } else {
      throw std::runtime_error(origin + ": unreadable summary line '" + line + "'");
    }
  }
}

std::string Summary::budget_entries(int policy) const {
  int lo = -1, hi = -1;
  for (const auto& [key, s] : per_sample_) {
    const int n = s.budget;
    if (key.first != policy || n < 0) continue;
    lo = lo < 0 ? n : std::min(lo, n);
    hi = std::max(hi, n);
  }
  if (lo < 0) return "";
  return lo == hi ? std::to_string(lo) : std::to_string(lo) + "-" + std::to_string(hi);
}

Summary::Reported Summary::report(const std::string& label, const std::vector<int>& members,
                                  const std::map<int, Total>& all) const {
  Reported row{.label = label, .members = members};
  for (int p : members) {
    const Total& t = all.at(p);
    row.total.acc.merge(t.acc);
    row.total.layers += t.layers;
    row.total.steps += t.steps;
  }
  std::map<std::string, StepSums> by_sample;
  for (const auto& [key, acc] : per_layer_)
    if (std::find(members.begin(), members.end(), std::get<0>(key)) != members.end())
      by_sample[std::get<1>(key)].merge(acc);
  std::vector<double> recall, count, error, value_error, error_count;
  for (const auto& [name, acc] : by_sample) {
    row.samples.push_back(acc);
    if (acc.count == 0) continue;
    recall.push_back(acc.recall);
    count.push_back(static_cast<double>(acc.count));
    if (acc.error_count == 0) continue;
    error.push_back(acc.error);
    value_error.push_back(acc.value_error);
    error_count.push_back(static_cast<double>(acc.error_count));
  }
  row.recall_ci = bootstrap_ratio(recall, count);
  row.error_ci = bootstrap_ratio(error, error_count);
  row.value_error_ci = bootstrap_ratio(value_error, error_count);
  const PolicyConfig& first = policies_[members.front()];
  row.sizes_itself = !first.info->keeps_everything;
  for (const auto& [key, ps] : per_sample_) {
    if (std::find(members.begin(), members.end(), key.first) == members.end()) continue;
    if (ps.budget >= 0) row.sizes_itself = false;
    const long peak = ps.peak_held();
    const int heads = kv_heads_ > 0 ? kv_heads_ : ps.cache_heads;
    if (peak < 0 || ps.layers == 0 || heads == 0) continue;
    const double per_head = static_cast<double>(peak) / (static_cast<double>(ps.layers) * heads);
    if (std::isnan(row.peak_held) || per_head > row.peak_held) row.peak_held = per_head;
    if (ps.budget <= 0) continue;
    const double ratio = per_head / ps.budget;
    if (std::isnan(row.held_over_budget) ||
        std::fabs(ratio - 1) > std::fabs(row.held_over_budget - 1))
      row.held_over_budget = ratio;
  }
  if (members.size() < 2) return row;
  std::vector<double> member_recall, member_error;
  for (int p : members) {
    const StepSums& a = all.at(p).acc;
    if (a.count) member_recall.push_back(a.recall / a.count);
    if (a.error_count) member_error.push_back(a.error / a.error_count);
  }
  row.recall_over_seeds = mean_sd(member_recall);
  row.error_over_seeds = mean_sd(member_error);
  return row;
}

std::vector<Summary::SampleMeans> Summary::sample_means() const {
  std::vector<SampleMeans> out;
  for (const Reported& r : reported()) {
    std::vector<double> error, recall;
    for (const StepSums& a : r.samples) {
      if (a.count) recall.push_back(a.recall / a.count);
      if (a.error_count) error.push_back(a.error / a.error_count);
    }
    out.push_back(
        {r.label, static_cast<long>(r.samples.size()), mean_sd(error).mean, mean_sd(recall).mean});
  }
  return out;
}

std::vector<Summary::Reported> Summary::reported() const {
  const std::map<int, Total> all = totals();
  std::vector<std::pair<std::string, std::vector<int>>> groups;  // label -> members, in order
  for (const auto& [p, total] : all) {
    const std::string group = seed_group_of(policies_[p].label);
    const auto it = std::find_if(groups.begin(), groups.end(),
                                 [&](const auto& g) { return !group.empty() && g.first == group; });
    if (it != groups.end())
      it->second.push_back(p);
    else
      groups.push_back({group.empty() ? policies_[p].label : group, {p}});
  }
  std::vector<Reported> out;
  for (const auto& [label, members] : groups) out.push_back(report(label, members, all));
  return out;
}

namespace {

constexpr const char* kSummaryHeader =
    "policy,sample,layer,rows,mean_cache_size,mean_attended_size,mean_mass_recall,"
    "min_mass_recall,mean_output_rel_error,mean_output_value_error,mean_kv_bytes,"
    "budget_entries,samples,seeds,mass_recall_ci_low,mass_recall_ci_high,"
    "output_rel_error_ci_low,output_rel_error_ci_high,output_value_error_ci_low,"
    "output_value_error_ci_high,mass_recall_seed_sd,output_rel_error_seed_sd,peak_held,"
    "peak_held_over_budget\n";

// A summary row's columns up to budget_entries (and the comma after it): the means of `a`.
void append_means(std::string& out, const std::string& policy, const std::string& sample,
                  const std::string& layer, const StepSums& a, const std::string& budget) {
  out += csv_quote(policy) + "," + csv_quote(sample) + "," + layer + "," + std::to_string(a.count) +
         ",";
  const double n = std::max<long>(a.count, 1);
  for (const double x : {a.cache / n, a.attended / n, a.recall / n, a.count ? a.min_recall : NAN,
                         a.error_count ? a.error / a.error_count : NAN,
                         a.error_count ? a.value_error / a.error_count : NAN, a.kv_bytes / n}) {
    append_float(out, x);
    out += ",";
  }
  out += budget + ",";
}

// ",x1,x2,...\n"
void append_numbers(std::string& out, std::initializer_list<double> xs) {
  for (double x : xs) {
    out += ",";
    append_float(out, x);
  }
  out += "\n";
}

}  // namespace

void Summary::write_csv(const std::string& path) const {
  std::string out = kSummaryHeader;
  for (const auto& [key, acc] : per_layer_) {
    const int b = per_sample_.at({std::get<0>(key), std::get<1>(key)}).budget;
    append_means(out, policies_[std::get<0>(key)].label, std::get<1>(key),
                 std::to_string(std::get<2>(key)), acc, b < 0 ? "" : std::to_string(b));
    out += "1,1";
    append_numbers(out, {NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN});
  }
  const std::map<int, Total> all = totals();
  auto overall = [&](const std::string& label, const Total& total, const Reported& r) {
    append_means(out, label, "all", "all", total.acc, budget_entries(r.members.front()));
    out += std::to_string(r.samples.size()) + "," + std::to_string(r.members.size());
    append_numbers(out, {r.recall_ci.low, r.recall_ci.high, r.error_ci.low, r.error_ci.high,
                         r.value_error_ci.low, r.value_error_ci.high, r.recall_over_seeds.sd,
                         r.error_over_seeds.sd, r.peak_held, r.held_over_budget});
  };
  for (const Reported& r : reported()) {
    if (r.members.size() == 1) {
      overall(r.label, r.total, r);
      continue;
    }
    for (int p : r.members)  // each seed's own row, its interval over samples
      overall(policies_[p].label, all.at(p), report(policies_[p].label, {p}, all));
    overall(r.label, r.total, r);
  }
  write_whole(path, out);
}

std::string Summary::budget_cell(int p) const {
  std::string budget = policies_[p].budget_text();
  if (budget.empty()) budget = "-";
  if (const std::string n = budget_entries(p); !n.empty() && n != budget) budget += " = " + n;
  if (policies_[p].info->lookahead) budget += " (lookahead)";
  return budget;
}

std::string Summary::table_line(const Reported& r, const std::string& label, int w,
                                const std::string& budget, int bw, const std::string& held) {
  char line[640];
  const StepSums& a = r.total.acc;
  const int n_samples = static_cast<int>(r.samples.size());
  const double n = std::max<long>(a.count, 1);
  const double kept = a.prefill_kept / std::max<long>(r.total.layers, 1);
  const double mib = a.kv_bytes / std::max<long>(r.total.steps, 1) / (1024.0 * 1024.0);
  if (a.count == 0) {  // no decode steps: nothing was attended after the prefill
    std::snprintf(line, sizeof line,
                  "%-*s %-*s %4d %8.1f %8s %7s %8s %8s %13s %10s %11s %13s %9s %11s\n", w,
                  label.c_str(), bw, budget.c_str(), n_samples, kept, "-", "-", "-", "-", "-", "-",
                  "-", "-", "-", "-");
    return line;
  }
  char err[32] = "-", verr[32] = "-";
  if (a.error_count) {
    std::snprintf(err, sizeof err, "%.4f", a.error / a.error_count);
    std::snprintf(verr, sizeof verr, "%.4f", a.value_error / a.error_count);
  }
  std::snprintf(line, sizeof line,
                "%-*s %-*s %4d %8.1f %8.1f %7s %8.1f %8.4f %13s %10.4f %11s %13s %9s %11.2f\n", w,
                label.c_str(), bw, budget.c_str(), n_samples, kept, a.cache / n, held.c_str(),
                a.attended / n, a.recall / n, interval_text(r.recall_ci).c_str(), a.min_recall, err,
                interval_text(r.error_ci).c_str(), verr, mib);
  return line;
}

std::string Summary::table() const {
  std::ostringstream os;
  char line[640];
  std::vector<Reported> rows = reported();
  // Policies that size their caches themselves go last, apart: their memory is their own.
  std::stable_partition(rows.begin(), rows.end(),
                        [](const Reported& r) { return !r.sizes_itself; });
  auto shown_label = [](const Reported& r) {
    return seed_group_text(r.label, static_cast<int>(r.members.size()));
  };
  int w = 14;  // label column: wide enough for preset names
  for (const Reported& r : rows) w = std::max<int>(w, static_cast<int>(shown_label(r).size()));
  std::vector<std::string> budgets;
  int bw = 18;
  for (const Reported& r : rows) {
    budgets.push_back(budget_cell(r.members.front()));
    bw = std::max<int>(bw, static_cast<int>(budgets.back().size()));
  }
  std::snprintf(line, sizeof line,
                "%-*s %-*s %4s %8s %8s %7s %8s %8s %13s %10s %11s %13s %9s %11s\n", w, "policy", bw,
                "budget", "n", "kept@P", "stored", "held/B", "used", "recall", "recall_95%",
                "min_recall", "out_rel_err", "out_rel_95%", "out_v_err", "KV_MiB/step");
  os << line;
  std::size_t most_samples = 0;
  std::string seed_notes;
  bool flagged = false, apart = false;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Reported& r = rows[i];
    if (r.sizes_itself && !apart) {
      os << "sizing their caches themselves (no budget: compare by what they held):\n";
      apart = true;
    }
    most_samples = std::max(most_samples, r.samples.size());
    const std::string label = shown_label(r);
    const std::string held = held_over_budget_cell(r.held_over_budget, flagged);
    os << table_line(r, label, w, budgets[i], bw, held);
    if (r.total.acc.count == 0) continue;
    if (r.members.size() > 1) {
      std::snprintf(line, sizeof line,
                    "%s: the runs of seeds 0-%zu pooled; over seeds recall SD %.4f, out_rel_err "
                    "SD %.4f\n",
                    label.c_str(), r.members.size() - 1, r.recall_over_seeds.sd,
                    r.error_over_seeds.sd);
      seed_notes += line;
    }
  }
  os << seed_notes;
  if (flagged) os << kHeldFootnote;
  if (most_samples < 2)
    os << "n = 1 sample: no intervals (the 95% intervals resample samples; replay several)\n";
  else
    os << "95% intervals: percentile bootstrap over the n samples (docs/outputs.md)\n";
  return os.str();
}

DecisionWriter::DecisionWriter(const std::string& path, const std::vector<PolicyConfig>& policies)
    : path_(path), policies_(policies) {
  silence_hdf5_errors();
  file_ = H5Handle(H5Fcreate(begin_partial(path).c_str(), H5F_ACC_TRUNC,
                             h5_untimed_plist(H5P_FILE_CREATE).get(), H5P_DEFAULT));
  if (!file_.valid()) throw TraceError(path + ": cannot create file: " + hdf5_last_error());

  for (const auto& p : policies) {
    H5Handle g = h5_require_group(file_.get(), p.label);
    h5_write_string_attr(g.get(), "policy", p.info->name);
    h5_write_string_attr(g.get(), "params", p.params.str());
    h5_write_int_attr(g.get(), "lookahead", p.info->lookahead ? 1 : 0);
  }
}

namespace {

void write_int_matrix(hid_t group, const char* name, const std::vector<std::int32_t>& data,
                      hsize_t cols, const std::string& path) {
  const hsize_t dims[2] = {data.size() / cols, cols};
  H5Handle space(H5Screate_simple(2, dims, nullptr));
  H5Handle d(H5Dcreate2(group, name, H5T_STD_I32LE, space.get(), H5P_DEFAULT,
                        h5_untimed_plist(H5P_DATASET_CREATE).get(), H5P_DEFAULT));
  if (!d.valid() || (!data.empty() && H5Dwrite(d.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL,
                                               H5P_DEFAULT, data.data()) < 0))
    throw TraceError(path + ": cannot write dataset '" + name + "': " + hdf5_last_error());
}

}  // namespace

void DecisionWriter::write(const LayerResult& r) {
  const auto& cfg = policies_[r.policy_index];
  const std::string base =
      cfg.label + "/samples/" + r.sample + "/layers/" + std::to_string(r.layer) + "/heads/";
  for (std::size_t g = 0; g < r.evicted.size(); ++g) {
    H5Handle grp = h5_require_group(file_.get(), base + std::to_string(g));
    std::vector<std::int32_t> ev;
    ev.reserve(r.evicted[g].size() * 2);
    for (const auto& e : r.evicted[g]) ev.insert(ev.end(), {e.step, e.position});
    write_int_matrix(grp.get(), "evicted", ev, 2, path_);
    if (!cfg.merges()) continue;
    std::vector<std::int32_t> mg;
    for (const auto& m : r.merged[g]) mg.insert(mg.end(), {m.step, m.position, m.into_position});
    write_int_matrix(grp.get(), "merged", mg, 3, path_);
  }
}

void DecisionWriter::copy_sample(const std::string& from, const std::string& sample) {
  H5Handle src(H5Fopen(from.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!src.valid()) throw TraceError(from + ": cannot open: " + hdf5_last_error());
  for (const auto& cfg : policies_) {
    const std::string path = cfg.label + "/samples/" + sample;
    if (!h5_path_exists(src.get(), path)) continue;
    H5Handle parent = h5_require_group(file_.get(), cfg.label + "/samples");
    if (H5Ocopy(src.get(), path.c_str(), parent.get(), sample.c_str(), H5P_DEFAULT, H5P_DEFAULT) <
        0)
      throw TraceError(path_ + ": cannot copy '" + path + "' from " + from + ": " +
                       hdf5_last_error());
  }
}

void DecisionWriter::close() {
  if (!file_.valid()) return;
  const bool ok = H5Fflush(file_.get(), H5F_SCOPE_GLOBAL) >= 0;
  file_.reset();
  if (!ok) throw TraceError(path_ + ": write failed: " + hdf5_last_error());
  publish(path_);
}

}  // namespace kvsim
