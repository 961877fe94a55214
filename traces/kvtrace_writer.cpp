#include "traces/kvtrace_writer.hpp"

#include <algorithm>
#include <stdexcept>

#include "traces/half.hpp"

namespace kvsim {

TraceWriter::TraceWriter(const std::string& path, const TraceInfo& info,
                         const WriteOptions& options)
    : path_(path), info_(info), options_(options) {
  silence_hdf5_errors();
  file_ = H5Handle(
      H5Fcreate(path.c_str(), H5F_ACC_TRUNC, h5_untimed_plist(H5P_FILE_CREATE).get(), H5P_DEFAULT));
  if (!file_.valid()) throw TraceError(path + ": cannot create file: " + hdf5_last_error());
  const hid_t root = file_.get();
  h5_write_int_attr(root, "kvtrace_version", 1);
  h5_write_string_attr(root, "model", info.model);
  h5_write_int_attr(root, "num_layers", info.num_layers);
  h5_write_int_attr(root, "num_heads", info.num_heads);
  h5_write_int_attr(root, "num_kv_heads", info.num_kv_heads);
  h5_write_int_attr(root, "head_dim", info.head_dim);
  if (info.scale_given) h5_write_float_attr(root, "scale", info.scale);
  if (info.rope_theta > 0) h5_write_float_attr(root, "rope_theta", info.rope_theta);
  if (!info.mrope_section.empty())
    h5_write_int_array_attr(root, "mrope_section",
                            {info.mrope_section.begin(), info.mrope_section.end()});
  if (info.compact()) {
    h5_write_int_attr(root, "kvtrace_compact", kCompactTraceVersion);
    h5_write_int_attr(root, "compact_window", info.compact_window);
    h5_write_int_attr(root, "compact_entropies", info.compact_entropies ? 1 : 0);
    if (!info.compact_window_widths.empty())
      h5_write_int_array_attr(
          root, "compact_window_widths",
          {info.compact_window_widths.begin(), info.compact_window_widths.end()});
  }
  h5_require_group(root, "samples");
}

void TraceWriter::write_sample(const SampleInfo& s) {
  const std::string where = path_ + ": sample '" + s.name + "'";
  H5Handle g = h5_require_group(file_.get(), "samples/" + s.name);
  h5_write_int_attr(g.get(), "prompt_len", s.prompt_len);
  h5_write_int_attr(g.get(), "gen_len", s.gen_len);
  if (s.question_len >= 0) h5_write_int_attr(g.get(), "question_len", s.question_len);
  if (!s.context_id.empty()) h5_write_string_attr(g.get(), "context_id", s.context_id);
  if (!s.task.empty()) h5_write_string_attr(g.get(), "task", s.task);
  if (!s.reference.empty()) h5_write_string_attr(g.get(), "reference", s.reference);
  h5_write_1d(g.get(), "modality", H5T_STD_U8LE, H5T_NATIVE_UINT8, s.modality, where);
  h5_write_1d(g.get(), "segment", H5T_STD_U8LE, H5T_NATIVE_UINT8, s.segment, where);
  if (!s.media_id.empty())
    h5_write_1d(g.get(), "media_id", H5T_STD_I32LE, H5T_NATIVE_INT32, s.media_id, where);
  if (!s.token_ids.empty())
    h5_write_1d(g.get(), "token_ids", H5T_STD_I32LE, H5T_NATIVE_INT32, s.token_ids, where);
  if (!s.position_ids.empty())
    h5_write_2d(g.get(), "position_ids", H5T_STD_I32LE, H5T_NATIVE_INT32, s.position_ids.data(), 3,
                static_cast<std::size_t>(s.total_len()), where);
  if (info_.compact()) {
    h5_write_int_attr(g.get(), "compact_first_row", s.compact_first_row);
    h5_write_int_attr(g.get(), "compact_context_len", s.compact_context_len);
  }
}

void TraceWriter::write_tensor(hid_t group, const char* name, const xt::xtensor<float, 3>& t) {
  const hsize_t dims[3] = {t.shape(0), t.shape(1), t.shape(2)};
  H5Handle space(H5Screate_simple(3, dims, nullptr));
  H5Handle dcpl = h5_untimed_plist(H5P_DATASET_CREATE);
  const bool chunked = options_.chunked || options_.gzip_level > 0 || options_.shuffle;
  if (chunked && dims[0] > 0) {
    const hsize_t chunk[3] = {std::min<hsize_t>(dims[0], 64), dims[1], dims[2]};
    H5Pset_chunk(dcpl.get(), 3, chunk);
    if (options_.shuffle) H5Pset_shuffle(dcpl.get());
    if (options_.gzip_level > 0) H5Pset_deflate(dcpl.get(), options_.gzip_level);
  }
  const bool half = options_.dtype == DType::kFloat16;
  const hid_t file_type = half ? h5_float16_type() : H5T_IEEE_F32LE;
  H5Handle d(H5Dcreate2(group, name, file_type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT));
  herr_t rc = d.valid() ? 0 : -1;
  if (rc >= 0 && t.size() > 0) {
    if (half) {
      std::vector<std::uint16_t> raw(t.size());
      float_to_half(t.data(), raw.data(), t.size());
      rc = H5Dwrite(d.get(), h5_float16_type(), H5S_ALL, H5S_ALL, H5P_DEFAULT, raw.data());
    } else {
      rc = H5Dwrite(d.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data());
    }
  }
  if (rc < 0)
    throw TraceError(path_ + ": cannot write dataset '" + name + "': " + hdf5_last_error());
}

void TraceWriter::write_layer(const SampleInfo& s, const LayerTensors& t) {
  H5Handle g =
      h5_require_group(file_.get(), "samples/" + s.name + "/layers/" + std::to_string(t.layer));
  if (info_.compact() != (t.stored != nullptr) ||
      t.q_first_row != (info_.compact() ? s.compact_first_row : 0))
    throw std::logic_error(path_ + ": sample '" + s.name + "', layer " + std::to_string(t.layer) +
                           ": " +
                           (info_.compact() ? "a compact trace's layer needs its stored "
                                              "statistics and the sample's query rows"
                                            : "a full trace's layer needs every query"));
  write_tensor(g.get(), info_.compact() ? "q_rows" : "q", t.q);
  write_tensor(g.get(), "k", t.k);
  if (t.has_v()) write_tensor(g.get(), "v", t.v);
  if (t.stored) write_stored_stats(g.get(), s, *t.stored);
}

void TraceWriter::write_stored_stats(hid_t layer_group, const SampleInfo& s,
                                     const StoredPromptStats& stats) {
  const std::string where = path_ + ": sample '" + s.name + "'";
  H5Handle g = h5_require_group(layer_group, "stats");
  auto write_prompt = [&](const char* part, int len) {
    const StoredPromptStats::Prompt& p = stats.prompt(len, "prompt statistics");
    H5Handle pg = h5_require_group(g.get(), part);
    const std::size_t H = info_.num_heads, P = len;
    h5_write_2d(pg.get(), "column_sums", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, p.column_sums.data(), H,
                P, where);
    h5_write_2d(pg.get(), "column_sums_rounded", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT,
                p.column_sums_rounded.data(), H, P, where);
    h5_write_1d(pg.get(), "text_column_sums", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, p.text_column_sums,
                where);
    h5_write_1d(pg.get(), "text_column_max", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, p.text_column_max,
                where);
    const std::vector<int>& widths = info_.compact_window_widths;
    if (widths.empty()) return;
    const std::size_t Hkv = info_.num_kv_heads;
    std::vector<double> sums;
    for (int w : widths) {
      const auto it = p.window_group_sums.find(w);
      if (it == p.window_group_sums.end() || it->second.size() != Hkv * P)
        throw std::logic_error(where + ": no window group sums of width " + std::to_string(w) +
                               " of shape [Hkv, P] for a trace declaring them");
      sums.insert(sums.end(), it->second.begin(), it->second.end());
    }
    if (p.last_row_head_mean.size() != P)
      throw std::logic_error(where + ": no last-row head mean of shape [P]");
    h5_write_3d(pg.get(), "window_group_sums", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, sums.data(),
                widths.size(), Hkv, P, where);
    h5_write_1d(pg.get(), "last_row_head_mean", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE,
                p.last_row_head_mean.data(), P, where);
  };
  write_prompt("prompt", s.prompt_len);
  if (s.compact_context_len > 0) write_prompt("context", s.compact_context_len);
  if (stats.has_entropies != info_.compact_entropies)
    throw std::logic_error(where + ": layer statistics with" + (stats.has_entropies ? "" : "out") +
                           " entropies in a trace declared " +
                           (info_.compact_entropies ? "with" : "without") + " them");
  if (stats.has_entropies)
    h5_write_1d(g.get(), "entropies", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, stats.entropies.data(),
                stats.entropies.size(), where);
  const StoredPromptStats::Decode& d = stats.decode;
  if (d.empty()) return;
  if (s.gen_len == 0 || !s.has_v)
    throw std::logic_error(where +
                           ": the full cache's decode results of a layer without values "
                           "or decode steps");
  const std::size_t G = s.gen_len, H = info_.num_heads, dim = info_.head_dim;
  if (d.output.size() != G * H * dim || d.value_norm.size() != G * H || d.mass.size() != G * H)
    throw std::logic_error(where + ": decode results not of shapes [G, H, d] and [G, H]");
  H5Handle dg = h5_require_group(g.get(), "decode");
  h5_write_3d(dg.get(), "output", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, d.output.data(), G, H, dim,
              where);
  h5_write_2d(dg.get(), "value_norm", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, d.value_norm.data(), G, H,
              where);
  h5_write_2d(dg.get(), "mass", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, d.mass.data(), G, H, where);
}

void TraceWriter::write_sample_matrix(const SampleInfo& s, const char* name, int rows, int cols,
                                      const float* data) {
  H5Handle g = h5_require_group(file_.get(), "samples/" + s.name);
  const hsize_t dims[2] = {static_cast<hsize_t>(rows), static_cast<hsize_t>(cols)};
  H5Handle space(H5Screate_simple(2, dims, nullptr));
  H5Handle d(H5Dcreate2(g.get(), name, H5T_IEEE_F32LE, space.get(), H5P_DEFAULT,
                        h5_untimed_plist(H5P_DATASET_CREATE).get(), H5P_DEFAULT));
  if (!d.valid() || H5Dwrite(d.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
    throw TraceError(path_ + ": sample '" + s.name + "': cannot write dataset '" + name +
                     "': " + hdf5_last_error());
}

void TraceWriter::close() {
  if (file_.valid()) {
    H5Fflush(file_.get(), H5F_SCOPE_GLOBAL);
    file_.reset();
  }
}

}  // namespace kvsim
