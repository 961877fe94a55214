// kvtrace v1 I/O: writer -> reader round trips in every storage layout, and a file written by
// h5py (tests/data/make_h5py_fixture.py) read back exactly.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/tiny_trace.hpp"
#include "traces/kvtrace_writer.hpp"

namespace kvsim::test {
namespace {

double pattern(int t, int h, int i, int salt) {
  return (((t * 7 + h * 3 + i + salt) % 11) - 5) / 8.0;
}

TEST(H5pyFixture, ReadsExactly) {
  TraceReader r(std::string(KVSIM_TEST_DATA) + "/h5py_small.h5");
  EXPECT_EQ(r.info().model, "h5py-fixture");
  EXPECT_EQ(r.info().num_layers, 2);
  EXPECT_EQ(r.info().num_heads, 4);
  EXPECT_EQ(r.info().num_kv_heads, 2);
  EXPECT_EQ(r.info().group_size(), 2);
  EXPECT_DOUBLE_EQ(r.info().scale, 0.25);
  ASSERT_EQ(r.sample_names(), (std::vector<std::string>{"a", "b"}));
  const SampleInfo a = r.read_sample("a");
  EXPECT_EQ(a.prompt_len, 5);
  EXPECT_EQ(a.gen_len, 3);
  EXPECT_EQ(a.task, "docvqa");
  EXPECT_EQ(a.reference, "forty-two");
  EXPECT_EQ(a.dtype, DType::kFloat16);
  EXPECT_TRUE(a.has_v);
  EXPECT_EQ(a.modality, (std::vector<std::uint8_t>{0, 1, 1, 1, 0, 0, 0, 0}));
  EXPECT_EQ(a.media_id[1], 0);
  EXPECT_EQ(a.token_ids[7], 107);
  for (int l = 0; l < 2; ++l) {
    const LayerTensors t = r.read_layer(a, l);
    for (int tok = 0; tok < 8; ++tok)
      for (int i = 0; i < 8; ++i) {
        for (int h = 0; h < 4; ++h) ASSERT_EQ(t.q(tok, h, i), pattern(tok, h, i, l));
        for (int h = 0; h < 2; ++h) {
          ASSERT_EQ(t.k(tok, h, i), pattern(tok, h, i, l + 1));
          ASSERT_EQ(t.v(tok, h, i), pattern(tok, h, i, l + 2));
        }
      }
  }
  const SampleInfo b = r.read_sample("b");
  EXPECT_EQ(b.dtype, DType::kFloat32);
  EXPECT_FALSE(b.has_v);
  EXPECT_TRUE(b.media_id.empty());
  const LayerTensors tb = r.read_layer(b, 1);
  EXPECT_FALSE(tb.has_v());
  EXPECT_EQ(tb.k(3, 1, 7), pattern(3, 1, 7, 7));
}

struct Layout {
  const char* name;
  WriteOptions opt;
};

class RoundTrip : public ::testing::TestWithParam<Layout> {};

TEST_P(RoundTrip, WriterThenReader) {
  const Layout& layout = GetParam();
  TraceInfo info{.model = "rt", .num_layers = 2, .num_heads = 4, .num_kv_heads = 2, .head_dim = 8};
  SampleInfo s{.name = "x", .prompt_len = 6, .gen_len = 2};
  s.modality = {0, 1, 1, 2, 2, 0, 0, 0};
  s.segment = {0, 1, 1, 1, 1, 1, 2, 2};
  s.media_id = {-1, 0, 0, 1, 1, -1, -1, -1};
  const std::string path = temp_path(std::string("rt_") + layout.name + ".h5");
  TraceWriter w(path, info, layout.opt);
  w.write_sample(s);
  for (int l = 0; l < 2; ++l) {
    LayerTensors t;
    t.layer = l;
    t.q = xt::zeros<float>({8, 4, 8});
    t.k = xt::zeros<float>({8, 2, 8});
    t.v = xt::zeros<float>({8, 2, 8});
    for (std::size_t i = 0; i < t.q.size(); ++i)
      t.q.data()[i] = static_cast<float>(std::sin(i + l));
    for (std::size_t i = 0; i < t.k.size(); ++i)
      t.k.data()[i] = static_cast<float>(std::cos(i * 0.5));
    for (std::size_t i = 0; i < t.v.size(); ++i) t.v.data()[i] = static_cast<float>(i % 13) - 6;
    w.write_layer(s, t);
  }
  w.close();
  TraceReader r(path);
  EXPECT_FALSE(r.info().scale_given);
  EXPECT_NEAR(r.info().scale, 1 / std::sqrt(8.0), 1e-12);
  const SampleInfo back = r.read_sample("x");
  EXPECT_EQ(back.modality, s.modality);
  EXPECT_EQ(back.segment, s.segment);
  EXPECT_EQ(back.media_id, s.media_id);
  const LayerTensors t = r.read_layer(back, 1);
  const double tol = layout.opt.dtype == DType::kFloat16 ? 1e-3 : 1e-7;
  for (std::size_t i = 0; i < t.q.size(); ++i) ASSERT_NEAR(t.q.data()[i], std::sin(i + 1), tol);
  for (std::size_t i = 0; i < t.v.size(); ++i)
    ASSERT_EQ(t.v.data()[i], static_cast<float>(i % 13) - 6);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, RoundTrip,
    ::testing::Values(Layout{"f32", {.dtype = DType::kFloat32}},
                      Layout{"f16", {.dtype = DType::kFloat16}},
                      Layout{"f16_chunked", {.dtype = DType::kFloat16, .chunked = true}},
                      Layout{"f16_gzip", {.dtype = DType::kFloat16, .gzip_level = 4}},
                      Layout{"f16_gzip_shuffle",
                             {.dtype = DType::kFloat16, .gzip_level = 4, .shuffle = true}},
                      Layout{"f32_shuffle", {.dtype = DType::kFloat32, .shuffle = true}}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace kvsim::test
