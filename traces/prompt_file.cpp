#include "traces/prompt_file.hpp"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>

#include "traces/half.hpp"

namespace kvsim {

std::vector<int> PromptSample::embed_positions() const {
  std::vector<int> out;
  if (inputs_embeds.empty()) return out;
  for (int i = 0; i < info.prompt_len; ++i)
    if (info.modality[i] != 0) out.push_back(i);
  return out;
}

namespace {

// A one-dimensional integer dataset of any length (up to 2^30).
template <typename T>
std::vector<T> read_ints(hid_t group, const char* name, const std::string& where) {
  H5Handle d(H5Dopen2(group, name, H5P_DEFAULT));
  if (!d.valid()) throw TraceError(where + ": cannot open dataset: " + hdf5_last_error());
  const auto shape = h5_dataset_shape(d.get());
  if (shape.size() != 1 || shape[0] > (1u << 30))
    throw TraceError(where + ": must be one-dimensional (and at most 2^30 long)");
  return h5_read_ints<T>(d.get(), shape[0], sizeof(T) == 1 ? "uint8" : "int32", where);
}

// position_ids: int32 [P, 3], non-negative.
void read_position_ids(hid_t g, PromptSample& s, const std::string& where) {
  H5Handle d(H5Dopen2(g, "position_ids", H5P_DEFAULT));
  if (!d.valid()) throw TraceError(where + ": cannot open dataset: " + hdf5_last_error());
  const auto shape = h5_dataset_shape(d.get());
  const int P = s.info.prompt_len;
  if (shape.size() != 2 || shape[0] != static_cast<hsize_t>(P) || shape[1] != 3) {
    std::string got;
    for (auto x : shape) got += (got.empty() ? "" : ", ") + std::to_string(x);
    throw TraceError(where + ": shape [" + got + "], expected [" + std::to_string(P) +
                     ", 3] (temporal, height, width ids of each prompt token)");
  }
  s.position_ids = h5_read_ints<std::int32_t>(d.get(), shape[0] * 3, "int32", where);
  for (std::size_t i = 0; i < s.position_ids.size(); ++i)
    if (s.position_ids[i] < 0)
      throw TraceError(where + ": negative id " + std::to_string(s.position_ids[i]) + " at token " +
                       std::to_string(i / 3));
}

void read_embeds(hid_t g, PromptSample& s, const std::string& where) {
  H5Handle d(H5Dopen2(g, "inputs_embeds", H5P_DEFAULT));
  const auto shape = h5_dataset_shape(d.get());
  int vision = 0;
  for (auto m : s.info.modality) vision += m != 0;
  if (shape.size() != 2 || shape[0] != static_cast<hsize_t>(vision) || shape[1] == 0)
    throw TraceError(where + ": shape must be [Nv, hidden] with Nv = " + std::to_string(vision) +
                     " vision positions (modality != 0)");
  H5Handle type(H5Dget_type(d.get()));
  const std::size_t bytes = H5Tget_size(type.get());
  if (H5Tget_class(type.get()) != H5T_FLOAT || (bytes != 2 && bytes != 4 && bytes != 8))
    throw TraceError(where + ": element type must be float16, float32 or float64");
  h5_check_written(d.get(), static_cast<double>(shape[0]) * shape[1] * H5Tget_size(type.get()),
                   where);
  s.embed_dim = static_cast<int>(shape[1]);
  s.inputs_embeds.resize(shape[0] * shape[1]);
  if (H5Tget_size(type.get()) == 2) {
    std::vector<std::uint16_t> raw(s.inputs_embeds.size());
    if (H5Dread(d.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, raw.data()) < 0)
      throw TraceError(where + ": cannot read: " + hdf5_last_error());
    const std::size_t bad = half_to_float(raw.data(), s.inputs_embeds.data(), raw.size());
    if (bad != raw.size())
      throw TraceError(where + ": non-finite value at flat index " + std::to_string(bad));
    return;
  }
  // float32 as stored; float64 (numpy's default) converted by HDF5, as the model computes in
  // float32 at most.
  if (H5Dread(d.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, s.inputs_embeds.data()) < 0)
    throw TraceError(where + ": cannot read: " + hdf5_last_error());
  const std::size_t bad = first_non_finite(s.inputs_embeds.data(), s.inputs_embeds.size());
  if (bad != s.inputs_embeds.size())
    throw TraceError(where + ": non-finite value at flat index " + std::to_string(bad) +
                     (bytes == 8 ? " (as float32: beyond its range?)" : ""));
}

}  // namespace

PromptReader::PromptReader(const std::string& path) : path_(path) {
  silence_hdf5_errors();
  if (std::FILE* f = std::fopen(path.c_str(), "rb"))
    std::fclose(f);
  else
    throw TraceError(path + ": cannot open file (does it exist and is it readable?)");
  if (H5Fis_hdf5(path.c_str()) <= 0) throw TraceError(path + ": not an HDF5 file");
  file_ = H5Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!file_.valid()) throw TraceError(path + ": cannot open: " + hdf5_last_error());
  const auto version = h5_read_int_attr(file_.get(), "kvprompt_version");
  if (!version)
    throw TraceError(path + ": missing attribute 'kvprompt_version' (not a prompt file)");
  if (*version != 1)
    throw TraceError(path + ": kvprompt_version " + std::to_string(*version) +
                     " is not supported (1)");
  if (!h5_path_exists(file_.get(), "samples"))
    throw TraceError(path + ": missing group '/samples'");
  samples_ = h5_group_members(file_.get(), "samples");
  if (samples_.empty()) throw TraceError(path + ": '/samples' holds no sample");
}

PromptSample PromptReader::read(const std::string& name) const {
  const std::string where = path_ + ": sample '" + name + "'";
  if (!h5_path_exists(file_.get(), "samples/" + name)) throw TraceError(where + ": no such sample");
  H5Handle g(H5Gopen2(file_.get(), ("samples/" + name).c_str(), H5P_DEFAULT));
  PromptSample s;
  s.info.name = name;
  try {
    s.info.task = h5_read_string_attr(g.get(), "task").value_or("");
    s.info.reference = h5_read_string_attr(g.get(), "reference").value_or("");
    s.info.context_id = h5_read_string_attr(g.get(), "context_id").value_or("");
  } catch (const TraceError& e) {
    throw TraceError(where + ": " + e.what());
  }
  if (!h5_path_exists(g.get(), "token_ids"))
    throw TraceError(where + ", dataset 'token_ids': missing required dataset");
  s.info.token_ids = read_ints<std::int32_t>(g.get(), "token_ids", where + ", dataset 'token_ids'");
  const int P = s.info.prompt_len = static_cast<int>(s.info.token_ids.size());
  if (P == 0) throw TraceError(where + ", dataset 'token_ids': empty prompt");
  if (const auto q = h5_read_int_attr(g.get(), "question_len")) {
    if (*q < 0 || *q >= P)
      throw TraceError(where + ": attribute 'question_len' = " + std::to_string(*q) +
                       " must be in [0, " + std::to_string(P) + ") (at least one context token)");
    s.info.question_len = static_cast<int>(*q);
  }
  s.info.modality.assign(P, 0);
  s.info.segment.assign(P, 1);
  auto optional_meta = [&](const char* key, auto& out) {
    if (!h5_path_exists(g.get(), key)) return;
    const std::string w = where + ", dataset '" + key + "'";
    out = read_ints<typename std::decay_t<decltype(out)>::value_type>(g.get(), key, w);
    if (static_cast<int>(out.size()) != P)
      throw TraceError(w + ": length " + std::to_string(out.size()) + " differs from token_ids' " +
                       std::to_string(P));
  };
  optional_meta("modality", s.info.modality);
  optional_meta("segment", s.info.segment);
  optional_meta("media_id", s.info.media_id);
  for (int i = 0; i < P; ++i) {
    if (s.info.modality[i] > 2)
      throw TraceError(where + ", dataset 'modality': value " + std::to_string(s.info.modality[i]) +
                       " at position " + std::to_string(i) +
                       " (allowed: 0 text, 1 image, 2 video)");
    if (s.info.segment[i] > 1)
      throw TraceError(where + ", dataset 'segment': value " + std::to_string(s.info.segment[i]) +
                       " at position " + std::to_string(i) + " (a prompt holds 0 system, 1 user)");
  }
  // As in kvtrace v1, which a capture of this prompt writes.
  check_media_ids(s.info.modality, s.info.media_id, where + ", dataset 'media_id'");
  if (h5_path_exists(g.get(), "inputs_embeds"))
    read_embeds(g.get(), s, where + ", dataset 'inputs_embeds'");
  if (h5_path_exists(g.get(), "reference_ids"))
    s.reference_ids =
        read_ints<std::int32_t>(g.get(), "reference_ids", where + ", dataset 'reference_ids'");
  if (h5_path_exists(g.get(), "position_ids"))
    read_position_ids(g.get(), s, where + ", dataset 'position_ids'");
  return s;
}

int PromptReader::prompt_len(const std::string& name) const {
  if (!h5_path_exists(file_.get(), "samples/" + name))
    throw TraceError(path_ + ": sample '" + name + "': no such sample");
  const std::string where = path_ + ": sample '" + name + "', dataset 'token_ids'";
  if (!h5_path_exists(file_.get(), "samples/" + name + "/token_ids"))
    throw TraceError(where + ": missing required dataset");
  H5Handle d(H5Dopen2(file_.get(), ("samples/" + name + "/token_ids").c_str(), H5P_DEFAULT));
  if (!d.valid()) throw TraceError(where + ": cannot open dataset: " + hdf5_last_error());
  const auto shape = h5_dataset_shape(d.get());
  if (shape.size() != 1 || shape[0] > (1u << 30))
    throw TraceError(where + ": must be one-dimensional (and at most 2^30 long)");
  return static_cast<int>(shape[0]);
}

std::string PromptReader::context_id(const std::string& name) const {
  const std::string where = path_ + ": sample '" + name + "'";
  if (!h5_path_exists(file_.get(), "samples/" + name)) throw TraceError(where + ": no such sample");
  H5Handle g(H5Gopen2(file_.get(), ("samples/" + name).c_str(), H5P_DEFAULT));
  try {
    return h5_read_string_attr(g.get(), "context_id").value_or("");
  } catch (const TraceError& e) {
    throw TraceError(where + ": " + e.what());
  }
}

namespace {

// The sample's context as comparable parts: the first C = P - question positions of every
// per-position array and the image rows among them.
struct Context {
  std::string sample;
  std::vector<std::vector<std::int64_t>> parts;
  std::vector<float> rows;
};

Context context_of(const PromptSample& p) {
  const SampleInfo& s = p.info;
  const std::size_t C = static_cast<std::size_t>(s.prompt_len - question_length(s));
  auto head = [&](const auto& v, std::size_t n) {
    return std::vector<std::int64_t>(v.begin(), v.begin() + std::min(n, v.size()));
  };
  Context c{s.name,
            {head(s.token_ids, C), head(s.modality, C), head(s.segment, C), head(s.media_id, C),
             head(p.position_ids, 3 * C)},
            {}};
  const auto vision = std::count_if(s.modality.begin(), s.modality.begin() + C,
                                    [](std::uint8_t m) { return m != 0; });
  if (!p.inputs_embeds.empty())
    c.rows.assign(p.inputs_embeds.begin(),
                  p.inputs_embeds.begin() + static_cast<std::size_t>(vision) * p.embed_dim);
  return c;
}

}  // namespace

void check_shared_contexts(const PromptReader& prompts, const std::vector<std::string>& samples) {
  std::map<std::string, Context> first;
  static const char* kPart[] = {"token_ids", "modality", "segment", "media_id", "position_ids"};
  for (const auto& name : samples) {
    if (prompts.context_id(name).empty()) continue;  // the common case: nothing more is read
    const PromptSample p = prompts.read(name);
    Context c = context_of(p);
    const auto [it, inserted] = first.emplace(p.info.context_id, c);
    if (inserted) continue;
    const Context& f = it->second;
    std::string differs;
    for (std::size_t i = 0; i < c.parts.size() && differs.empty(); ++i)
      if (c.parts[i] != f.parts[i]) differs = kPart[i];
    if (differs.empty() && c.rows != f.rows) differs = "inputs_embeds";
    if (!differs.empty())
      throw TraceError(prompts.path() + ": samples '" + f.sample + "' and '" + name +
                       "' name context_id '" + p.info.context_id + "' but their contexts (the " +
                       "prompt less the question) differ in " + differs);
  }
}

void write_prompt_file(const std::string& path, const std::vector<PromptSample>& samples,
                       const std::string& model) {
  silence_hdf5_errors();
  H5Handle file(
      H5Fcreate(path.c_str(), H5F_ACC_TRUNC, h5_untimed_plist(H5P_FILE_CREATE).get(), H5P_DEFAULT));
  if (!file.valid()) throw TraceError(path + ": cannot create: " + hdf5_last_error());
  h5_write_int_attr(file.get(), "kvprompt_version", 1);
  if (!model.empty()) h5_write_string_attr(file.get(), "model", model);
  for (const auto& s : samples) {
    const std::string where = path + ": sample '" + s.info.name + "'";
    H5Handle g = h5_require_group(file.get(), "samples/" + s.info.name);
    if (!s.info.task.empty()) h5_write_string_attr(g.get(), "task", s.info.task);
    if (!s.info.reference.empty()) h5_write_string_attr(g.get(), "reference", s.info.reference);
    if (s.info.question_len >= 0) h5_write_int_attr(g.get(), "question_len", s.info.question_len);
    if (!s.info.context_id.empty()) h5_write_string_attr(g.get(), "context_id", s.info.context_id);
    h5_write_1d(g.get(), "token_ids", H5T_STD_I32LE, H5T_NATIVE_INT32, s.info.token_ids, where);
    h5_write_1d(g.get(), "modality", H5T_STD_U8LE, H5T_NATIVE_UINT8, s.info.modality, where);
    h5_write_1d(g.get(), "segment", H5T_STD_U8LE, H5T_NATIVE_UINT8, s.info.segment, where);
    if (!s.info.media_id.empty())
      h5_write_1d(g.get(), "media_id", H5T_STD_I32LE, H5T_NATIVE_INT32, s.info.media_id, where);
    if (!s.reference_ids.empty())
      h5_write_1d(g.get(), "reference_ids", H5T_STD_I32LE, H5T_NATIVE_INT32, s.reference_ids,
                  where);
    if (!s.position_ids.empty())
      h5_write_2d(g.get(), "position_ids", H5T_STD_I32LE, H5T_NATIVE_INT32, s.position_ids.data(),
                  s.position_ids.size() / 3, 3, where);
    if (!s.inputs_embeds.empty())
      h5_write_2d(g.get(), "inputs_embeds", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT,
                  s.inputs_embeds.data(), s.inputs_embeds.size() / s.embed_dim, s.embed_dim, where);
  }
}

}  // namespace kvsim
