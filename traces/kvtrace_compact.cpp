// Reading a compact trace's extra parts (kvtrace-v1.md, "Compact traces"): the sample attributes
// that say which query rows it keeps, and each layer's stored prompt statistics.
#include <cmath>

#include "traces/kvtrace.hpp"
#include "traces/kvtrace_internal.hpp"

namespace kvsim {

const StoredPromptStats::Prompt& StoredPromptStats::prompt(int prompt_len,
                                                           const char* statistic) const {
  const auto it = by_prompt_len.find(prompt_len);
  if (it != by_prompt_len.end()) return it->second;
  std::string held;
  for (const auto& [len, _] : by_prompt_len)
    held += (held.empty() ? "" : ", ") + std::to_string(len);
  throw std::logic_error(std::string("the compact trace stores ") + statistic + " for prompts of " +
                         held + " positions, not of " + std::to_string(prompt_len));
}

const float* LayerTensors::query(int pos, int h) const {
  const int row = pos - q_first_row;
  if (row < 0 || row >= static_cast<int>(q.shape(0)))
    throw std::logic_error("the query of position " + std::to_string(pos) +
                           " is not stored (this compact trace keeps query rows " +
                           std::to_string(q_first_row) + ".." +
                           std::to_string(q_first_row + static_cast<int>(q.shape(0)) - 1) + ")");
  return &q(static_cast<std::size_t>(row), static_cast<std::size_t>(h), 0);
}

void TraceReader::read_compact_sample_attrs(hid_t group, SampleInfo& s) const {
  const std::string w = where(s.name);
  s.compact_first_row = detail::require_positive_int(group, "compact_first_row", w, true);
  s.compact_context_len = detail::require_positive_int(group, "compact_context_len", w, true);
  const int question = question_length(s);
  const int context = question > 0 ? s.prompt_len - question : 0;
  if (s.compact_context_len != context)
    throw TraceError(
        w + ": attribute 'compact_context_len' = " + std::to_string(s.compact_context_len) +
        " but the sample's context is " + std::to_string(context) + " positions (prompt_len " +
        std::to_string(s.prompt_len) + " less its question of " + std::to_string(question) +
        "; 0 without a question)");
  const int last = context > 0 ? context : s.prompt_len;
  if (s.compact_first_row > last)
    throw TraceError(w +
                     ": attribute 'compact_first_row' = " + std::to_string(s.compact_first_row) +
                     " drops queries a replay needs (at most " + std::to_string(last) +
                     ": the question and decode queries are kept)");
}

template <typename T>
void TraceReader::read_floats(const std::string& sample, const std::string& rel,
                              const std::vector<hsize_t>& shape, T* out) const {
  const std::string w = where(sample, rel);
  const std::string full = "samples/" + sample + "/" + rel;
  if (!h5_path_exists(file_.get(), full)) throw TraceError(w + ": missing dataset");
  H5Handle d(H5Dopen2(file_.get(), full.c_str(), H5P_DEFAULT));
  if (!d.valid()) throw TraceError(w + ": cannot open dataset: " + hdf5_last_error());
  const auto have = h5_dataset_shape(d.get());
  if (have != shape)
    throw TraceError(w + ": shape " + detail::shape_str(have) + " does not match " +
                     detail::shape_str(shape));
  H5Handle type(H5Dget_type(d.get()));
  if (H5Tget_class(type.get()) != H5T_FLOAT)
    throw TraceError(w + ": element type is not floating point");
  detail::check_filters(d.get(), w);
  double n = 1;
  for (hsize_t x : shape) n *= static_cast<double>(x);
  h5_check_written(d.get(), n * static_cast<double>(H5Tget_size(type.get())), w);
  const hid_t mem = sizeof(T) == 4 ? H5T_NATIVE_FLOAT : H5T_NATIVE_DOUBLE;
  if (n > 0 && H5Dread(d.get(), mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, out) < 0)
    throw TraceError(w + ": cannot read (truncated or corrupt file?): " + hdf5_last_error());
  for (std::size_t i = 0; i < static_cast<std::size_t>(n); ++i)
    if (!std::isfinite(out[i]))
      throw TraceError(w + ": " + (std::isnan(out[i]) ? "NaN" : "Inf") + " at element " +
                       std::to_string(i));
}

std::shared_ptr<const StoredPromptStats> TraceReader::read_stored_stats(const SampleInfo& s,
                                                                        int layer) const {
  auto stats = std::make_shared<StoredPromptStats>();
  stats->layer = layer;
  const std::string base = "layers/" + std::to_string(layer) + "/stats/";
  const hsize_t H = static_cast<hsize_t>(info_.num_heads);
  auto read_prompt = [&](const std::string& part, int len) {
    StoredPromptStats::Prompt& p = stats->by_prompt_len[len];
    const hsize_t P = static_cast<hsize_t>(len);
    p.column_sums.resize(H * P);
    p.column_sums_rounded.resize(H * P);
    p.text_column_sums.resize(P);
    p.text_column_max.resize(P);
    read_floats(s.name, base + part + "/column_sums", {H, P}, p.column_sums.data());
    read_floats(s.name, base + part + "/column_sums_rounded", {H, P}, p.column_sums_rounded.data());
    read_floats(s.name, base + part + "/text_column_sums", {P}, p.text_column_sums.data());
    read_floats(s.name, base + part + "/text_column_max", {P}, p.text_column_max.data());
    const std::vector<int>& widths = info_.compact_window_widths;
    if (widths.empty()) return;
    const hsize_t n = widths.size(), Hkv = static_cast<hsize_t>(info_.num_kv_heads);
    std::vector<double> sums(n * Hkv * P);
    read_floats(s.name, base + part + "/window_group_sums", {n, Hkv, P}, sums.data());
    for (hsize_t i = 0; i < n; ++i)
      p.window_group_sums[widths[i]].assign(sums.begin() + i * Hkv * P,
                                            sums.begin() + (i + 1) * Hkv * P);
    p.last_row_head_mean.resize(P);
    read_floats(s.name, base + part + "/last_row_head_mean", {P}, p.last_row_head_mean.data());
  };
  read_prompt("prompt", s.prompt_len);
  if (s.compact_context_len > 0) read_prompt("context", s.compact_context_len);
  stats->has_entropies = info_.compact_entropies;
  if (stats->has_entropies)
    read_floats(s.name, base + "entropies", {stats->entropies.size()}, stats->entropies.data());
  if (s.gen_len > 0 && s.has_v &&
      h5_path_exists(file_.get(), "samples/" + s.name + "/" + base + "decode")) {
    StoredPromptStats::Decode& d = stats->decode;
    d.prompt_len = s.prompt_len;
    d.kv_heads = info_.num_kv_heads;
    const hsize_t G = static_cast<hsize_t>(s.gen_len), dim = static_cast<hsize_t>(info_.head_dim);
    d.output.resize(G * H * dim);
    d.value_norm.resize(G * H);
    d.mass.resize(G * H);
    read_floats(s.name, base + "decode/output", {G, H, dim}, d.output.data());
    read_floats(s.name, base + "decode/value_norm", {G, H}, d.value_norm.data());
    read_floats(s.name, base + "decode/mass", {G, H}, d.mass.data());
  }
  return stats;
}

}  // namespace kvsim
