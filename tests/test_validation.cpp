// Every format violation is a TraceError naming the file, the sample and the dataset.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "tests/tiny_trace.hpp"

namespace kvsim::test {
namespace {

// A valid trace (2 layers, H = 2 on one KV head, P = 4, G = 2, with v), then `edit` applied.
std::string broken_trace(const std::string& name, const std::function<void(hid_t)>& edit,
                         DType dtype = DType::kFloat32) {
  TinyTrace t{.prompt_len = 4,
              .weights = {1, 2, 3, 4, 5, 6},
              .values = {1, 2, 3, 4, 5, 6},
              .layers = 2,
              .heads = 2,
              .dtype = dtype};
  const std::string path = t.write(name);
  silence_hdf5_errors();
  H5Handle f(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
  edit(f.get());
  return path;
}

void set_int_attr(hid_t f, const char* obj, const char* name, std::int64_t v) {
  H5Handle o(H5Oopen(f, obj, H5P_DEFAULT));
  h5_write_int_attr(o.get(), name, v);
}

void replace_dataset(hid_t f, const std::string& path, std::vector<hsize_t> dims, hid_t type,
                     const void* data) {
  H5Ldelete(f, path.c_str(), H5P_DEFAULT);
  H5Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
  H5Handle d(H5Dcreate2(f, path.c_str(), type, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  H5Dwrite(d.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
}

// Opens the trace and reads every sample and layer, as `kvsim inspect` does.
void read_everything(const std::string& path) {
  TraceReader r(path);
  for (const auto& name : r.sample_names()) {
    const SampleInfo s = r.read_sample(name);
    for (int l = 0; l < r.info().num_layers; ++l) r.read_layer(s, l);
  }
}

void expect_error(const std::string& path, const std::vector<std::string>& fragments) {
  try {
    read_everything(path);
    FAIL() << "no error for " << path;
  } catch (const TraceError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    for (const auto& f : fragments)
      EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
  }
}

TEST(Validation, ValidTracePasses) {
  EXPECT_NO_THROW(read_everything(broken_trace("valid.h5", [](hid_t) {})));
}

TEST(Validation, MissingFileAttribute) {
  expect_error(broken_trace("no_heads.h5", [](hid_t f) { H5Adelete(f, "num_heads"); }),
               {"missing attribute 'num_heads'"});
}

TEST(Validation, WrongVersion) {
  expect_error(broken_trace("v2.h5", [](hid_t f) { set_int_attr(f, "/", "kvtrace_version", 2); }),
               {"kvtrace_version is 2"});
}

TEST(Validation, KvHeadsMustDivideHeads) {
  expect_error(broken_trace("gqa.h5",
                            [](hid_t f) {
                              set_int_attr(f, "/", "num_heads", 3);
                              set_int_attr(f, "/", "num_kv_heads", 2);
                            }),
               {"num_kv_heads = 2 does not divide num_heads = 3"});
}

TEST(Validation, MissingSampleAttribute) {
  expect_error(broken_trace("no_gen.h5",
                            [](hid_t f) {
                              H5Handle g(H5Gopen2(f, "samples/s0", H5P_DEFAULT));
                              H5Adelete(g.get(), "gen_len");
                            }),
               {"sample 's0'", "missing attribute 'gen_len'"});
}

TEST(Validation, TokenArraysMustHaveLengthT) {
  expect_error(
      broken_trace("plen.h5", [](hid_t f) { set_int_attr(f, "samples/s0", "prompt_len", 5); }),
      {"sample 's0'", "dataset 'modality'", "shape [6] does not match [T] = [7]"});
}

TEST(Validation, SegmentsInconsistentWithPromptLen) {
  expect_error(broken_trace("seg.h5",
                            [](hid_t f) {
                              const std::uint8_t seg[6] = {0, 1, 2, 1, 2, 2};
                              replace_dataset(f, "samples/s0/segment", {6}, H5T_NATIVE_UINT8, seg);
                            }),
               {"dataset 'segment'", "position 2", "prompt_len = 4"});
}

TEST(Validation, ModalityOutOfRange) {
  expect_error(broken_trace("mod.h5",
                            [](hid_t f) {
                              const std::uint8_t mod[6] = {0, 0, 7, 0, 0, 0};
                              replace_dataset(f, "samples/s0/modality", {6}, H5T_NATIVE_UINT8, mod);
                            }),
               {"dataset 'modality'", "value 7 at position 2"});
}

TEST(Validation, ShapeMismatch) {
  expect_error(
      broken_trace("shape.h5",
                   [](hid_t f) {
                     const float k[6 * 2] = {};
                     replace_dataset(f, "samples/s0/layers/1/k", {6, 2, 1}, H5T_NATIVE_FLOAT, k);
                   }),
      {"sample 's0'", "dataset 'layers/1/k'",
       "shape [6, 2, 1] does not match [T, Hkv, d] = [6, 1, 1]"});
}

TEST(Validation, MissingLayerDataset) {
  expect_error(
      broken_trace("noq.h5", [](hid_t f) { H5Ldelete(f, "samples/s0/layers/1/q", H5P_DEFAULT); }),
      {"dataset 'layers/1/q'", "missing dataset"});
}

TEST(Validation, ValuesInSomeLayersOnly) {
  expect_error(
      broken_trace("somev.h5", [](hid_t f) { H5Ldelete(f, "samples/s0/layers/1/v", H5P_DEFAULT); }),
      {"layers/1/v", "every layer or in none"});
}

TEST(Validation, NaNInQueries) {
  expect_error(
      broken_trace(
          "nan.h5",
          [](hid_t f) {
            std::vector<float> q(6 * 2, 0.5f);
            q[2 * 2 + 1] = NAN;
            replace_dataset(f, "samples/s0/layers/1/q", {6, 2, 1}, H5T_NATIVE_FLOAT, q.data());
          }),
      {"dataset 'layers/1/q'", "NaN at [token 2, head 1, dim 0]"});
}

TEST(Validation, InfInFloat16Keys) {
  expect_error(
      broken_trace(
          "inf16.h5",
          [](hid_t f) {
            std::vector<std::uint16_t> k(6, 0x3C00);
            k[4] = 0x7C00;  // +Inf
            replace_dataset(f, "samples/s0/layers/0/k", {6, 1, 1}, h5_float16_type(), k.data());
          }),
      {"dataset 'layers/0/k'", "Inf at [token 4, head 0, dim 0]"});
}

TEST(Validation, NonFloatTensor) {
  expect_error(
      broken_trace(
          "int.h5",
          [](hid_t f) {
            std::vector<std::int32_t> v(6, 1);
            replace_dataset(f, "samples/s0/layers/0/v", {6, 1, 1}, H5T_NATIVE_INT32, v.data());
          }),
      {"dataset 'layers/0/v'", "not floating point"});
}

// kvtrace-v1.md's contract, each thing it forbids.
TEST(Validation, LayerGroupBeyondNumLayers) {
  expect_error(broken_trace("extra_layer.h5",
                            [](hid_t f) {
                              H5Handle g(H5Gcreate2(f, "samples/s0/layers/2", H5P_DEFAULT,
                                                    H5P_DEFAULT, H5P_DEFAULT));
                            }),
               {"sample 's0'", "'layers/2' is not a layer of this trace (num_layers = 2"});
}

TEST(Validation, LayerNamesAreDecimalWithoutPadding) {
  for (const char* name : {"01", "x", "-1", "1.0"}) {
    const std::string group = std::string("samples/s0/layers/") + name;
    expect_error(broken_trace(std::string("layer_name_") + (name[0] == '-' ? "neg" : name) + ".h5",
                              [&](hid_t f) {
                                H5Handle g(H5Gcreate2(f, group.c_str(), H5P_DEFAULT, H5P_DEFAULT,
                                                      H5P_DEFAULT));
                              }),
                 {std::string("'layers/") + name + "' is not a layer", "without padding"});
  }
}

TEST(Validation, LayerMustBeAGroup) {
  expect_error(broken_trace("layer_dataset.h5",
                            [](hid_t f) {
                              const float x = 1;
                              replace_dataset(f, "samples/s0/layers/1", {1}, H5T_NATIVE_FLOAT, &x);
                            }),
               {"'layers/1' is not a group"});
}

TEST(Validation, OnlyGzipAndShuffleFilters) {
  expect_error(
      broken_trace("fletcher.h5",
                   [](hid_t f) {
                     const float q[6 * 2] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
                     H5Ldelete(f, "samples/s0/layers/1/q", H5P_DEFAULT);
                     const hsize_t dims[3] = {6, 2, 1};
                     H5Handle space(H5Screate_simple(3, dims, nullptr));
                     H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE));
                     H5Pset_chunk(dcpl.get(), 3, dims);
                     H5Pset_fletcher32(dcpl.get());
                     H5Handle d(H5Dcreate2(f, "samples/s0/layers/1/q", H5T_NATIVE_FLOAT,
                                           space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT));
                     H5Dwrite(d.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, q);
                   }),
      {"dataset 'layers/1/q'", "allows gzip and shuffle only"});
}

TEST(Validation, UnwrittenTensor) {
  expect_error(
      broken_trace("unwritten.h5",
                   [](hid_t f) {
                     H5Ldelete(f, "samples/s0/layers/0/k", H5P_DEFAULT);
                     const hsize_t dims[3] = {6, 1, 1};
                     H5Handle space(H5Screate_simple(3, dims, nullptr));
                     H5Handle d(H5Dcreate2(f, "samples/s0/layers/0/k", H5T_NATIVE_FLOAT,
                                           space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
                   }),
      {"dataset 'layers/0/k'", "never fully written"});
}

TEST(Validation, MediaIdIsMinusOneExactlyOnText) {
  // The tiny trace is all text: media 0 on a text token is wrong, and so is -1 on an image token.
  expect_error(broken_trace("media_text.h5",
                            [](hid_t f) {
                              const std::int32_t m[6] = {-1, 0, -1, -1, -1, -1};
                              replace_dataset(f, "samples/s0/media_id", {6}, H5T_NATIVE_INT32, m);
                            }),
               {"dataset 'media_id'", "value 0 at position 1 for a text token"});
  expect_error(broken_trace("media_image.h5",
                            [](hid_t f) {
                              const std::uint8_t mod[6] = {0, 1, 0, 0, 0, 0};
                              const std::int32_t m[6] = {-1, -1, -1, -1, -1, -1};
                              replace_dataset(f, "samples/s0/modality", {6}, H5T_NATIVE_UINT8, mod);
                              replace_dataset(f, "samples/s0/media_id", {6}, H5T_NATIVE_INT32, m);
                            }),
               {"value -1 at position 1 for a vision token"});
}

TEST(Validation, IntegerValuesTheFormatsTypeCannotHold) {
  // HDF5 would saturate 300 to 255 when converting to uint8; the reader reports the value itself.
  expect_error(broken_trace("wide_modality.h5",
                            [](hid_t f) {
                              const std::int16_t mod[6] = {0, 0, 300, 0, 0, 0};
                              replace_dataset(f, "samples/s0/modality", {6}, H5T_NATIVE_INT16, mod);
                            }),
               {"dataset 'modality'", "value 300 at position 2 does not fit the format's uint8"});
  // A wider type holding allowed values is read.
  EXPECT_NO_THROW(read_everything(broken_trace("wide_ok.h5", [](hid_t f) {
    const std::int64_t seg[6] = {0, 1, 1, 1, 2, 2};
    replace_dataset(f, "samples/s0/segment", {6}, H5T_NATIVE_INT64, seg);
  })));
}

TEST(Validation, StringAttributeMustBeOneString) {
  expect_error(broken_trace("model_array.h5",
                            [](hid_t f) {
                              H5Adelete(f, "model");
                              const hsize_t n = 3;
                              H5Handle space(H5Screate_simple(1, &n, nullptr));
                              H5Handle type(H5Tcopy(H5T_C_S1));
                              H5Tset_size(type.get(), 4);
                              H5Handle a(H5Acreate2(f, "model", type.get(), space.get(),
                                                    H5P_DEFAULT, H5P_DEFAULT));
                              H5Awrite(a.get(), type.get(), "abcdefghijkl");
                            }),
               {"attribute 'model' must be a single string"});
}

TEST(Validation, NotAnHdf5File) {
  const std::string path = temp_path("text.h5");
  std::ofstream(path) << "this is not HDF5\n";
  expect_error(path, {"not an HDF5 file"});
}

TEST(Validation, MissingFile) {
  expect_error(temp_path("does_not_exist.h5"), {"cannot open file"});
}

TEST(Validation, TruncatedFile) {
  const std::string full = broken_trace("whole.h5", [](hid_t) {});
  for (double frac : {0.9, 0.5, 0.1}) {
    const std::string cut = temp_path("truncated_" + std::to_string(frac) + ".h5");
    std::filesystem::copy_file(full, cut, std::filesystem::copy_options::overwrite_existing);
    std::filesystem::resize_file(
        cut, static_cast<std::uintmax_t>(std::filesystem::file_size(full) * frac));
    EXPECT_THROW(read_everything(cut), TraceError) << frac;
  }
  // Cut after the superblock: the message gives both lengths, not HDF5's field names.
  const std::string cut = temp_path("truncated_lengths.h5");
  std::filesystem::copy_file(full, cut, std::filesystem::copy_options::overwrite_existing);
  const auto size = std::filesystem::file_size(full);
  std::filesystem::resize_file(cut, 1000);
  auto thousands = [](std::uintmax_t n) {
    std::string digits = std::to_string(n), out;
    for (std::size_t i = 0; i < digits.size(); ++i)
      out += (i > 0 && (digits.size() - i) % 3 == 0 ? "," : "") + std::string(1, digits[i]);
    return out;
  };
  expect_error(
      cut, {"the file is 1,000 bytes, its header says " + thousands(size) + ": a truncated copy?"});
}

}  // namespace
}  // namespace kvsim::test

namespace kvsim::test {
namespace {

TEST(Validation, QuestionMustLeaveAContext) {
  expect_error(broken_trace("question.h5",
                            [](hid_t f) { set_int_attr(f, "samples/s0", "question_len", 4); }),
               {"sample 's0'", "'question_len' = 4 leaves no context (prompt_len = 4)"});
  expect_error(broken_trace("question_neg.h5",
                            [](hid_t f) { set_int_attr(f, "samples/s0", "question_len", -1); }),
               {"sample 's0'", "'question_len' = -1 is out of range"});
}

TEST(Validation, RopeThetaMustExceedOne) {
  expect_error(broken_trace("theta.h5",
                            [](hid_t f) {
                              H5Handle o(H5Oopen(f, "/", H5P_DEFAULT));
                              h5_write_float_attr(o.get(), "rope_theta", 0.5);
                            }),
               {"'rope_theta' must be a finite number above 1"});
}

// The question: the attribute when given, else what follows the last image or video token, else
// nothing (kvtrace-v1.md, question_len).
TEST(Validation, QuestionSpanOfASample) {
  SampleInfo s;
  s.prompt_len = 6;
  s.modality = {0, 1, 1, 0, 0, 0, 0};
  EXPECT_EQ(question_length(s), 3);
  s.question_len = 1;
  EXPECT_EQ(question_length(s), 1);
  s.question_len = -1;
  s.modality = {0, 0, 0, 0, 0, 2, 0};
  EXPECT_EQ(question_length(s), 0);  // the prompt ends with the video
  s.modality.assign(7, 0);
  EXPECT_EQ(question_length(s), 0);  // text only, no attribute: all context
  // Written and read back.
  TinyTrace t{.prompt_len = 4, .weights = {1, 2, 3, 4, 5}};
  const std::string path = t.write("question_round_trip.h5");
  {
    silence_hdf5_errors();
    H5Handle f(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    set_int_attr(f.get(), "samples/s0", "question_len", 2);
  }
  EXPECT_EQ(TraceReader(path).read_sample("s0").question_len, 2);
}

}  // namespace
}  // namespace kvsim::test
