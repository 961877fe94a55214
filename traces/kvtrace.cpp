#include "traces/kvtrace.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "traces/half.hpp"
#include "traces/kvtrace_internal.hpp"

namespace kvsim {

using detail::check_filters;
using detail::require_positive_int;
using detail::shape_str;

const char* dtype_name(DType t) {
  return t == DType::kFloat16 ? "float16" : "float32";
}
std::size_t dtype_bytes(DType t) {
  return t == DType::kFloat16 ? 2 : 4;
}

namespace {

// Classifies a dataset's element type; throws for anything kvtrace does not allow.
DType tensor_dtype(hid_t dset, const std::string& where) {
  H5Handle type(H5Dget_type(dset));
  if (H5Tget_class(type.get()) == H5T_FLOAT) {
    const std::size_t size = H5Tget_size(type.get());
    if (size == 4) return DType::kFloat32;
    if (size == 2) {
      std::size_t spos, epos, esize, mpos, msize;
      H5Tget_fields(type.get(), &spos, &epos, &esize, &mpos, &msize);
      if (spos == 15 && epos == 10 && esize == 5 && mpos == 0 && msize == 10 &&
          H5Tget_ebias(type.get()) == 15 && H5Tget_order(type.get()) == H5T_ORDER_LE)
        return DType::kFloat16;
      throw TraceError(where + ": 16-bit float type is not IEEE binary16 little-endian");
    }
    throw TraceError(where + ": element type is float" + std::to_string(size * 8) +
                     "; kvtrace v1 allows float16 or float32");
  }
  throw TraceError(where +
                   ": element type is not floating point; kvtrace v1 allows float16 "
                   "or float32");
}

// A [T] integer dataset (uint8 or int32 in the format).
template <typename T>
std::vector<T> read_1d(hid_t group, const std::string& name, int expected_len,
                       const std::string& where) {
  H5Handle dset(H5Dopen2(group, name.c_str(), H5P_DEFAULT));
  if (!dset.valid()) throw TraceError(where + ": cannot open dataset: " + hdf5_last_error());
  const auto shape = h5_dataset_shape(dset.get());
  if (shape.size() != 1 || shape[0] != static_cast<hsize_t>(expected_len))
    throw TraceError(where + ": shape " + shape_str(shape) + " does not match [T] = [" +
                     std::to_string(expected_len) + "] (T = prompt_len + gen_len)");
  return h5_read_ints<T>(dset.get(), expected_len, sizeof(T) == 1 ? "uint8" : "int32", where);
}

// The filters of a dataset's creation property list: id and name, in pipeline order.
std::vector<std::pair<H5Z_filter_t, std::string>> dataset_filters(hid_t dcpl) {
  std::vector<std::pair<H5Z_filter_t, std::string>> out;
  for (int i = 0; i < H5Pget_nfilters(dcpl); ++i) {
    unsigned flags = 0;
    std::size_t n = 0;
    char name[64] = "";
    const H5Z_filter_t f = H5Pget_filter2(dcpl, i, &flags, &n, nullptr, sizeof name, name, nullptr);
    out.emplace_back(f, name);
  }
  return out;
}

// Layer groups are exactly layers/0 .. layers/L-1, in decimal without padding.
void check_layer_groups(hid_t sample, int num_layers, const std::string& where) {
  if (!h5_path_exists(sample, "layers")) return;  // reported as the missing layers/0/q
  if (h5_object_kind(sample, "layers") != H5I_GROUP)
    throw TraceError(where + ": 'layers' is not a group");
  for (const auto& name : h5_group_members(sample, "layers")) {
    int l = -1;
    const bool decimal = !name.empty() && name.size() <= 9 &&
                         name.find_first_not_of("0123456789") == std::string::npos &&
                         (name == "0" || name[0] != '0');
    if (decimal) l = std::stoi(name);
    if (l < 0 || l >= num_layers)
      throw TraceError(
          where + ": 'layers/" + name +
          "' is not a layer of this trace (num_layers = " + std::to_string(num_layers) +
          ": layers are 0.." + std::to_string(num_layers - 1) + " in decimal, without padding)");
    if (h5_object_kind(sample, "layers/" + name) != H5I_GROUP)
      throw TraceError(where + ": 'layers/" + name + "' is not a group");
  }
}

}  // namespace

namespace detail {

std::string shape_str(const std::vector<hsize_t>& s) {
  std::ostringstream os;
  os << '[';
  for (std::size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

// kvtrace v1 allows gzip and shuffle only (kvtrace-v1.md: "no custom filters").
void check_filters(hid_t dset, const std::string& where) {
  H5Handle dcpl(H5Dget_create_plist(dset));
  for (const auto& [f, name] : dataset_filters(dcpl.get()))
    if (f != H5Z_FILTER_DEFLATE && f != H5Z_FILTER_SHUFFLE)
      throw TraceError(where + ": filter " + std::to_string(f) + " ('" + name +
                       "'); kvtrace v1 allows gzip and shuffle only");
}

int require_positive_int(hid_t obj, const char* name, const std::string& where, bool allow_zero) {
  std::optional<std::int64_t> v;
  try {
    v = h5_read_int_attr(obj, name);
  } catch (const TraceError& e) {
    throw TraceError(where + ": " + e.what());
  }
  if (!v) throw TraceError(where + ": missing attribute '" + name + "'");
  if (*v < (allow_zero ? 0 : 1) || *v > (1ll << 30))
    throw TraceError(where + ": attribute '" + name + "' = " + std::to_string(*v) +
                     " is out of range (must be " + (allow_zero ? ">= 0" : ">= 1") + ")");
  return static_cast<int>(*v);
}

}  // namespace detail

int question_length(const SampleInfo& s) {
  if (s.question_len >= 0) return s.question_len;
  for (int i = s.prompt_len - 1; i >= 0; --i)
    if (s.modality[i] != static_cast<std::uint8_t>(Modality::kText)) return s.prompt_len - 1 - i;
  return 0;
}

SampleInfo context_only(SampleInfo sample, int question) {
  sample.prompt_len -= question;
  sample.gen_len += question;
  return sample;
}

int prompt_tail_length(const SampleInfo& s, int tail) {
  if (tail == 0) return 0;
  const int n = tail == kQuestionTail ? question_length(s) : tail;
  if (tail == kQuestionTail && n == 0)
    throw std::invalid_argument("sample '" + s.name +
                                "' has no question to feed after compression (no question_len "
                                "attribute and no text after its last image or video token)");
  if (n >= s.prompt_len)
    throw std::invalid_argument("sample '" + s.name + "': a prompt tail of " + std::to_string(n) +
                                " tokens leaves nothing of its " + std::to_string(s.prompt_len) +
                                "-token prompt to compress");
  return n;
}

std::string prompt_tail_text(int tail) {
  return tail == kQuestionTail ? "question" : tail == 0 ? "" : std::to_string(tail);
}

int parse_prompt_tail(const std::string& text) {
  if (text == "question") return kQuestionTail;
  std::size_t used = 0;
  int n = -1;
  try {
    n = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty() || n < 0)
    throw std::invalid_argument("prompt tail '" + text +
                                "': give 'question' or a whole number of tokens (>= 0)");
  return n;
}

const std::string& context_draw_key(const SampleInfo& s) {
  return s.context_id.empty() ? s.name : s.context_id;
}

void check_media_ids(const std::vector<std::uint8_t>& modality,
                     const std::vector<std::int32_t>& media_id, const std::string& where) {
  for (std::size_t i = 0; i < media_id.size(); ++i)
    if ((media_id[i] == -1) != (modality[i] == 0) || media_id[i] < -1)
      throw TraceError(where + ": value " + std::to_string(media_id[i]) + " at position " +
                       std::to_string(i) + " for a " + (modality[i] == 0 ? "text" : "vision") +
                       " token (text tokens have -1, vision tokens their image or frame, >= 0)");
}

TraceReader::TraceReader(const std::string& path) : path_(path) {
  silence_hdf5_errors();
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw TraceError(path + ": cannot open file (does it exist and is it readable?)");
  std::fclose(f);
  if (H5Fis_hdf5(path.c_str()) <= 0) {
    hdf5_last_error();
    throw TraceError(path + ": not an HDF5 file (or its superblock is truncated or corrupt)");
  }
  file_ = H5Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!file_.valid())
    throw TraceError(path +
                     ": cannot open HDF5 file (truncated or corrupt?): " + hdf5_last_error());
  read_file_attrs();
}

std::string TraceReader::where(const std::string& sample, const std::string& dataset) const {
  std::string w = path_;
  if (!sample.empty()) w += ": sample '" + sample + "'";
  if (!dataset.empty()) w += ", dataset '" + dataset + "'";
  return w;
}

void TraceReader::read_file_attrs() {
  const hid_t root = file_.get();
  const std::string w = path_ + ": file attribute";
  auto version = h5_read_int_attr(root, "kvtrace_version");
  if (!version) throw TraceError(path_ + ": missing file attribute 'kvtrace_version' (on '/')");
  if (*version != 1)
    throw TraceError(path_ + ": kvtrace_version is " + std::to_string(*version) +
                     "; this kvsim reads version 1");
  try {
    info_.model = h5_read_string_attr(root, "model").value_or("");
  } catch (const TraceError& e) {
    throw TraceError(path_ + ": " + e.what());
  }
  if (!h5_attr_exists(root, "model")) throw TraceError(path_ + ": missing file attribute 'model'");
  info_.num_layers = require_positive_int(root, "num_layers", path_, false);
  info_.num_heads = require_positive_int(root, "num_heads", path_, false);
  info_.num_kv_heads = require_positive_int(root, "num_kv_heads", path_, false);
  info_.head_dim = require_positive_int(root, "head_dim", path_, false);
  if (info_.num_heads % info_.num_kv_heads != 0)
    throw TraceError(path_ + ": num_kv_heads = " + std::to_string(info_.num_kv_heads) +
                     " does not divide num_heads = " + std::to_string(info_.num_heads));
  auto scale = h5_read_float_attr(root, "scale");
  info_.scale_given = scale.has_value();
  info_.scale = scale.value_or(1.0 / std::sqrt(static_cast<double>(info_.head_dim)));
  if (!std::isfinite(info_.scale) || info_.scale <= 0)
    throw TraceError(path_ + ": file attribute 'scale' must be a positive finite number");
  if (auto theta = h5_read_float_attr(root, "rope_theta")) {
    if (!std::isfinite(*theta) || *theta <= 1)
      throw TraceError(path_ + ": file attribute 'rope_theta' must be a finite number above 1");
    info_.rope_theta = *theta;
  }

  if (auto compact = h5_read_int_attr(root, "kvtrace_compact")) {
    if (*compact < 1 || *compact > kCompactTraceVersion)
      throw TraceError(path_ + ": kvtrace_compact is " + std::to_string(*compact) +
                       "; this kvsim reads compact traces of versions 1 to " +
                       std::to_string(kCompactTraceVersion));
    info_.compact_version = static_cast<int>(*compact);
    info_.compact_window = require_positive_int(root, "compact_window", path_, false);
    info_.compact_entropies = require_positive_int(root, "compact_entropies", path_, true) != 0;
    read_compact_window_widths();
  }
  read_mrope_section();
  if (!h5_path_exists(root, "samples")) throw TraceError(path_ + ": missing group '/samples'");
  samples_ = h5_group_members(root, "samples");
  if (samples_.empty()) throw TraceError(path_ + ": '/samples' holds no sample");
}

std::optional<std::vector<std::int64_t>> TraceReader::file_int_array_attr(const char* name,
                                                                          std::size_t most) const {
  try {
    return h5_read_int_array_attr(file_.get(), name, most);
  } catch (const TraceError& e) {
    throw TraceError(path_ + ": file " + e.what());
  }
}

void TraceReader::read_compact_window_widths() {
  const auto widths = file_int_array_attr("compact_window_widths", 1 << 16);
  if (!widths) return;
  for (std::size_t i = 0; i < widths->size(); ++i)
    if ((*widths)[i] < 1 || (*widths)[i] > info_.compact_window ||
        (i > 0 && (*widths)[i] <= (*widths)[i - 1]))
      throw TraceError(path_ +
                       ": file attribute 'compact_window_widths' must be ascending widths of 1 "
                       "to compact_window = " +
                       std::to_string(info_.compact_window) + " rows");
  info_.compact_window_widths.assign(widths->begin(), widths->end());
}

void TraceReader::read_mrope_section() {
  const auto section = file_int_array_attr("mrope_section", 3);
  if (!section) return;
  std::int64_t sum = 0;
  for (std::int64_t v : *section) sum += v;
  const bool positive = std::all_of(section->begin(), section->end(), [](auto v) { return v > 0; });
  if (section->size() != 3 || !positive || sum != info_.head_dim / 2)
    throw TraceError(path_ +
                     ": file attribute 'mrope_section' must be 3 positive counts of rotary "
                     "pairs (temporal, height, width) summing to head_dim / 2 = " +
                     std::to_string(info_.head_dim / 2));
  info_.mrope_section.assign(section->begin(), section->end());
}

void TraceReader::read_position_ids(hid_t group, SampleInfo& s) const {
  const std::string w = where(s.name, "position_ids");
  if (info_.mrope_section.empty())
    throw TraceError(w +
                     ": M-RoPE position ids need the file attribute 'mrope_section' (the "
                     "rotary pairs of each axis)");
  H5Handle dset(H5Dopen2(group, "position_ids", H5P_DEFAULT));
  if (!dset.valid()) throw TraceError(w + ": cannot open dataset: " + hdf5_last_error());
  const auto shape = h5_dataset_shape(dset.get());
  const std::vector<hsize_t> want = {3, static_cast<hsize_t>(s.total_len())};
  if (shape != want)
    throw TraceError(w + ": shape " + shape_str(shape) +
                     " does not match [3, T] = " + shape_str(want));
  s.position_ids = h5_read_ints<std::int32_t>(dset.get(), 3 * want[1], "int32", w);
  for (std::size_t i = 0; i < s.position_ids.size(); ++i)
    if (s.position_ids[i] < 0)
      throw TraceError(w + ": value " + std::to_string(s.position_ids[i]) + " at [" +
                       std::to_string(i / want[1]) + ", " + std::to_string(i % want[1]) +
                       "] (position ids are >= 0)");
}

SampleInfo TraceReader::read_sample(const std::string& name) const {
  const std::string group_path = "samples/" + name;
  if (!h5_path_exists(file_.get(), group_path)) {
    std::string names;
    for (std::size_t i = 0; i < std::min<std::size_t>(samples_.size(), 10); ++i)
      names += (i ? ", '" : "'") + samples_[i] + "'";
    if (samples_.size() > 10) names += ", ... (" + std::to_string(samples_.size()) + " in all)";
    throw TraceError(where(name) + ": no such sample; the file has " + names);
  }
  H5Handle g(H5Gopen2(file_.get(), group_path.c_str(), H5P_DEFAULT));
  if (!g.valid()) throw TraceError(where(name) + ": not a group");
  SampleInfo s;
  s.name = name;
  read_sample_attrs(g.get(), s);
  read_positions(g.get(), s);
  check_layer_groups(g.get(), info_.num_layers, where(name));
  if (info_.compact()) read_compact_sample_attrs(g.get(), s);
  check_sample_layers(g.get(), s);
  return s;
}

void TraceReader::read_sample_attrs(hid_t g, SampleInfo& s) const {
  const std::string& name = s.name;
  s.prompt_len = require_positive_int(g, "prompt_len", where(name), false);
  s.gen_len = require_positive_int(g, "gen_len", where(name), true);
  try {
    s.task = h5_read_string_attr(g, "task").value_or("");
    s.reference = h5_read_string_attr(g, "reference").value_or("");
    s.context_id = h5_read_string_attr(g, "context_id").value_or("");
  } catch (const TraceError& e) {
    throw TraceError(where(name) + ": " + e.what());
  }
  if (h5_attr_exists(g, "question_len")) {
    s.question_len = require_positive_int(g, "question_len", where(name), true);
    if (s.question_len >= s.prompt_len)
      throw TraceError(where(name) +
                       ": attribute 'question_len' = " + std::to_string(s.question_len) +
                       " leaves no context (prompt_len = " + std::to_string(s.prompt_len) + ")");
  }
}

void TraceReader::read_positions(hid_t g, SampleInfo& s) const {
  const std::string& name = s.name;
  const int T = s.total_len();
  for (const char* req : {"modality", "segment"})
    if (!h5_path_exists(g, req)) throw TraceError(where(name, req) + ": missing required dataset");
  s.modality = read_1d<std::uint8_t>(g, "modality", T, where(name, "modality"));
  s.segment = read_1d<std::uint8_t>(g, "segment", T, where(name, "segment"));
  if (h5_path_exists(g, "media_id"))
    s.media_id = read_1d<std::int32_t>(g, "media_id", T, where(name, "media_id"));
  if (h5_path_exists(g, "token_ids"))
    s.token_ids = read_1d<std::int32_t>(g, "token_ids", T, where(name, "token_ids"));
  for (int i = 0; i < T; ++i) {
    if (s.modality[i] > 2)
      throw TraceError(where(name, "modality") + ": value " + std::to_string(s.modality[i]) +
                       " at position " + std::to_string(i) +
                       " (allowed: 0 text, 1 image, 2 video)");
    const bool generated = i >= s.prompt_len;
    if (s.segment[i] > 2 || (s.segment[i] == 2) != generated)
      throw TraceError(where(name, "segment") + ": value " + std::to_string(s.segment[i]) +
                       " at position " + std::to_string(i) +
                       " is inconsistent with prompt_len = " + std::to_string(s.prompt_len) +
                       " (positions 0..P-1 must be 0 or 1, "
                       "positions P..T-1 must be 2)");
  }
  check_media_ids(s.modality, s.media_id, where(name, "media_id"));
  if (h5_path_exists(g, "position_ids")) read_position_ids(g, s);
}

void TraceReader::check_sample_layers(hid_t g, SampleInfo& s) const {
  const std::string& name = s.name;
  for (int l = 0; l < info_.num_layers; ++l)
    for (const char* t : {query_dataset(), "k"})
      if (!h5_path_exists(g, "layers/" + std::to_string(l) + "/" + t))
        throw TraceError(where(name, "layers/" + std::to_string(l) + "/" + t) +
                         ": missing dataset (num_layers = " + std::to_string(info_.num_layers) +
                         ")");
  s.has_v = h5_path_exists(g, "layers/0/v");
  for (int l = 1; l < info_.num_layers; ++l)
    if (h5_path_exists(g, "layers/" + std::to_string(l) + "/v") != s.has_v)
      throw TraceError(where(name, "layers/" + std::to_string(l) + "/v") +
                       ": 'v' must be present in every layer or in none");
  const std::string q0_path = std::string("layers/0/") + query_dataset();
  H5Handle q0(H5Dopen2(g, q0_path.c_str(), H5P_DEFAULT));
  s.dtype = tensor_dtype(q0.get(), where(name, q0_path));
}

void TraceReader::read_tensor(const SampleInfo& s, int layer, const char* name, int rows, int heads,
                              xt::xtensor<float, 3>& out) const {
  const std::string rel = "layers/" + std::to_string(layer) + "/" + name;
  const std::string w = where(s.name, rel);
  const std::string full = "samples/" + s.name + "/" + rel;
  H5Handle dset(H5Dopen2(file_.get(), full.c_str(), H5P_DEFAULT));
  if (!dset.valid()) throw TraceError(w + ": cannot open dataset: " + hdf5_last_error());
  const auto shape = h5_dataset_shape(dset.get());
  const std::vector<hsize_t> want = {static_cast<hsize_t>(rows), static_cast<hsize_t>(heads),
                                     static_cast<hsize_t>(info_.head_dim)};
  if (shape != want)
    throw TraceError(w + ": shape " + shape_str(shape) + " does not match " +
                     (rows != s.total_len()      ? "[T - compact_first_row, H, d] = "
                      : heads == info_.num_heads ? "[T, H, d] = "
                                                 : "[T, Hkv, d] = ") +
                     shape_str(want));
  const DType dt = tensor_dtype(dset.get(), w);
  check_filters(dset.get(), w);
  h5_check_written(dset.get(), static_cast<double>(want[0]) * want[1] * want[2] * dtype_bytes(dt),
                   w);
  if (out.shape(0) != want[0] || out.shape(1) != want[1] || out.shape(2) != want[2])
    out.resize({want[0], want[1], want[2]});
  const std::size_t n = out.size();
  std::size_t bad = n;
  if (dt == DType::kFloat16) {
    // Read the raw 16-bit words with the file's own type (no HDF5 conversion), then F16C.
    raw_.resize(n);
    if (n && H5Dread(dset.get(), h5_float16_type(), H5S_ALL, H5S_ALL, H5P_DEFAULT, raw_.data()) < 0)
      throw TraceError(w + ": cannot read (truncated or corrupt file?): " + hdf5_last_error());
    bad = half_to_float(raw_.data(), out.data(), n);
  } else {
    if (n && H5Dread(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) < 0)
      throw TraceError(w + ": cannot read (truncated or corrupt file?): " + hdf5_last_error());
    bad = first_non_finite(out.data(), n);
  }
  if (bad != n) {
    const std::size_t d = info_.head_dim;
    throw TraceError(w + ": " + (std::isnan(out.data()[bad]) ? "NaN" : "Inf") + " at [token " +
                     std::to_string(bad / (heads * d)) + ", head " +
                     std::to_string(bad / d % heads) + ", dim " + std::to_string(bad % d) + "]");
  }
}

LayerTensors TraceReader::read_layer(const SampleInfo& s, int layer) const {
  LayerTensors t;
  read_layer_into(s, layer, t);
  return t;
}

void TraceReader::read_layer_into(const SampleInfo& s, int layer, LayerTensors& t) const {
  if (layer < 0 || layer >= info_.num_layers)
    throw TraceError(where(s.name) + ": layer " + std::to_string(layer) + " out of range [0, " +
                     std::to_string(info_.num_layers) + ")");
  t.layer = layer;
  const int T = s.total_len();
  t.q_first_row = s.compact_first_row;
  read_tensor(s, layer, query_dataset(), T - t.q_first_row, info_.num_heads, t.q);
  read_tensor(s, layer, "k", T, info_.num_kv_heads, t.k);
  if (s.has_v)
    read_tensor(s, layer, "v", T, info_.num_kv_heads, t.v);
  else
    t.v = xt::xtensor<float, 3>();
  t.stored = info_.compact() ? read_stored_stats(s, layer) : nullptr;
}

std::vector<float> TraceReader::read_sample_matrix(const SampleInfo& s, const char* name, int& rows,
                                                   int& cols) const {
  const std::string full = "samples/" + s.name + "/" + name;
  rows = cols = 0;
  if (!h5_path_exists(file_.get(), full)) return {};
  H5Handle d(H5Dopen2(file_.get(), full.c_str(), H5P_DEFAULT));
  const auto shape = d.valid() ? h5_dataset_shape(d.get()) : std::vector<hsize_t>{};
  if (shape.size() != 2 || shape[0] > (1u << 30) || shape[1] > (1u << 30))
    throw TraceError(where(s.name, name) + ": expected a [rows, cols] dataset");
  h5_check_written(d.get(), 4.0 * shape[0] * shape[1], where(s.name, name));
  std::vector<float> out(shape[0] * shape[1]);
  if (!out.empty() &&
      H5Dread(d.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) < 0)
    throw TraceError(where(s.name, name) + ": cannot read: " + hdf5_last_error());
  rows = static_cast<int>(shape[0]);
  cols = static_cast<int>(shape[1]);
  return out;
}

std::uint64_t TraceReader::stored_bytes(const std::string& sample) const {
  std::uint64_t total = 0;
  for (int l = 0; l < info_.num_layers; ++l)
    for (const char* t : {query_dataset(), "k", "v"}) {
      const std::string p = "samples/" + sample + "/layers/" + std::to_string(l) + "/" + t;
      if (!h5_path_exists(file_.get(), p)) continue;
      H5Handle d(H5Dopen2(file_.get(), p.c_str(), H5P_DEFAULT));
      total += H5Dget_storage_size(d.get());
    }
  return total;
}

std::string TraceReader::storage_layout(const std::string& sample) const {
  const std::string rel = std::string("layers/0/") + query_dataset();
  const std::string p = "samples/" + sample + "/" + rel;
  H5Handle d(H5Dopen2(file_.get(), p.c_str(), H5P_DEFAULT));
  if (!d.valid()) throw TraceError(where(sample, rel) + ": cannot open dataset");
  H5Handle dcpl(H5Dget_create_plist(d.get()));
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  if (layout != H5D_CHUNKED) return layout == H5D_COMPACT ? "compact" : "contiguous";
  std::string out = "chunked";
  for (const auto& [f, name] : dataset_filters(dcpl.get()))
    out += f == H5Z_FILTER_DEFLATE ? "+gzip" : f == H5Z_FILTER_SHUFFLE ? "+shuffle" : "+" + name;
  return out;
}

}  // namespace kvsim
