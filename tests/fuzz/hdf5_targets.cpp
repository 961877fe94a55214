// Fuzz targets over kvsim's HDF5 inputs (kvtrace v1 traces, kvprompt v1 prompt files). The input
// is read as choices that build a small HDF5 file — attributes missing, of the wrong type or
// extreme, datasets of perturbed shapes, types, values and storage, layer groups missing, extra
// or misnamed — which kvsim then reads as `kvsim inspect` does and, when it is valid, replays.
#include <unistd.h>

#include <filesystem>

#include "sim/replay/engine.hpp"
#include "tests/fuzz/byte_source.hpp"
#include "tests/fuzz/targets.hpp"
#include "traces/hdf5_util.hpp"
#include "traces/prompt_file.hpp"

namespace kvsim::fuzz {

ScratchFile::ScratchFile(const std::string& suffix)
    : path_((std::filesystem::temp_directory_path() /
             ("kvsim_fuzz_" + std::to_string(getpid()) + suffix))
                .string()) {}

ScratchFile::~ScratchFile() {
  std::error_code ignored;
  std::filesystem::remove(path_, ignored);
}

namespace {

// An attribute the format wants as an integer, written as the input chooses: the valid value
// (choice 0), missing, a string, a float, an array, or any 64-bit value.
void int_attr(ByteSource& in, hid_t obj, const char* name, std::int64_t valid) {
  switch (in.pick(8)) {
    case 1:
      return;
    case 2:
      h5_write_string_attr(obj, name, std::to_string(valid));
      return;
    case 3:
      h5_write_float_attr(obj, name, valid + 0.5);
      return;
    case 4: {
      const hsize_t n = 2;
      const std::int64_t v[2] = {valid, valid};
      H5Handle space(H5Screate_simple(1, &n, nullptr));
      H5Handle a(H5Acreate2(obj, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT));
      H5Awrite(a.get(), H5T_NATIVE_INT64, v);
      return;
    }
    case 5:
      h5_write_int_attr(obj, name, in.int64());
      return;
    case 6:
      h5_write_int_attr(obj, name, valid + static_cast<std::int8_t>(in.byte()));
      return;
    default:
      h5_write_int_attr(obj, name, valid);
  }
}

void string_attr(ByteSource& in, hid_t obj, const char* name, bool required) {
  switch (in.pick(4)) {
    case 1:
      if (required) return;
      h5_write_string_attr(obj, name, in.text(16));
      return;
    case 2:
      h5_write_int_attr(obj, name, 7);
      return;
    case 3:
      h5_write_string_attr(obj, name, in.text(16));
      return;
    default:
      if (required) h5_write_string_attr(obj, name, "fuzz");
  }
}

// Element types a dataset may be written with.
hid_t file_type(int choice, bool floating) {
  static const hid_t floats[] = {H5T_IEEE_F32LE, H5T_IEEE_F64LE, H5T_STD_I32LE, H5T_STD_U8LE};
  static const hid_t ints[] = {H5T_STD_U8LE, H5T_STD_I64LE, H5T_IEEE_F32LE, H5T_STD_I8LE};
  return floating ? floats[choice % 4] : ints[choice % 4];
}

// A dataset of `dims` (the valid shape) written as the input chooses: valid, missing, a perturbed
// shape, another element type, float16, other storage (chunked, gzip, shuffle, fletcher32), never
// written, or of a huge declared shape never written. Values come from `value(i)` or the input.
void dataset(ByteSource& in, hid_t group, const std::string& name, std::vector<hsize_t> dims,
             bool floating, const std::function<double(std::size_t)>& value) {
  const int mode = in.pick(12);
  if (mode == 1) return;
  if (mode == 2 && !dims.empty()) dims[in.pick(static_cast<int>(dims.size()))] += 1;
  if (mode == 3 && !dims.empty()) dims[in.pick(static_cast<int>(dims.size()))] -= 1;
  if (mode == 4) dims.push_back(1 + in.pick(2));
  if (mode == 5 && !dims.empty()) dims.pop_back();
  if (mode == 11) dims[0] = static_cast<hsize_t>(1) << (20 + in.pick(20));
  hid_t type = floating ? H5T_IEEE_F32LE : H5T_STD_I32LE;
  if (mode == 6) type = file_type(in.byte(), floating);
  if (mode == 7 && floating) type = h5_float16_type();
  H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE));
  std::size_t n = 1;
  for (hsize_t d : dims) n *= d;
  if ((mode == 8 || mode == 11) && n > 0) {
    std::vector<hsize_t> chunk(dims.size(), 1);
    if (!chunk.empty()) chunk[0] = std::max<hsize_t>(1, std::min<hsize_t>(dims[0], 4));
    H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data());
    const int filters = in.byte();
    if (filters & 1) H5Pset_shuffle(dcpl.get());
    if (filters & 2) H5Pset_deflate(dcpl.get(), 1);
    if (filters & 4) H5Pset_fletcher32(dcpl.get());
  }
  H5Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
  H5Handle d(
      H5Dcreate2(group, name.c_str(), type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT));
  if (!d.valid() || mode == 9 || mode == 11) return;
  std::vector<double> values(n);
  const bool random_values = mode == 10;
  for (std::size_t i = 0; i < n; ++i)
    values[i] = random_values ? (in.pick(2) ? in.float32() : static_cast<double>(in.int64() % 300))
                              : value(i);
  H5Dwrite(d.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data());
}

struct Shape {
  int layers, heads, kv_heads, dim, prompt, gen;
};

Shape pick_shape(ByteSource& in) {
  Shape s{1 + in.pick(3), 1, 1, 1 + in.pick(3), 1 + in.pick(6), in.pick(4)};
  s.kv_heads = 1 + in.pick(2);
  s.heads = s.kv_heads * (1 + in.pick(2));
  return s;
}

void write_trace_sample(ByteSource& in, hid_t file, const std::string& name, const Shape& s) {
  H5Handle g = h5_require_group(file, "samples/" + name);
  const int T = s.prompt + s.gen;
  int_attr(in, g.get(), "prompt_len", s.prompt);
  int_attr(in, g.get(), "gen_len", s.gen);
  string_attr(in, g.get(), "task", false);
  const int image_from = in.pick(s.prompt + 1), image_to = image_from + in.pick(s.prompt + 1);
  auto is_image = [&](std::size_t i) {
    return static_cast<int>(i) >= image_from && static_cast<int>(i) < std::min(image_to, s.prompt);
  };
  const std::vector<hsize_t> tokens = {static_cast<hsize_t>(T)};
  dataset(in, g.get(), "modality", tokens, false,
          [&](std::size_t i) { return is_image(i) ? 1 : 0; });
  dataset(in, g.get(), "segment", tokens, false,
          [&](std::size_t i) { return static_cast<int>(i) < s.prompt ? 1 : 2; });
  if (in.pick(2))
    dataset(in, g.get(), "media_id", tokens, false,
            [&](std::size_t i) { return is_image(i) ? 0 : -1; });
  const bool with_v = in.pick(4) != 1;
  const int layer_groups = s.layers + in.pick(3) - (in.pick(4) == 1 ? 1 : 0);
  for (int l = 0; l < layer_groups; ++l) {
    std::string lname = std::to_string(l);
    if (in.pick(16) == 1) lname = "0" + lname;
    H5Handle lg = h5_require_group(g.get(), "layers/" + lname);
    auto values = [&](std::size_t i) { return std::sin(0.37 * i + l); };
    const auto T_ = static_cast<hsize_t>(T), d = static_cast<hsize_t>(s.dim);
    dataset(in, lg.get(), "q", {T_, static_cast<hsize_t>(s.heads), d}, true, values);
    dataset(in, lg.get(), "k", {T_, static_cast<hsize_t>(s.kv_heads), d}, true, values);
    if (with_v) dataset(in, lg.get(), "v", {T_, static_cast<hsize_t>(s.kv_heads), d}, true, values);
  }
}

// Reads everything as `kvsim inspect` does, then replays the valid samples through a few
// policies of different kinds (the engine's invariants are checked on every step).
void read_and_replay(const std::string& path) {
  TraceReader reader(path);
  static const std::vector<PolicyConfig> policies = {
      make_policy_config("full", {}), make_policy_config("h2o", {{"budget", "2"}}),
      make_policy_config("snapkv", {{"budget", "3"}, {"window", "1"}}),
      make_policy_config("hae", {{"budget", "2"}}), make_policy_config("meda", {})};
  for (const auto& name : reader.sample_names()) {
    const SampleInfo s = reader.read_sample(name);
    for (int l = 0; l < reader.info().num_layers; ++l) reader.read_layer(s, l);
    try {
      Replayer(reader, policies, {}).replay_sample(name, [](const LayerResult&) {});
    } catch (const std::invalid_argument&) {  // a policy refusing this trace, with its reason
    }
  }
}

}  // namespace

void kvtrace(const std::uint8_t* data, std::size_t size) {
  silence_hdf5_errors();
  ByteSource in(data, size);
  const ScratchFile scratch(".h5");
  const std::string& path = scratch.path();
  const Shape s = pick_shape(in);
  {
    H5Handle file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
    const hid_t f = file.get();
    int_attr(in, f, "kvtrace_version", 1);
    string_attr(in, f, "model", true);
    int_attr(in, f, "num_layers", s.layers);
    int_attr(in, f, "num_heads", s.heads);
    int_attr(in, f, "num_kv_heads", s.kv_heads);
    int_attr(in, f, "head_dim", s.dim);
    if (in.pick(4) == 1) h5_write_float_attr(f, "scale", in.float32());
    const int samples = in.pick(4) == 1 ? 0 : 1 + in.pick(2);
    if (samples == 0) h5_require_group(f, "samples");
    for (int i = 0; i < samples; ++i)
      write_trace_sample(in, f, std::string(1, static_cast<char>('a' + i)), s);
  }
  try {
    read_and_replay(path);
  } catch (const TraceError&) {
  }
}

void kvprompt(const std::uint8_t* data, std::size_t size) {
  silence_hdf5_errors();
  ByteSource in(data, size);
  const ScratchFile scratch(".kvprompt.h5");
  const std::string& path = scratch.path();
  const int P = 1 + in.pick(6), embed_dim = 1 + in.pick(3);
  {
    H5Handle file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
    int_attr(in, file.get(), "kvprompt_version", 1);
    string_attr(in, file.get(), "model", false);
    const int samples = 1 + in.pick(2);
    for (int i = 0; i < samples; ++i) {
      H5Handle g = h5_require_group(file.get(), "samples/p" + std::to_string(i));
      string_attr(in, g.get(), "task", false);
      string_attr(in, g.get(), "reference", false);
      const std::vector<hsize_t> tokens = {static_cast<hsize_t>(P)};
      const int image_from = in.pick(P + 1);
      auto is_image = [&](std::size_t i) { return static_cast<int>(i) >= image_from; };
      dataset(in, g.get(), "token_ids", tokens, false, [](std::size_t i) { return 3 + i; });
      dataset(in, g.get(), "modality", tokens, false, [&](std::size_t i) { return is_image(i); });
      dataset(in, g.get(), "segment", tokens, false, [](std::size_t) { return 1; });
      if (in.pick(2))
        dataset(in, g.get(), "media_id", tokens, false,
                [&](std::size_t i) { return is_image(i) ? 0 : -1; });
      if (image_from < P)
        dataset(in, g.get(), "inputs_embeds",
                {static_cast<hsize_t>(P - image_from), static_cast<hsize_t>(embed_dim)}, true,
                [](std::size_t i) { return 0.25 * i; });
      if (in.pick(2))
        dataset(in, g.get(), "reference_ids", {2}, false, [](std::size_t i) { return i; });
    }
  }
  try {
    PromptReader reader(path);
    for (const auto& name : reader.sample_names()) reader.read(name).embed_positions();
  } catch (const TraceError&) {
  }
}

}  // namespace kvsim::fuzz
