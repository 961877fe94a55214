#include "tests/tiny_trace.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "traces/synth.hpp"

namespace kvsim::test {

std::string temp_path(const std::string& name) {
  // One directory per test process: ctest runs the cases as concurrent processes, and two cases
  // writing the same file name (every LiveFixture writes "fixture") would race.
  const auto dir = std::filesystem::path(::testing::TempDir()) / "kvsim_tests" /
                   std::to_string(static_cast<long>(::getpid()));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

std::string TinyTrace::write(const std::string& name) const {
  const int T = static_cast<int>(weights.size());
  TraceInfo info;
  info.model = "tiny";
  info.num_layers = layers;
  info.num_heads = weights_kv1.empty() ? heads : 2;
  const int kv = weights_kv1.empty() ? 1 : 2;
  info.num_kv_heads = kv;
  info.head_dim = 1;
  info.scale = 1.0;
  info.scale_given = true;
  SampleInfo s;
  s.name = "s0";
  s.prompt_len = prompt_len;
  s.gen_len = T - prompt_len;
  s.modality = modality.empty() ? std::vector<std::uint8_t>(T, 0) : modality;
  s.media_id = media_id;
  for (int i = 0; i < T; ++i)
    s.segment.push_back(segment.empty() ? (i < prompt_len ? 1 : 2) : segment[i]);
  const std::string path = temp_path(name);
  WriteOptions opt;
  opt.dtype = dtype;
  TraceWriter w(path, info, opt);
  w.write_sample(s);
  for (int l = 0; l < layers; ++l) {
    LayerTensors t;
    t.layer = l;
    const int H = info.num_heads;
    t.q = xt::zeros<float>({std::size_t(T), std::size_t(H), std::size_t(1)});
    t.k = xt::zeros<float>({std::size_t(T), std::size_t(kv), std::size_t(1)});
    for (int i = 0; i < T; ++i) {
      const double c = (query_power.empty() ? 1.0 : query_power[i]) *
                       (l < static_cast<int>(layer_power.size()) ? layer_power[l] : 1.0);
      for (int h = 0; h < H; ++h)
        t.q(i, h, 0) =
            static_cast<float>(c * (h < static_cast<int>(head_power.size()) ? head_power[h] : 1.0));
      t.k(i, 0, 0) = static_cast<float>(std::log(weights[i]));
      if (kv == 2) t.k(i, 1, 0) = static_cast<float>(std::log(weights_kv1[i]));
    }
    if (!values.empty()) {
      t.v = xt::zeros<float>({std::size_t(T), std::size_t(kv), std::size_t(1)});
      for (int i = 0; i < T; ++i)
        for (int g = 0; g < kv; ++g) t.v(i, g, 0) = static_cast<float>(values[i]);
    }
    w.write_layer(s, t);
  }
  w.close();
  return path;
}

std::string small_synthetic_trace(const std::string& name, int layers, bool with_v, int heads,
                                  int kv_heads) {
  SynthConfig c;
  c.layers = layers;
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.head_dim = 16;
  c.system_tokens = 6;
  c.media_tokens = 40;
  c.user_tokens = 6;
  c.gen_tokens = 12;
  c.with_v = with_v;
  c.write.dtype = DType::kFloat32;
  const std::string path = temp_path(name);
  synth_write(c, path);
  return path;
}

}  // namespace kvsim::test
