// Multimodal rotary positions (M-RoPE): Qwen2-VL's position ids worked out by hand, the trace
// format's position_ids and mrope_section, `kvsim synth --mrope`, and expected_attention undoing
// the positions the model used, against a restatement of its score.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "core/layer_attention.hpp"
#include "policies/policy.hpp"
#include "policies/scorers.hpp"
#include "tests/cli_helpers.hpp"
#include "tests/tiny_trace.hpp"
#include "traces/kvtrace_writer.hpp"
#include "traces/mrope.hpp"
#include "traces/synth.hpp"

namespace kvsim::test {
namespace {

// Two text tokens, a 2 x 2 image, one text token, a video of two 2 x 3 frames, two text tokens.
SampleInfo layout() {
  SampleInfo s;
  s.name = "s0";
  auto push = [&](int n, std::uint8_t modality, int media) {
    for (int i = 0; i < n; ++i) {
      s.modality.push_back(modality);
      s.segment.push_back(1);
      s.media_id.push_back(media);
    }
  };
  push(2, 0, -1);
  push(4, 1, 0);
  push(1, 0, -1);
  push(6, 2, 1);
  push(6, 2, 2);
  push(2, 0, -1);
  s.prompt_len = static_cast<int>(s.modality.size());
  return s;
}

TEST(Mrope, Qwen2VlPositionIdsByHand) {
  const SampleInfo s = layout();
  // Text 0, 1; the image starts at 2: (t, row, col) + 2; the largest id is 3, so text resumes at
  // 4; the video starts at 5, frame t at temporal id 5 + t, rows 5..6, columns 5..7 (6 tokens:
  // 2 x 3); the largest id is 7, so text resumes at 8.
  const std::vector<int> t = {0, 1, 2, 2, 2, 2, 4, 5, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6, 8, 9};
  const std::vector<int> h = {0, 1, 2, 2, 3, 3, 4, 5, 5, 5, 6, 6, 6, 5, 5, 5, 6, 6, 6, 8, 9};
  const std::vector<int> w = {0, 1, 2, 3, 2, 3, 4, 5, 6, 7, 5, 6, 7, 5, 6, 7, 5, 6, 7, 8, 9};
  const std::vector<std::int32_t> ids = qwen2vl_position_ids(s);
  const int T = s.total_len();
  ASSERT_EQ(ids.size(), 3u * T);
  for (int i = 0; i < T; ++i) {
    EXPECT_EQ(ids[i], t[i]) << i;
    EXPECT_EQ(ids[T + i], h[i]) << i;
    EXPECT_EQ(ids[2 * T + i], w[i]) << i;
  }
  SampleInfo with = s;
  with.position_ids = ids;
  EXPECT_EQ(next_rotary_position(with, T), 10);
  EXPECT_EQ(next_rotary_position(with, 13), 8);  // after the first frame: largest id 7
  EXPECT_EQ(next_rotary_position(s, 13), 13);    // plain RoPE
  // Qwen2-VL-7B's sections (d = 128): pairs 0-15 temporal, 16-39 height, 40-63 width.
  const std::vector<int> section = qwen2vl_mrope_section(128);
  EXPECT_EQ(section, (std::vector<int>{16, 24, 24}));
  EXPECT_EQ(mrope_axis(section, 15), 0);
  EXPECT_EQ(mrope_axis(section, 16), 1);
  EXPECT_EQ(mrope_axis(section, 39), 1);
  EXPECT_EQ(mrope_axis(section, 40), 2);
  EXPECT_EQ(rotary_position(section, with, 8, 0), 5);
  EXPECT_EQ(rotary_position(section, with, 8, 20), 5);
  EXPECT_EQ(rotary_position(section, with, 8, 50), 6);
  EXPECT_EQ(rotary_position({}, s, 8, 50), 8);
}

// The rotation of pair f at angle a (transformers' rotate_half layout).
void rotate(std::vector<float>& x, int f, double a) {
  const int half = static_cast<int>(x.size()) / 2;
  const double u = x[f], v = x[f + half];
  x[f] = static_cast<float>(u * std::cos(a) - v * std::sin(a));
  x[f + half] = static_cast<float>(v * std::cos(a) + u * std::sin(a));
}

// A trace whose every prompt query is one vector q0 rotated by the token's M-RoPE ids: undoing
// the positions the model used gives q0 at every position (no spread), so expected attention
// scores the keys by R̄q0 alone, R̄ the mean rotation over the positions after the prompt's
// largest id. Undoing the token index instead would leave a spread of queries.
TEST(Mrope, ExpectedAttentionUndoesTheModelsPositions) {
  const int d = 16, H = 2, pairs = d / 2;
  const double theta = 100.0;
  SampleInfo s = layout();
  s.gen_len = 0;
  s.dtype = DType::kFloat32;
  s.position_ids = qwen2vl_position_ids(s);
  const int P = s.prompt_len;
  TraceInfo info;
  info.model = "mrope-test";
  info.num_layers = 1;
  info.num_heads = H;
  info.num_kv_heads = 1;
  info.head_dim = d;
  info.rope_theta = theta;
  info.mrope_section = {2, 3, 3};
  LayerTensors t;
  t.q = xt::zeros<float>({std::size_t(P), std::size_t(H), std::size_t(d)});
  t.k = xt::zeros<float>({std::size_t(P), std::size_t(1), std::size_t(d)});
  auto angle = [&](int pos, int f) {
    return rotary_position(info.mrope_section, s, pos, f) * std::pow(theta, -2.0 * f / d);
  };
  std::vector<std::vector<float>> q0(H, std::vector<float>(d));
  for (int h = 0; h < H; ++h)
    for (int e = 0; e < d; ++e) q0[h][e] = static_cast<float>(std::sin(1.3 * e + h) + 0.2 * h);
  for (int i = 0; i < P; ++i) {
    for (int h = 0; h < H; ++h) {
      std::vector<float> q = q0[h];
      for (int f = 0; f < pairs; ++f) rotate(q, f, angle(i, f));
      std::copy(q.begin(), q.end(), &t.q(i, h, 0));
    }
    for (int e = 0; e < d; ++e) t.k(i, 0, e) = static_cast<float>(std::cos(0.7 * i * e + i));
  }
  const std::string path = temp_path("mrope_expected.h5");
  {
    TraceWriter w(path, info, WriteOptions{.dtype = DType::kFloat32});
    w.write_sample(s);
    w.write_layer(s, t);
    w.close();
  }
  const TraceReader reader(path);
  const SampleInfo read = reader.read_sample("s0");
  ASSERT_EQ(read.position_ids, s.position_ids);
  ASSERT_EQ(reader.info().mrope_section, info.mrope_section);
  const LayerAttention att(reader.info(), read, reader.read_layer(read, 0), AttentionNeeds{}, 1);
  const LayerView view(att, false);
  ExpectedAttentionScoring scoring{
      .future_positions = 8, .sinks = 2, .covariance = false, .value_norm = false};
  const auto plain = expected_attention_scores(view, scoring, "test");
  scoring.covariance = true;
  const auto with_cov = expected_attention_scores(view, scoring, "test");
  // Restated: per head, μ̄ = R̄ q0 with R̄ over positions 10 .. 17; z_j = scale μ̄·k_j for the
  // keys after the sinks, softmax, the mean over the two query heads.
  const int next = 10;
  const double scale = 1 / std::sqrt(static_cast<double>(d));
  std::vector<double> expected(P, 0.0);
  for (int h = 0; h < H; ++h) {
    std::vector<double> mean(d, 0.0);
    for (int p = next; p < next + 8; ++p)
      for (int f = 0; f < pairs; ++f) {
        const double a = p * std::pow(theta, -2.0 * f / d);
        mean[f] += (q0[h][f] * std::cos(a) - q0[h][f + pairs] * std::sin(a)) / 8;
        mean[f + pairs] += (q0[h][f + pairs] * std::cos(a) + q0[h][f] * std::sin(a)) / 8;
      }
    std::vector<double> z(P, 0.0);
    double top = -INFINITY, sum = 0;
    for (int j = 2; j < P; ++j) {
      for (int e = 0; e < d; ++e) z[j] += scale * mean[e] * t.k(j, 0, e);
      top = std::max(top, z[j]);
    }
    for (int j = 2; j < P; ++j) sum += std::exp(z[j] - top);
    for (int j = 2; j < P; ++j) expected[j] += std::exp(z[j] - top) / sum / H;
  }
  for (int j = 2; j < P; ++j) {
    EXPECT_NEAR(plain[0][j], expected[j], 1e-6 * expected[j]) << j;
    // No spread left after the undo: the covariance term adds (almost) nothing.
    EXPECT_NEAR(with_cov[0][j], expected[j], 1e-4 * expected[j]) << j;
  }
}

TEST(Mrope, TraceFormatValidatesSectionAndIds) {
  SynthConfig c;
  c.layers = 1;
  c.heads = 2;
  c.kv_heads = 1;
  c.head_dim = 16;
  c.media_count = 2;
  c.media_tokens = 9;
  c.separator_tokens = 0;
  c.video = true;
  c.mrope = true;
  c.gen_tokens = 3;
  const std::string path = temp_path("mrope_synth.h5");
  synth_write(c, path);
  const TraceReader r(path);
  EXPECT_EQ(r.info().mrope_section, (std::vector<int>{2, 3, 3}));
  const SampleInfo s = r.read_sample("000000");
  EXPECT_EQ(s.position_ids, qwen2vl_position_ids(s));
  // The two frames are one video: the second frame's temporal id is one past the first's.
  EXPECT_EQ(s.position_ids[35 + 9], s.position_ids[35] + 1);
  // Before the video, M-RoPE is plain RoPE: the system tokens' q and k are those of a plain
  // synth; inside the video they are not.
  const LayerTensors mrope = synth_layer(c, 0, 0);
  c.mrope = false;
  const LayerTensors plain = synth_layer(c, 0, 0);
  for (int e = 0; e < 16; ++e) EXPECT_EQ(plain.q(3, 0, e), mrope.q(3, 0, e));
  double differ = 0;
  for (int e = 0; e < 16; ++e) differ += std::abs(plain.q(40, 0, e) - mrope.q(40, 0, e));
  EXPECT_GT(differ, 1e-2);

  auto error_of = [](const std::string& file) {
    try {
      const TraceReader bad(file);
      bad.read_sample("000000");
    } catch (const TraceError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  auto edit = [&](const std::string& name, auto&& change) {
    const std::string copy = temp_path(name);
    std::filesystem::copy_file(path, copy, std::filesystem::copy_options::overwrite_existing);
    H5Handle f(H5Fopen(copy.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    change(f.get());
    return copy;
  };
  std::string bad = edit("mrope_sum.h5", [](hid_t f) {
    h5_write_int_array_attr(f, "mrope_section", {2, 3, 4});
  });
  EXPECT_NE(error_of(bad).find("'mrope_section' must be 3 positive counts of rotary pairs "
                               "(temporal, height, width) summing to head_dim / 2 = 8"),
            std::string::npos)
      << error_of(bad);
  bad = edit("mrope_missing.h5", [](hid_t f) { H5Adelete(f, "mrope_section"); });
  EXPECT_NE(error_of(bad).find("dataset 'position_ids': M-RoPE position ids need the file "
                               "attribute 'mrope_section'"),
            std::string::npos)
      << error_of(bad);
  bad = edit("mrope_negative.h5", [&](hid_t f) {
    H5Handle g(H5Gopen2(f, "samples/000000", H5P_DEFAULT));
    H5Ldelete(g.get(), "position_ids", H5P_DEFAULT);
    std::vector<std::int32_t> ids = s.position_ids;
    ids[5] = -1;
    h5_write_2d(g.get(), "position_ids", H5T_STD_I32LE, H5T_NATIVE_INT32, ids.data(), 3,
                s.total_len(), "test");
  });
  EXPECT_NE(error_of(bad).find("value -1 at [0, 5] (position ids are >= 0)"), std::string::npos)
      << error_of(bad);
  bad = edit("mrope_shape.h5", [&](hid_t f) {
    H5Handle g(H5Gopen2(f, "samples/000000", H5P_DEFAULT));
    H5Ldelete(g.get(), "position_ids", H5P_DEFAULT);
    h5_write_2d(g.get(), "position_ids", H5T_STD_I32LE, H5T_NATIVE_INT32, s.position_ids.data(), 2,
                s.total_len(), "test");
  });
  EXPECT_NE(
      error_of(bad).find("shape [2, " + std::to_string(s.total_len()) + "] does not match [3, T]"),
      std::string::npos)
      << error_of(bad);
}

}  // namespace
}  // namespace kvsim::test
