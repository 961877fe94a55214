// The live path: checkpoint loading, the CPU decoder against a naive one written here, policies
// in the loop, capture -> replay, and the end-to-end metrics.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "analysis/csv_table.hpp"
#include "sim/live/evaluate.hpp"
#include "sim/replay/engine.hpp"
#include "sim/run/compact_trace.hpp"
#include "tests/cli_helpers.hpp"
#include "tests/tiny_trace.hpp"

namespace kvsim::test {
namespace {

using live::Checkpoint;
using live::ModelConfig;
using live::WeightDType;

ModelConfig tiny_config(const std::string& type, int heads, int kv_heads, bool tie = false) {
  ModelConfig c;
  c.model_type = type;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = 32 / heads;
  c.vocab_size = 64;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = tie;
  c.qkv_bias = type == "qwen2";
  c.max_position_embeddings = 4096;
  return c;
}

std::string make_model(const std::string& name, const ModelConfig& c, WeightDType t, int shards = 1,
                       std::uint64_t seed = 7) {
  const std::string dir = temp_path(name);
  std::filesystem::remove_all(dir);
  live::write_random_checkpoint(dir, c, t, shards, seed, 0.2);
  return dir;
}

// --- a naive decoder, independent of sim/live: double precision, the whole sequence recomputed
// for every query, straight from the checkpoint's tensors ---
struct Naive {
  const Checkpoint& ck;
  const ModelConfig& c;
  explicit Naive(const Checkpoint& k) : ck(k), c(k.config) {}
  const std::vector<float>& w(const std::string& n) const { return ck.tensors.at(n).data; }
  bool has(const std::string& n) const { return ck.tensors.count(n) > 0; }

  std::vector<double> matvec(const std::string& name, const std::vector<double>& x, int rows,
                             const std::string& bias = "") const {
    const auto& m = w(name);
    std::vector<double> y(rows, 0.0);
    for (int r = 0; r < rows; ++r) {
      for (std::size_t i = 0; i < x.size(); ++i) y[r] += m[r * x.size() + i] * x[i];
      if (!bias.empty() && has(bias)) y[r] += w(bias)[r];
    }
    return y;
  }
  std::vector<double> norm(const std::vector<double>& x, const std::string& name) const {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double inv = 1.0 / std::sqrt(ss / x.size() + c.rms_norm_eps);
    std::vector<double> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * w(name)[i];
    return y;
  }
  // The angle of every dimension of a head, as transformers builds cos/sin: per axis
  // emb = cat(freqs, freqs) with freqs = position * inv_freq; under M-RoPE
  // (apply_multimodal_rotary_pos_emb) emb is cut into chunks of mrope_section * 2 =
  // [s0, s1, s2, s0, s1, s2] and chunk j is taken from axis j % 3.
  std::vector<double> angles(const std::array<int, 3>& pos) const {
    const int d = c.head_dim, half = d / 2;
    std::vector<std::vector<double>> emb(3, std::vector<double>(d));
    for (int a = 0; a < 3; ++a)
      for (int i = 0; i < d; ++i)
        emb[a][i] = pos[a] * std::pow(c.rope_theta, -2.0 * (i % half) / d);
    if (c.mrope_section.empty()) return emb[0];
    std::vector<double> out;
    for (int j = 0; j < 6; ++j) {
      const int start = static_cast<int>(out.size());
      out.insert(out.end(), emb[j % 3].begin() + start,
                 emb[j % 3].begin() + start + c.mrope_section[j % 3]);
    }
    return out;
  }
  void rope(std::vector<double>& x, int heads, const std::array<int, 3>& pos) const {
    const int d = c.head_dim, half = d / 2;
    const std::vector<double> a = angles(pos);
    for (int h = 0; h < heads; ++h) {
      std::vector<double> v(x.begin() + h * d, x.begin() + (h + 1) * d), rotated(d);
      for (int i = 0; i < half; ++i) rotated[i] = -v[i + half], rotated[i + half] = v[i];
      for (int i = 0; i < d; ++i)
        x[h * d + i] = v[i] * std::cos(a[i]) + rotated[i] * std::sin(a[i]);
    }
  }
  // Logits after the last of `ids`; rows of `embeds` replace the embeddings at `at`; token t
  // sits at pos3[t] (three ids) or, without pos3, at t.
  std::vector<double> logits(const std::vector<std::int32_t>& ids, const std::vector<int>& at = {},
                             const std::vector<float>& embeds = {},
                             const std::vector<std::array<int, 3>>& pos3 = {}) const {
    const int T = ids.size(), D = c.hidden_size, H = c.num_attention_heads,
              Hkv = c.num_key_value_heads, d = c.head_dim, I = c.intermediate_size;
    std::vector<std::vector<double>> x(T, std::vector<double>(D));
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < D; ++i) x[t][i] = w("model.embed_tokens.weight")[ids[t] * D + i];
    for (std::size_t r = 0; r < at.size(); ++r)
      for (int i = 0; i < D; ++i) x[at[r]][i] = embeds[r * D + i];
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      std::vector<std::vector<double>> q(T), k(T), v(T);
      for (int t = 0; t < T; ++t) {
        const auto h = norm(x[t], p + "input_layernorm.weight");
        q[t] = matvec(p + "self_attn.q_proj.weight", h, H * d, p + "self_attn.q_proj.bias");
        k[t] = matvec(p + "self_attn.k_proj.weight", h, Hkv * d, p + "self_attn.k_proj.bias");
        v[t] = matvec(p + "self_attn.v_proj.weight", h, Hkv * d, p + "self_attn.v_proj.bias");
        const std::array<int, 3> pos = pos3.empty() ? std::array<int, 3>{t, t, t} : pos3[t];
        rope(q[t], H, pos);
        rope(k[t], Hkv, pos);
      }
      std::vector<std::vector<double>> next = x;
      for (int t = 0; t < T; ++t) {
        std::vector<double> att(H * d, 0.0);
        for (int h = 0; h < H; ++h) {
          const int g = h / (H / Hkv);
          std::vector<double> s(t + 1);
          double mx = -1e300, sum = 0;
          for (int j = 0; j <= t; ++j) {
            s[j] = 0;
            for (int e = 0; e < d; ++e) s[j] += q[t][h * d + e] * k[j][g * d + e];
            s[j] /= std::sqrt(static_cast<double>(d));
            mx = std::max(mx, s[j]);
          }
          for (int j = 0; j <= t; ++j) sum += s[j] = std::exp(s[j] - mx);
          for (int j = 0; j <= t; ++j)
            for (int e = 0; e < d; ++e) att[h * d + e] += s[j] / sum * v[j][g * d + e];
        }
        const auto o = matvec(p + "self_attn.o_proj.weight", att, D, p + "self_attn.o_proj.bias");
        for (int i = 0; i < D; ++i) next[t][i] += o[i];
        const auto h2 = norm(next[t], p + "post_attention_layernorm.weight");
        const auto gate = matvec(p + "mlp.gate_proj.weight", h2, I);
        const auto up = matvec(p + "mlp.up_proj.weight", h2, I);
        std::vector<double> act(I);
        for (int i = 0; i < I; ++i) act[i] = gate[i] / (1 + std::exp(-gate[i])) * up[i];
        const auto m = matvec(p + "mlp.down_proj.weight", act, D);
        for (int i = 0; i < D; ++i) next[t][i] += m[i];
      }
      x = std::move(next);
    }
    const auto h = norm(x[T - 1], "model.norm.weight");
    return matvec(c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight", h,
                  c.vocab_size);
  }
};

double rel_error(const std::vector<float>& a, const std::vector<double>& b) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return diff / scale;
}

PromptSample tiny_prompt(int P, int image_from, int image_len, int vocab, int embed_dim = 0,
                         std::uint64_t seed = 3) {
  PromptSample s;
  s.info.name = "s" + std::to_string(seed);
  s.info.prompt_len = P;
  std::mt19937_64 rng(seed);
  for (int i = 0; i < P; ++i) {
    const bool image = i >= image_from && i < image_from + image_len;
    s.info.token_ids.push_back(static_cast<std::int32_t>(rng() % vocab));
    s.info.modality.push_back(image ? 1 : 0);
    s.info.segment.push_back(i < 2 ? 0 : 1);
  }
  if (embed_dim > 0) {
    std::normal_distribution<float> n(0.0f, 0.5f);
    s.embed_dim = embed_dim;
    for (int i = 0; i < image_len * embed_dim; ++i) s.inputs_embeds.push_back(n(rng));
  }
  return s;
}

TEST(Checkpoint, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(live::float_to_bfloat16(1.0f), 0x3f80);
  EXPECT_EQ(live::float_to_bfloat16(1.00390625f), 0x3f80);  // 1 + 2^-8: tie, to even
  EXPECT_EQ(live::float_to_bfloat16(1.01171875f), 0x3f82);  // 1 + 3*2^-8: tie, to even
  EXPECT_EQ(live::float_to_bfloat16(1.005f), 0x3f81);       // above the tie
  EXPECT_FLOAT_EQ(live::bfloat16_to_float(0xc040), -3.0f);
}

TEST(Checkpoint, SafetensorsRoundTripEveryDType) {
  live::HostTensor t{{2, 3}, {0.5f, -1.25f, 3.0f, 0.1f, -0.2f, 1e-3f}};
  for (auto dt : {WeightDType::kFloat32, WeightDType::kFloat16, WeightDType::kBFloat16}) {
    const std::string path = temp_path(std::string("rt_") + live::safetensors_dtype_name(dt));
    live::write_safetensors(path, {{"a.weight", &t}}, dt);
    std::map<std::string, live::HostTensor> got;
    WeightDType read_type;
    live::read_safetensors(path, got, &read_type);
    EXPECT_EQ(read_type, dt);
    ASSERT_EQ(got.at("a.weight").shape, t.shape);
    const double tol = dt == WeightDType::kFloat32 ? 0 : dt == WeightDType::kFloat16 ? 1e-3 : 8e-3;
    for (int i = 0; i < 6; ++i)
      EXPECT_NEAR(got.at("a.weight").data[i], t.data[i], tol * std::abs(t.data[i])) << i;
  }
}

TEST(Checkpoint, ShardedEqualsSingleFile) {
  const auto c = tiny_config("llama", 4, 2);
  const Checkpoint one = live::load_checkpoint(make_model("one", c, WeightDType::kBFloat16));
  const std::string sharded = make_model("three", c, WeightDType::kBFloat16, 3);
  EXPECT_TRUE(std::filesystem::exists(sharded + "/model.safetensors.index.json"));
  EXPECT_TRUE(std::filesystem::exists(sharded + "/model-00003-of-00003.safetensors"));
  const Checkpoint three = live::load_checkpoint(sharded);
  EXPECT_EQ(one.dtype, WeightDType::kBFloat16);
  ASSERT_EQ(one.tensors.size(), three.tensors.size());
  for (const auto& [name, t] : one.tensors) EXPECT_EQ(t.data, three.tensors.at(name).data) << name;
}

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning " << needle;
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, ErrorsNameTheProblem) {
  const auto c = tiny_config("qwen2", 4, 2);
  const std::string dir = make_model("broken", c, WeightDType::kFloat32);
  auto edit_config = [&](const std::function<void(nlohmann::json&)>& f) {
    nlohmann::json j = nlohmann::json::parse(std::ifstream(dir + "/config.json"));
    f(j);
    std::ofstream(dir + "/config.json") << j.dump();
  };
  edit_config([](nlohmann::json& j) { j["model_type"] = "gpt2"; });
  expect_error([&] { live::load_checkpoint(dir); }, "model_type 'gpt2' is not supported");
  edit_config([](nlohmann::json& j) {
    j["model_type"] = "qwen2";
    j["rope_scaling"] = {{"type", "yarn"}};
  });
  expect_error([&] { live::load_checkpoint(dir); }, "rope_scaling");
  edit_config([](nlohmann::json& j) {
    j["rope_scaling"] = nullptr;
    j["num_hidden_layers"] = 3;  // layer 2 is missing from the weights
  });
  expect_error([&] { live::load_checkpoint(dir); },
               "missing tensor 'model.layers.2.input_layernorm.weight'");
  edit_config([](nlohmann::json& j) {
    j["num_hidden_layers"] = 2;
    j["hidden_size"] = 16;
  });
  expect_error([&] { live::load_checkpoint(dir); }, "config.json implies");
  edit_config([](nlohmann::json& j) { j["hidden_size"] = 32; });
  EXPECT_NO_THROW(live::load_checkpoint(dir));
  std::filesystem::resize_file(dir + "/model.safetensors",
                               std::filesystem::file_size(dir + "/model.safetensors") - 100);
  expect_error([&] { live::load_checkpoint(dir); }, "truncated");
  expect_error([&] { live::load_checkpoint(temp_path("nowhere")); }, "config.json");
}

struct ModelCase {
  const char* type;
  int heads, kv_heads;
  bool tie;
  WeightDType dtype;
  int shards;
};

class LiveModelVsNaive : public ::testing::TestWithParam<ModelCase> {};

TEST_P(LiveModelVsNaive, PrefillAndDecodeLogits) {
  const ModelCase mc = GetParam();
  const auto c = tiny_config(mc.type, mc.heads, mc.kv_heads, mc.tie);
  const Checkpoint ck =
      live::load_checkpoint(make_model(std::string("naive_") + mc.type, c, mc.dtype, mc.shards));
  auto backend = live::make_cpu_backend();
  live::Model model(ck, *backend);
  live::LiveEngine engine(model, 1);
  const PromptSample prompt = tiny_prompt(12, 3, 5, c.vocab_size, c.hidden_size);
  live::PreparedPrompt pp = engine.prepare(prompt, 4, {});
  const Naive naive(ck);
  std::vector<std::int32_t> ids = prompt.info.token_ids;
  const auto at = prompt.embed_positions();
  EXPECT_LT(rel_error(pp.first_logits, naive.logits(ids, at, prompt.inputs_embeds)), 1e-5);
  live::RunOptions o;
  o.steps = 4;
  o.keep_logits = true;
  const live::RunResult r = engine.run(pp, o);
  for (int t = 0; t < 4; ++t) {
    ids.push_back(r.steps[t].input);
    EXPECT_LT(rel_error(r.logits[t], naive.logits(ids, at, prompt.inputs_embeds)), 1e-5) << t;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Architectures, LiveModelVsNaive,
    ::testing::Values(ModelCase{"llama", 4, 4, false, WeightDType::kFloat32, 1},
                      ModelCase{"qwen2", 4, 2, true, WeightDType::kBFloat16, 2},
                      ModelCase{"mistral", 8, 2, false, WeightDType::kFloat16, 1}),
    [](const auto& info) { return std::string(info.param.type); });

// --- vision-language checkpoints: the language model read in place ---

// A vision-language checkpoint: the tensors of the decoder checkpoint `plain` renamed under
// `prefix` (and lm_head.weight as `head`), a vision tower tensor beside them, and `config`.
std::string vlm_checkpoint(const std::string& name, const std::string& plain,
                           const nlohmann::json& config, const std::string& prefix,
                           const std::string& head) {
  std::map<std::string, live::HostTensor> tensors, renamed;
  live::read_safetensors(plain + "/model.safetensors", tensors);
  for (auto& [n, t] : tensors) renamed[n == "lm_head.weight" ? head : prefix + n.substr(6)] = t;
  renamed["vision_tower.patch_embed.weight"] = {{2, 3}, {1, 2, 3, 4, 5, 6}};
  const std::string dir = temp_path(name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << config.dump(2);
  std::vector<std::pair<std::string, const live::HostTensor*>> list;
  for (const auto& [n, t] : renamed) list.push_back({n, &t});
  live::write_safetensors(dir + "/model.safetensors", list, WeightDType::kFloat32);
  return dir;
}

nlohmann::json decoder_json(const ModelConfig& c) {
  return nlohmann::json::parse(live::model_config_json(c, WeightDType::kFloat32));
}

TEST(VlmCheckpoint, LlavaLayoutsLoadTheLanguageModel) {
  const ModelConfig c = tiny_config("llama", 4, 2);
  const std::string plain = make_model("llava_plain", c, WeightDType::kFloat32);
  const nlohmann::json config = {{"model_type", "llava"},
                                 {"text_config", decoder_json(c)},
                                 {"vision_config", {{"model_type", "clip_vision_model"}}},
                                 {"image_token_index", 32000}};
  auto backend = live::make_cpu_backend();
  const Checkpoint ref_ck = live::load_checkpoint(plain);
  live::Model ref_model(ref_ck, *backend);
  const PromptSample prompt = tiny_prompt(10, 2, 4, c.vocab_size, c.hidden_size);
  const auto at = prompt.embed_positions();
  const auto ref = ref_model.prefill(prompt.info.token_ids, at, prompt.inputs_embeds).logits;
  // transformers before 4.52, and since (and 5)
  for (const auto& [prefix, head] : {std::pair<std::string, std::string>{
                                         "language_model.model.", "language_model.lm_head.weight"},
                                     {"model.language_model.", "lm_head.weight"}}) {
    const Checkpoint ck = live::load_checkpoint(
        vlm_checkpoint("llava_" + std::to_string(prefix.size()), plain, config, prefix, head));
    EXPECT_EQ(ck.config.vlm_type, "llava");
    EXPECT_EQ(ck.tensors.count("vision_tower.patch_embed.weight"), 0u);
    live::Model model(ck, *backend);
    EXPECT_EQ(model.prefill(prompt.info.token_ids, at, prompt.inputs_embeds).logits, ref) << prefix;
  }
}

TEST(VlmCheckpoint, ConfigReadings) {
  // llava-1.5-7b-hf's text_config names only these keys; the rest are LlamaConfig's defaults.
  const ModelConfig c = live::parse_model_config(
      R"({"model_type": "llava", "text_config": {"model_type": "llama", "vocab_size": 32064,
          "rms_norm_eps": 1e-05, "max_position_embeddings": 4096}})",
      "config.json");
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 11008);
  EXPECT_EQ(c.num_hidden_layers, 32);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 32);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.vocab_size, 32064);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_FALSE(c.mrope());
  // Qwen2-VL as transformers 4 writes it: the keys at the top, rope_scaling type mrope.
  const ModelConfig q = live::parse_model_config(
      R"({"model_type": "qwen2_vl", "hidden_size": 64, "intermediate_size": 96,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "vocab_size": 100, "rope_theta": 1000000.0,
          "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}})",
      "config.json");
  EXPECT_EQ(q.model_type, "qwen2");
  EXPECT_TRUE(q.qkv_bias);
  EXPECT_EQ(q.mrope_section, (std::vector<int>{2, 3, 3}));
  EXPECT_EQ(q.rope_theta, 1e6);
  expect_error([] { live::parse_model_config(R"({"model_type": "llava"})", "c.json"); },
               "without a text_config");
  expect_error(
      [] {
        live::parse_model_config(
            R"({"model_type": "qwen2_vl", "hidden_size": 64, "intermediate_size": 96,
                "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100,
                "rope_scaling": {"type": "mrope", "mrope_section": [2, 2, 2]}})",
            "c.json");
      },
      "mrope_section [2,2,2] sums to 6, not head_dim / 2 = 8");
  expect_error(
      [] {
        live::parse_model_config(
            R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
                "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100,
                "rope_scaling": {"type": "linear", "factor": 2.0}})",
            "c.json");
      },
      "only plain RoPE");
}

// Token positions as Qwen2-VL's get_rope_index gives them for text, a 2 x 3 image grid, text:
// text ids count on from the previous largest id + 1 on all three axes; an image's tokens share
// the temporal id and take row and column offsets as height and width ids.
std::vector<std::array<int, 3>> qwen2_vl_positions(int before, int rows, int cols, int after) {
  std::vector<std::array<int, 3>> pos;
  for (int i = 0; i < before; ++i) pos.push_back({i, i, i});
  for (int r = 0; r < rows; ++r)
    for (int k = 0; k < cols; ++k) pos.push_back({before, before + r, before + k});
  const int next = before + std::max(rows, cols);
  for (int i = 0; i < after; ++i) pos.push_back({next + i, next + i, next + i});
  return pos;
}

TEST(VlmCheckpoint, Qwen2VlMropeMatchesANaiveRestatement) {
  ModelConfig c = tiny_config("qwen2", 4, 2);  // head_dim 8: 4 frequencies
  const std::string plain = make_model("qwen2vl_plain", c, WeightDType::kFloat32);
  nlohmann::json text = decoder_json(c);
  text["model_type"] = "qwen2_vl_text";
  text.erase("rope_scaling");
  text["rope_parameters"] = {
      {"rope_type", "default"}, {"rope_theta", 10000.0}, {"mrope_section", {2, 1, 1}}};
  // transformers 5's layout: text_config and model.language_model.*
  const Checkpoint ck = live::load_checkpoint(
      vlm_checkpoint("qwen2vl", plain, {{"model_type", "qwen2_vl"}, {"text_config", text}},
                     "model.language_model.", "lm_head.weight"));
  ASSERT_EQ(ck.config.mrope_section, (std::vector<int>{2, 1, 1}));
  auto backend = live::make_cpu_backend();
  live::Model model(ck, *backend);
  live::LiveEngine engine(model, 1);
  PromptSample prompt = tiny_prompt(12, 3, 6, c.vocab_size, c.hidden_size);
  const auto pos3 = qwen2_vl_positions(3, 2, 3, 3);
  for (const auto& p : pos3)
    prompt.position_ids.insert(prompt.position_ids.end(), p.begin(), p.end());
  live::PreparedPrompt pp = engine.prepare(prompt, 3, {});
  const Naive naive(ck);
  std::vector<std::int32_t> ids = prompt.info.token_ids;
  const auto at = prompt.embed_positions();
  EXPECT_LT(rel_error(pp.first_logits, naive.logits(ids, at, prompt.inputs_embeds, pos3)), 1e-5);
  // transformers 4's layout (the keys at the top, rope_scaling type mrope, model.* beside the
  // vision tower) is the same model.
  nlohmann::json v4 = text;
  v4["model_type"] = "qwen2_vl";
  v4.erase("rope_parameters");
  v4["rope_scaling"] = {{"type", "mrope"}, {"mrope_section", {2, 1, 1}}};
  const Checkpoint ck4 =
      live::load_checkpoint(vlm_checkpoint("qwen2vl_v4", plain, v4, "model.", "lm_head.weight"));
  live::Model model4(ck4, *backend);
  EXPECT_EQ(model4
                .prefill(prompt.info.token_ids, prompt.embed_positions(), prompt.inputs_embeds,
                         prompt.position_ids)
                .logits,
            pp.first_logits);
  // Plain RoPE at 0..P-1 gives other logits: the test can tell M-RoPE from RoPE.
  EXPECT_GT(rel_error(pp.first_logits, naive.logits(ids, at, prompt.inputs_embeds)), 1e-4);
  live::RunOptions o;
  o.steps = 3;
  o.keep_logits = true;
  const live::RunResult r = engine.run(pp, o);
  std::vector<std::array<int, 3>> pos = pos3;
  for (int t = 0; t < 3; ++t) {
    ids.push_back(r.steps[t].input);
    const int next = 9 + t;  // the prompt's largest id (8) + 1 + t, on all three axes
    pos.push_back({next, next, next});
    EXPECT_LT(rel_error(r.logits[t], naive.logits(ids, at, prompt.inputs_embeds, pos)), 1e-5) << t;
  }
  // A capture records the ids the model rotated by: the prompt's, then 9 + t on every axis.
  const std::string prompts = temp_path("mrope_capture_prompts.h5"),
                    trace = temp_path("mrope_capture.h5");
  write_prompt_file(prompts, {prompt});
  PromptReader reader(prompts);
  live::CaptureOptions co;
  co.gen_len = 3;
  live::capture(engine, reader, reader.sample_names(), trace, co);
  const TraceReader captured(trace);
  EXPECT_EQ(captured.info().mrope_section, (std::vector<int>{2, 1, 1}));
  const SampleInfo cs = captured.read_sample(prompt.info.name);
  ASSERT_EQ(cs.position_ids.size(), 3u * 15);
  for (int a = 0; a < 3; ++a)
    for (int i = 0; i < 15; ++i) EXPECT_EQ(cs.position_ids[a * 15 + i], pos[i][a]) << a << " " << i;
  // Errors name the sample and what is wrong.
  PromptSample none = prompt;
  none.position_ids.clear();
  expect_error([&] { engine.prepare(none, 1, {}); },
               "sample 's3': the model uses M-RoPE (rope_scaling.mrope_section) and the prompt has "
               "no position_ids");
  PromptSample short_ids = prompt;
  short_ids.position_ids.resize(3 * 11);
  expect_error([&] { engine.prepare(short_ids, 1, {}); },
               "sample 's3': position_ids hold 33 ids, expected [12, 3]");
  PromptSample wide = prompt;
  wide.embed_dim = 16;
  wide.inputs_embeds.resize(6 * 16);
  expect_error([&] { engine.prepare(wide, 1, {}); },
               "sample 's3': inputs_embeds rows have 16 columns, the model's hidden_size is 32");
}

TEST(VlmCheckpoint, Float64EmbeddingsAreReadAsFloat32) {
  // numpy's default dtype written straight by h5py: converted, not refused.
  const PromptSample s = tiny_prompt(12, 3, 3, 64, 16);
  const std::string path = temp_path("embeds64.h5");
  write_prompt_file(path, {s});
  {
    H5Handle f(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    const std::string name = "samples/" + s.info.name + "/inputs_embeds";
    ASSERT_GE(H5Ldelete(f.get(), name.c_str(), H5P_DEFAULT), 0);
    const std::vector<double> wide(s.inputs_embeds.begin(), s.inputs_embeds.end());
    const hsize_t dims[2] = {3, 16};
    H5Handle space(H5Screate_simple(2, dims, nullptr));
    H5Handle d(H5Dcreate2(f.get(), name.c_str(), H5T_IEEE_F64LE, space.get(), H5P_DEFAULT,
                          H5P_DEFAULT, H5P_DEFAULT));
    ASSERT_GE(H5Dwrite(d.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, wide.data()), 0);
  }
  const PromptSample back = PromptReader(path).read(s.info.name);
  EXPECT_EQ(back.embed_dim, 16);
  EXPECT_EQ(back.inputs_embeds, s.inputs_embeds);  // float -> double -> float is exact
}

TEST(VlmCheckpoint, PositionIdsInPromptFiles) {
  PromptSample s = tiny_prompt(12, 3, 6, 64);
  for (const auto& p : qwen2_vl_positions(3, 2, 3, 3))
    s.position_ids.insert(s.position_ids.end(), p.begin(), p.end());
  const std::string path = temp_path("mrope_prompts.h5");
  write_prompt_file(path, {s});
  EXPECT_EQ(PromptReader(path).read(s.info.name).position_ids, s.position_ids);
  s.position_ids.resize(3 * 11);  // written as [11, 3]
  write_prompt_file(path, {s});
  expect_error([&] { PromptReader(path).read(s.info.name); },
               "sample 's3', dataset 'position_ids': shape [11, 3], expected [12, 3]");
  // A plain-RoPE model refuses M-RoPE ids.
  const ModelConfig c = tiny_config("llama", 4, 2);
  const Checkpoint ck = live::load_checkpoint(make_model("plain_rope", c, WeightDType::kFloat32));
  auto backend = live::make_cpu_backend();
  live::Model model(ck, *backend);
  live::LiveEngine engine(model, 1);
  s.position_ids.resize(3 * 12);
  expect_error([&] { engine.prepare(s, 1, {}); },
               "sample 's3': the prompt has M-RoPE position_ids, but the model uses plain RoPE");
}

struct LiveFixture : ::testing::Test {
  ModelConfig c = tiny_config("llama", 4, 2);
  Checkpoint ck = live::load_checkpoint(make_model("fixture", c, WeightDType::kFloat32));
  std::unique_ptr<live::Backend> backend = live::make_cpu_backend();
  live::Model model{ck, *backend};
  live::LiveEngine engine{model, 2};

  // A full-cache capture of `prompt` (gen_len greedy steps) written as the trace `name`.
  std::string captured(const PromptSample& prompt, const std::string& name, int gen_len) {
    const std::string prompts = temp_path(name + "_prompts.h5"), trace = temp_path(name + ".h5");
    write_prompt_file(prompts, {prompt});
    PromptReader reader(prompts);
    live::CaptureOptions co;
    co.gen_len = gen_len;
    live::capture(engine, reader, reader.sample_names(), trace, co);
    return trace;
  }
};

// The evictions (step, position) of a live run's layer-0 cache equal replay's.
void expect_same_evictions(const KvCache& live_cache,
                           const std::vector<std::vector<EvictionRecord>>& replayed,
                           const std::string& what) {
  for (int g = 0; g < live_cache.kv_heads(); ++g) {
    const auto& lv = live_cache.evictions(g);
    ASSERT_EQ(lv.size(), replayed[g].size()) << what;
    ASSERT_FALSE(lv.empty()) << what;
    for (std::size_t i = 0; i < lv.size(); ++i) {
      EXPECT_EQ(lv[i].step, replayed[g][i].step) << what;
      EXPECT_EQ(lv[i].position, replayed[g][i].position) << what;
    }
  }
}

TEST_F(LiveFixture, ImageTokenIdsComeFromInputsEmbedsNotTheVocabulary) {
  PromptSample prompt = tiny_prompt(20, 4, 6, c.vocab_size, c.hidden_size);
  live::PreparedPrompt a = engine.prepare(prompt, 1, {});
  for (int p = 4; p < 10; ++p) prompt.info.token_ids[p] = c.vocab_size + 100;  // LLaVA's id
  live::PreparedPrompt b = engine.prepare(prompt, 1, {});
  EXPECT_EQ(a.first_logits, b.first_logits);
  prompt.inputs_embeds.clear();  // now position 4 is an ordinary token: out of range
  prompt.embed_dim = 0;
  expect_error([&] { engine.prepare(prompt, 1, {}); }, "token id 164 at position 4");
}

TEST(LiveEngineLimits, PositionsBeyondMaxPositionEmbeddingsAreRefusedUnlessAllowed) {
  ModelConfig c = tiny_config("llama", 4, 2);
  c.max_position_embeddings = 24;
  const Checkpoint ck =
      live::load_checkpoint(make_model("max_positions", c, WeightDType::kFloat32));
  auto backend = live::make_cpu_backend();
  live::Model model(ck, *backend);
  live::LiveEngine engine(model, 1);
  const PromptSample prompt = tiny_prompt(20, 4, 6, c.vocab_size, c.hidden_size);
  engine.prepare(prompt, 4, {});  // 20 + 4 = 24 positions: within
  expect_error([&] { engine.prepare(prompt, 5, {}); },
               "20 prompt tokens + 5 decode steps = 25 positions exceed the model's "
               "max_position_embeddings of 24 (--allow-beyond-max-positions runs it anyway)");
  engine.allow_beyond_max_positions(true);
  engine.prepare(prompt, 5, {});
}

TEST_F(LiveFixture, FullPolicyReproducesTheModelAloneExactly) {
  const PromptSample prompt = tiny_prompt(40, 4, 20, c.vocab_size);
  const PolicyConfig full = make_policy_config("full", {});
  live::PreparedPrompt pp = engine.prepare(prompt, 10, {});
  live::RunOptions o;
  o.steps = 10;
  o.keep_logits = true;
  const live::RunResult alone = engine.run(pp, o);
  o.policy = &full;
  const live::RunResult looped = engine.run(pp, o);
  EXPECT_EQ(alone.predicted, looped.predicted);
  EXPECT_EQ(alone.logits, looped.logits);                // bitwise
  EXPECT_EQ(looped.peak_kv_entries, 2 * 2 * (40 + 10));  // layers x KV heads x every token
}

TEST_F(LiveFixture, EvictedRowsAreFreed) {
  const PromptSample prompt = tiny_prompt(40, 4, 20, c.vocab_size);
  const PolicyConfig sl = make_policy_config("streamingllm", {{"budget", "12"}, {"sinks", "2"}});
  live::PreparedPrompt pp = engine.prepare(prompt, 8, {});
  live::RunOptions o;
  o.steps = 8;
  o.policy = &sl;
  const live::RunResult r = engine.run(pp, o);
  // Each step attends over 12 kept entries plus its own token, in 2 layers x 2 KV heads.
  EXPECT_EQ(r.peak_kv_entries, 2 * 2 * 13);
  EXPECT_EQ(r.prompt_kv_entries, 2 * 2 * 40);
  for (int l = 0; l < 2; ++l)
    for (int g = 0; g < 2; ++g) {
      EXPECT_EQ(backend->cache_rows(l, g), 12);
      // sinks 0, 1 and the 10 most recent of positions 0..47
      std::vector<std::int32_t> want = {0, 1};
      for (int p = 38; p < 48; ++p) want.push_back(p);
      EXPECT_EQ(r.caches[l].positions(g), want);
    }
}

// The backend's rows must be exactly the policy's cache: the recorded key and value of every
// kept position, the merged ones where the policy merged.
void expect_backend_matches(const live::Backend& b, const live::PreparedPrompt& pp,
                            const live::RunResult& r, const std::string& name) {
  const int d = 8;
  std::vector<float> k(d), v(d);
  int merged = 0;
  for (int l = 0; l < 2; ++l)
    for (int g = 0; g < 2; ++g) {
      const KvCache& cache = r.caches[l];
      ASSERT_EQ(b.cache_rows(l, g), cache.size(g)) << name;
      const LayerTensors& t = pp.layers[l]->tensors();
      for (int e = 0; e < cache.size(g); ++e) {
        b.cache_read(l, g, e, k.data(), v.data());
        const float* want_k = cache.merged_key(g, e);
        const float* want_v = cache.merged_value(g, e);
        merged += want_k != nullptr;
        if (!want_k)
          want_k = &t.k(cache.position(g, e), g, 0), want_v = &t.v(cache.position(g, e), g, 0);
        for (int i = 0; i < d; ++i) {
          ASSERT_EQ(k[i], want_k[i]) << name << " layer " << l << " head " << g << " entry " << e;
          ASSERT_EQ(v[i], want_v[i]) << name << " layer " << l << " head " << g << " entry " << e;
        }
      }
    }
  if (name == "lookm" || name == "meda") {
    EXPECT_GT(merged, 0) << name;
  }
}

TEST_F(LiveFixture, EveryLivePolicyRunsWithTheBackendInStep) {
  const PromptSample prompt = tiny_prompt(64, 4, 32, c.vocab_size);
  int tested = 0;
  for (const auto& name : PolicyRegistry::instance().names()) {
    std::map<std::string, std::string> ov;
    apply_default_budget(name, "75%", ov);
    const PolicyConfig p = make_policy_config(name, ov);
    if (p.info->lookahead || p.attention_source(1) != 1) continue;
    live::PreparedPrompt pp = engine.prepare(prompt, 6, live::LiveEngine::live_needs({p}, c));
    live::RunOptions o;
    o.steps = 6;
    o.policy = &p;
    o.record = true;  // every generated row into the layer tensors, to compare against
    const live::RunResult r = engine.run(pp, o);
    expect_backend_matches(*backend, pp, r, name);
    ++tested;
  }
  EXPECT_GE(tested, 14);
}

TEST_F(LiveFixture, RejectsPoliciesWithoutALiveRun) {
  const ModelConfig gqa = tiny_config("llama", 4, 2);
  expect_error([&] { live::LiveEngine::live_needs({make_policy_config("oracle", {})}, gqa); },
               "lookahead");
  expect_error(
      [&] {
        live::LiveEngine::live_needs({make_policy_config("st3", {{"heredity", "0:1"}})}, gqa);
      },
      "heredity");
  // One cache per query head runs live only where it is one cache per KV head.
  const PolicyConfig per_query_head = make_policy_config("snapkv", {{"caches", "query_head"}});
  expect_error([&] { live::LiveEngine::live_needs({per_query_head}, gqa); }, "replay-only");
  EXPECT_NO_THROW(live::LiveEngine::live_needs({per_query_head}, tiny_config("llama", 4, 4)));
  // A policy that appends the question needs the context prepared beside the prompt.
  const PromptSample prompt = tiny_prompt(24, 4, 12, c.vocab_size);  // 8 tokens after the image
  const PolicyConfig appended =
      make_policy_config("snapkv:kvpress", {{"window", "2"}, {"budget", "8"}});
  live::RunOptions o;
  o.steps = 2;
  o.policy = &appended;
  live::PreparedPrompt pp = engine.prepare(prompt, 2, live::LiveEngine::live_needs({appended}, c));
  expect_error([&] { engine.run(pp, o); }, "prepare the prompt with question_after");
  // A question holding a vision token cannot be fed as text.
  PromptSample odd = prompt;
  odd.info.question_len = 10;
  expect_error([&] { engine.prepare(odd, 2, {}, true); }, "holds a vision token at 14");
}

// kvpress's order in the live path (question = append): the context is compressed, then the
// question's tokens are fed against the compressed cache. Restated: the same model run on the
// context alone as the prompt, compressing all of it, then fed the question's tokens as forced
// decode steps, must give the same cache and the same logits to float32 rounding; every
// question query attends only the kept context entries and the question so far. (Not bit for
// bit: the appended question's rows go through one product (sgemm) where the restated run feeds
// them one at a time (sgemv), and OpenBLAS's Haswell and Zen kernels round those differently:
// up to 4e-7 of logits near 1 were seen.)
TEST_F(LiveFixture, QuestionAppendedAfterCompressionRestated) {
  const PromptSample prompt = tiny_prompt(24, 4, 12, c.vocab_size);  // Q = 8 after the image
  for (const char* name : {"snapkv:kvpress", "h2o:kvpress", "tova:kvpress", "knorm:kvpress"}) {
    const PolicyConfig appended = make_policy_config(name, {{"budget", "6"}});
    const AttentionNeeds needs = live::LiveEngine::live_needs({appended}, c);
    live::PreparedPrompt pp = engine.prepare(prompt, 4, needs, true);
    ASSERT_EQ(pp.question, 8);
    live::RunOptions o;
    o.steps = 4;
    o.policy = &appended;
    o.keep_logits = true;
    const live::RunResult r = engine.run(pp, o);
    EXPECT_EQ(r.question_steps, 8);
    EXPECT_EQ(r.prompt_kv_entries, 2 * 2 * 16);  // the context's rows, before compression
    ASSERT_EQ(r.steps.size(), 4u);
    EXPECT_EQ(r.steps[0].position, 24);

    PromptSample context = prompt;
    context.info.prompt_len = 16;
    context.info.token_ids.resize(16);
    context.info.modality.resize(16);
    context.info.segment.resize(16);
    context.info.question_len = 0;
    const PolicyConfig whole =
        make_policy_config(name, {{"budget", "6"}, {"question", "compress"}});
    live::PreparedPrompt pc = engine.prepare(context, 12, needs);
    std::vector<std::int32_t> forced(prompt.info.token_ids.begin() + 16,
                                     prompt.info.token_ids.end());
    forced.insert(forced.end(), r.predicted.begin(), r.predicted.end() - 1);
    live::RunOptions w;
    w.steps = 12;
    w.policy = &whole;
    w.forced = &forced;
    w.keep_logits = true;
    const live::RunResult restated = engine.run(pc, w);
    const auto as_double = [](const std::vector<float>& v) {
      return std::vector<double>(v.begin(), v.end());
    };
    EXPECT_LT(rel_error(r.first_logits, as_double(restated.logits[7])), 1e-5) << name;
    for (int t = 0; t < 4; ++t)
      EXPECT_LT(rel_error(r.logits[t], as_double(restated.logits[8 + t])), 1e-5)
          << name << " " << t;
    EXPECT_EQ(r.peak_kv_entries, restated.peak_kv_entries) << name;
    for (int l = 0; l < 2; ++l)
      for (int g = 0; g < 2; ++g) {
        EXPECT_EQ(r.caches[l].positions(g), restated.caches[l].positions(g)) << name;
        // The kept context: 6 entries of positions 0..15; then every question and answer token.
        const auto& kept = r.caches[l].positions(g);
        int context_kept = 0;
        for (int p : kept) context_kept += p < 16;
        if (std::string(name) == "tova:kvpress") continue;
        EXPECT_EQ(context_kept, 6) << name;
        for (int p = 16; p < 27; ++p)
          EXPECT_TRUE(std::count(kept.begin(), kept.end(), p)) << name << " " << p;
      }
  }
}

// The same policy code decides the same evictions live (question appended after compression) as
// replay's question = append on a trace of the same prompt: at layer 0, whose inputs do not
// depend on what deeper layers kept.
TEST_F(LiveFixture, QuestionAppendedMatchesReplaysDecisions) {
  PromptSample prompt = tiny_prompt(40, 4, 20, c.vocab_size);  // Q = 16 after the image
  TraceReader tr(captured(prompt, "question_trace", 6));
  const SampleInfo s = tr.read_sample(prompt.info.name);
  ASSERT_EQ(question_length(s), 16);
  std::vector<std::int32_t> answer(s.token_ids.begin() + 40, s.token_ids.end());
  for (const char* name : {"snapkv:kvpress", "h2o:kvpress", "streamingllm:kvpress", "tova:kvpress",
                           "pyramidkv:kvpress", "knorm:kvpress"}) {
    const PolicyConfig p = make_policy_config(name, {{"budget", "10"}});
    ASSERT_TRUE(p.appends_question()) << name;
    Replayer replayer(tr, {p}, ReplayOptions{});
    std::vector<std::vector<EvictionRecord>> replayed;
    replayer.replay_sample(s.name, [&](const LayerResult& r) {
      if (r.layer == 0) replayed = r.evicted;
    });
    live::PreparedPrompt pp = engine.prepare(prompt, 6, live::LiveEngine::live_needs({p}, c), true);
    live::RunOptions o;
    o.steps = 6;
    o.policy = &p;
    o.forced = &answer;
    const live::RunResult live_run = engine.run(pp, o);
    expect_same_evictions(live_run.caches[0], replayed, name);
  }
}

// A prompt tail in the live path: every policy compresses the prompt less its last N tokens
// (or its question), then those tokens are fed against the compressed cache, the policy deciding
// on them as on any decode step. Restated: the model run on the prompt less its tail as the
// prompt, fed the tail's tokens as forced decode steps, gives the same caches, the same first
// answer distribution and the same logits (to float32 rounding: see the test above); with a
// budget that evicts, the first answer token's distribution is no longer the full prompt's.
TEST_F(LiveFixture, PromptTailFedAfterCompressionRestated) {
  const PromptSample prompt = tiny_prompt(24, 4, 12, c.vocab_size);  // Q = 8 after the image
  for (const int tail : {1, kQuestionTail}) {
    const int fed = tail == 1 ? 1 : 8;
    for (const char* name : {"h2o", "tova", "snapkv", "streamingllm", "hae", "madakv"}) {
      const PolicyConfig p = make_policy_config(name, {{"budget", "6"}});
      const AttentionNeeds needs = live::LiveEngine::live_needs({p}, c);
      live::PreparedPrompt pp = engine.prepare(prompt, 4, needs, false, tail);
      ASSERT_EQ(pp.question, fed);
      live::RunOptions o;
      o.steps = 4;
      o.policy = &p;
      o.keep_logits = true;
      const live::RunResult r = engine.run(pp, o);
      EXPECT_EQ(r.question_steps, fed);
      EXPECT_EQ(r.prompt_kv_entries, 2 * 2 * (24 - fed));
      ASSERT_EQ(r.steps.size(), 4u);
      EXPECT_EQ(r.steps[0].position, 24);
      // The first answer token comes from the compressed cache, not the prefill.
      EXPECT_GT(rel_error(r.first_logits,
                          std::vector<double>(pp.first_logits.begin(), pp.first_logits.end())),
                1e-4)
          << name;

      PromptSample context = prompt;
      context.info.prompt_len = 24 - fed;
      context.info.token_ids.resize(24 - fed);
      context.info.modality.resize(24 - fed);
      context.info.segment.resize(24 - fed);
      context.info.question_len = 0;
      live::PreparedPrompt pc = engine.prepare(context, fed + 4, needs);
      std::vector<std::int32_t> forced(prompt.info.token_ids.begin() + 24 - fed,
                                       prompt.info.token_ids.end());
      forced.insert(forced.end(), r.predicted.begin(), r.predicted.end() - 1);
      live::RunOptions w = o;
      w.steps = fed + 4;
      w.forced = &forced;
      const live::RunResult restated = engine.run(pc, w);
      const auto as_double = [](const std::vector<float>& v) {
        return std::vector<double>(v.begin(), v.end());
      };
      EXPECT_LT(rel_error(r.first_logits, as_double(restated.logits[fed - 1])), 1e-5) << name;
      for (int t = 0; t < 4; ++t)
        EXPECT_LT(rel_error(r.logits[t], as_double(restated.logits[fed + t])), 1e-5)
            << name << " " << t;
      EXPECT_EQ(r.peak_kv_entries, restated.peak_kv_entries) << name;
      for (int l = 0; l < 2; ++l)
        for (int g = 0; g < 2; ++g)
          EXPECT_EQ(r.caches[l].positions(g), restated.caches[l].positions(g)) << name;
    }
  }
  // A budget that keeps the whole prompt leaves the first answer token as the full cache's.
  const PolicyConfig roomy = make_policy_config("h2o", {{"budget", "100%"}});
  live::PreparedPrompt pp = engine.prepare(prompt, 2, roomy.needs(), false, 1);
  live::RunOptions o;
  o.steps = 2;
  o.policy = &roomy;
  const live::RunResult r = engine.run(pp, o);
  EXPECT_LT(rel_error(r.first_logits,
                      std::vector<double>(pp.first_logits.begin(), pp.first_logits.end())),
            1e-5);
  // The tail is fed as text tokens: one reaching into the image is refused.
  expect_error([&] { engine.prepare(prompt, 2, {}, false, 20); },
               "its prompt tail, the last 20 prompt positions, holds a vision token at 4");
  const PolicyConfig appended = make_policy_config("snapkv:kvpress", {{"budget", "6"}});
  live::PreparedPrompt pq = engine.prepare(prompt, 2, {}, false, 1);
  o.policy = &appended;
  expect_error([&] { engine.run(pq, o); }, "question = append is an order of its own");
}

// Live and replay decide alike under a prompt tail: at layer 0, whose inputs do not depend on
// what deeper layers kept, the same evictions at the same steps, the tail's steps included. A
// budget in entries and one as a share (of the whole prompt: 25% of 40 keeps 10 under either).
TEST_F(LiveFixture, PromptTailMatchesReplaysDecisions) {
  PromptSample prompt = tiny_prompt(40, 4, 20, c.vocab_size);  // Q = 16 after the image
  TraceReader tr(captured(prompt, "tail_trace", 6));
  const SampleInfo s = tr.read_sample(prompt.info.name);
  std::vector<std::int32_t> answer(s.token_ids.begin() + 40, s.token_ids.end());
  for (const int tail : {1, kQuestionTail})
    for (const char* name : {"h2o", "tova", "snapkv", "streamingllm", "hae", "madakv", "random"})
      for (const char* budget : {"10", "25%"}) {
        const PolicyConfig p = make_policy_config(name, {{"budget", budget}});
        Replayer replayer(tr, {p}, ReplayOptions{.prompt_tail = tail});
        std::vector<std::vector<EvictionRecord>> replayed;
        replayer.replay_sample(s.name, [&](const LayerResult& r) {
          if (r.layer == 0) replayed = r.evicted;
        });
        live::PreparedPrompt pp =
            engine.prepare(prompt, 6, live::LiveEngine::live_needs({p}, c), false, tail);
        live::RunOptions o;
        o.steps = 6;
        o.policy = &p;
        o.forced = &answer;
        const live::RunResult live_run = engine.run(pp, o);
        expect_same_evictions(live_run.caches[0], replayed,
                              std::string(name) + " " + budget + " tail " + prompt_tail_text(tail));
      }
}

// Several questions on one compressed context (kvpress's pipeline with questions asked in turn):
// samples naming one context_id are compressed to the same context whatever question follows,
// the random floor included (its draw keyed on the context, not the sample). Restated: each
// sample's kept context positions equal the first's; without the shared id the random draws
// differ, so the equality is the id's doing.
TEST_F(LiveFixture, SeveralQuestionsOnOneCompressedContext) {
  const PromptSample first = tiny_prompt(24, 4, 12, c.vocab_size);  // context 0..15, Q = 8
  PromptSample second = first;
  second.info.name = "other_question";
  std::mt19937_64 rng(11);
  for (int i = 16; i < 24; ++i) second.info.token_ids[i] = static_cast<int>(rng() % c.vocab_size);
  for (int i = 0; i < 3; ++i) {  // a longer question: 11 tokens
    second.info.token_ids.push_back(static_cast<int>(rng() % c.vocab_size));
    second.info.modality.push_back(0);
    second.info.segment.push_back(1);
  }
  second.info.prompt_len = 27;
  auto kept_context = [&](const PromptSample& prompt, const PolicyConfig& p) {
    live::PreparedPrompt pp = engine.prepare(prompt, 3, live::LiveEngine::live_needs({p}, c), true);
    live::RunOptions o;
    o.steps = 3;
    o.policy = &p;
    const live::RunResult r = engine.run(pp, o);
    std::vector<std::vector<std::int32_t>> out;
    for (int l = 0; l < 2; ++l)
      for (int g = 0; g < 2; ++g) {
        out.emplace_back();
        for (int pos : r.caches[l].positions(g))
          if (pos < 16) out.back().push_back(pos);
      }
    return out;
  };
  for (const char* name : {"random", "snapkv:kvpress", "knorm:kvpress", "tova:kvpress"}) {
    const PolicyConfig p = make_policy_config(name, {{"budget", "6"}, {"question", "append"}});
    PromptSample a = first, b = second;
    b.info.context_id = a.info.context_id = "context0";
    const auto kept = kept_context(a, p);
    EXPECT_EQ(kept_context(b, p), kept) << name;
    for (const auto& head : kept) EXPECT_EQ(head.size(), 6u) << name;
    if (std::string(name) == "random") {
      a.info.context_id = b.info.context_id = "";  // keyed on the names: other draws
      EXPECT_NE(kept_context(a, p), kept_context(b, p));
    }
  }
}

TEST_F(LiveFixture, SharedContextsAreCheckedAndCarriedIntoTheTrace) {
  PromptSample a = tiny_prompt(24, 4, 12, c.vocab_size, 0, 3), b = a;
  b.info.name = "b";
  b.info.token_ids[20] = (b.info.token_ids[20] + 1) % c.vocab_size;  // another question
  a.info.question_len = b.info.question_len = 8;
  a.info.context_id = b.info.context_id = "ctx";
  const std::string path = temp_path("shared_prompts.h5"), trace = temp_path("shared_trace.h5");
  write_prompt_file(path, {a, b});
  PromptReader reader(path);
  EXPECT_EQ(reader.read("b").info.context_id, "ctx");
  EXPECT_NO_THROW(check_shared_contexts(reader, reader.sample_names()));
  live::CaptureOptions co;
  co.gen_len = 2;
  live::capture(engine, reader, reader.sample_names(), trace, co);
  EXPECT_EQ(TraceReader(trace).read_sample("b").context_id, "ctx");
  b.info.token_ids[3] = (b.info.token_ids[3] + 1) % c.vocab_size;  // now the contexts differ
  const std::string changed_path = temp_path("shared_changed.h5");
  write_prompt_file(changed_path, {a, b});
  PromptReader changed(changed_path);
  expect_error([&] { check_shared_contexts(changed, changed.sample_names()); },
               "samples 'b' and 's3' name context_id 'ctx' but their contexts (the prompt less "
               "the question) differ in token_ids");
  b = a;
  b.info.name = "b";
  b.info.question_len = 9;  // the context one token shorter
  const std::string shorter_path = temp_path("shared_shorter.h5");
  write_prompt_file(shorter_path, {a, b});
  PromptReader shorter(shorter_path);
  expect_error([&] { check_shared_contexts(shorter, shorter.sample_names()); },
               "differ in token_ids");
}

TEST_F(LiveFixture, CaptureRoundTripsThroughReplay) {
  const PromptSample prompt = tiny_prompt(40, 4, 20, c.vocab_size);
  const std::string prompts = temp_path("capture_prompts.h5"),
                    trace = temp_path("capture_trace.h5");
  write_prompt_file(prompts, {prompt});
  PromptReader reader(prompts);
  live::CaptureOptions co;
  co.gen_len = 8;
  live::capture(engine, reader, reader.sample_names(), trace, co);

  // The trace holds the no-policy run: same tokens, same prompt q/k/v.
  live::PreparedPrompt pp = engine.prepare(prompt, 8, {});
  live::RunOptions o;
  o.steps = 8;
  const live::RunResult alone = engine.run(pp, o);
  TraceReader tr(trace);
  const SampleInfo s = tr.read_sample(prompt.info.name);
  ASSERT_EQ(s.prompt_len, 40);
  ASSERT_EQ(s.gen_len, 8);
  for (int t = 0; t < 8; ++t) EXPECT_EQ(s.token_ids[40 + t], alone.predicted[t]);
  EXPECT_EQ(s.modality[10], 1);
  EXPECT_EQ(s.segment[45], 2);
  const LayerTensors l1 = tr.read_layer(s, 1);
  for (int i = 0; i < 40; ++i) EXPECT_EQ(l1.k(i, 1, 3), pp.layers[1]->tensors().k(i, 1, 3)) << i;

  // Layer 0 sees the same tokens in replay and in a teacher-forced live run, so the same policy
  // code must make the same decisions in both.
  for (const char* name : {"streamingllm", "h2o", "tova"}) {
    const PolicyConfig p = make_policy_config(name, {{"budget", "16"}});
    Replayer replayer(tr, {p}, ReplayOptions{});
    std::vector<std::vector<EvictionRecord>> replayed;
    replayer.replay_sample(s.name, [&](const LayerResult& r) {
      if (r.layer == 0) replayed = r.evicted;
    });
    live::PreparedPrompt pq = engine.prepare(prompt, 8, p.needs());
    live::RunOptions po;
    po.steps = 8;
    po.policy = &p;
    po.forced = &alone.predicted;
    const live::RunResult live_run = engine.run(pq, po);
    for (int g = 0; g < 2; ++g) {
      const auto& lv = live_run.caches[0].evictions(g);
      ASSERT_EQ(lv.size(), replayed[g].size()) << name;
      for (std::size_t i = 0; i < lv.size(); ++i) {
        EXPECT_EQ(lv[i].step, replayed[g][i].step) << name;
        EXPECT_EQ(lv[i].position, replayed[g][i].position) << name;
      }
    }
  }
}

// `live capture --compact` writes what `kvsim compact` makes of the full capture: the statistics
// of the stored (float16) values, and the same replay results to the byte.
TEST_F(LiveFixture, CompactCaptureEqualsCompactingTheFullCapture) {
  const PromptSample prompt = tiny_prompt(250, 4, 220, c.vocab_size);  // a 26-token question
  const std::string prompts = temp_path("compact_capture_prompts.h5"),
                    full = temp_path("compact_capture_full.h5"),
                    direct = temp_path("compact_capture_direct.h5"),
                    converted = temp_path("compact_capture_converted.h5");
  write_prompt_file(prompts, {prompt});
  PromptReader reader(prompts);
  live::CaptureOptions co;
  co.gen_len = 6;
  co.dtype = DType::kFloat16;
  live::capture(engine, reader, reader.sample_names(), full, co);
  co.compact_window = 64;
  co.compact_window_widths = {8, 32, 64};  // and the window statistics
  live::capture(engine, reader, reader.sample_names(), direct, co);
  write_compact_trace(TraceReader(full), converted,
                      CompactOptions{.window = 64, .window_widths = {8, 32, 64}});
  const TraceReader d(direct);
  ASSERT_EQ(d.info().compact_window, 64);
  ASSERT_EQ(d.info().compact_window_widths, (std::vector<int>{8, 32, 64}));
  const SampleInfo s = d.read_sample(prompt.info.name);
  EXPECT_EQ(s.compact_context_len, 224);
  EXPECT_EQ(s.compact_first_row, 128);  // the block of 64 rows holding row 224 - 64 = 160
  for (const char* args : {"-p h2o -p snapkv -p tova -p meda -p lookm:released --budget 30%",
                           "-p snapkv:kvpress -p knorm:kvpress --budget 25%"}) {
    const CliRun a = kvsim("replay " + direct + " " + std::string(args) + " --out " +
                           temp_path("compact_capture_a.csv") + " --dump-decisions " +
                           temp_path("compact_capture_a.h5"));
    const CliRun b = kvsim("replay " + converted + " " + std::string(args) + " --out " +
                           temp_path("compact_capture_b.csv") + " --dump-decisions " +
                           temp_path("compact_capture_b.h5"));
    ASSERT_EQ(a.code, 0) << a.output;
    ASSERT_EQ(b.code, 0) << b.output;
    EXPECT_EQ(slurp(temp_path("compact_capture_a.csv")), slurp(temp_path("compact_capture_b.csv")));
    EXPECT_EQ(slurp(temp_path("compact_capture_a.h5")), slurp(temp_path("compact_capture_b.h5")));
  }
}

TEST(LiveEval, HandWorkedMetrics) {
  // p = softmax(0, ln 3) = (1/4, 3/4), q = (1/2, 1/2):
  // KL = 1/4 ln(1/2) + 3/4 ln(3/2) = 0.130812035
  EXPECT_NEAR(live::kl_divergence({0.0f, std::log(3.0f)}, {0.0f, 0.0f}), 0.130812035, 1e-7);
  EXPECT_EQ(live::kl_divergence({1.0f, 2.0f}, {1.0f, 2.0f}), 0.0);
  EXPECT_NEAR(live::log_softmax_at({0.0f, std::log(3.0f)}, 1), std::log(0.75), 1e-7);
  EXPECT_EQ(live::longest_common_subsequence({1, 2, 3, 4}, {1, 3, 4, 2}), 3);
  EXPECT_EQ(live::longest_common_subsequence({5, 6}, {7}), 0);
  EXPECT_EQ(live::argmax({0.5f, 2.0f, 2.0f, -1.0f}), 1);  // ties to the lowest index
}

TEST(LiveSummary, ReferenceNllAndPerplexityPerToken) {
  live::EvalSummary s;
  s.label = "h2o";
  s.sample = "x";
  s.ref_tokens = 4;
  s.ref_loglik = -8.0;       // 2 nats per token
  s.ref_loglik_full = -4.0;  // 1 nat per token
  s.full_peak_kv_bytes = 1;
  std::string row;
  live::append_eval_summary_csv(row, s, false);
  const std::string header = live::eval_summary_csv_header();
  auto split = [](const std::string& line) {  // keeps empty fields, the last one included
    std::vector<std::string> out(1);
    for (char c : line.substr(0, line.size() - 1)) c == ',' ? out.emplace_back() : out.back() += c;
    return out;
  };
  const std::vector<std::string> names = split(header), values = split(row);
  ASSERT_EQ(names.size(), values.size());
  auto at = [&](const std::string& name) {
    return values[std::find(names.begin(), names.end(), name) - names.begin()];
  };
  EXPECT_EQ(at("ref_nll"), "2");
  EXPECT_EQ(at("ref_nll_full"), "1");
  EXPECT_EQ(at("ref_ppl"), "7.3890561");        // e^2
  EXPECT_EQ(at("ref_ppl_full"), "2.71828183");  // e^1
}

TEST_F(LiveFixture, EvaluateFullHasNoLossAndStreamingHasSome) {
  PromptSample prompt = tiny_prompt(48, 4, 24, c.vocab_size);
  prompt.reference_ids = {5, 9, 13, 2};
  const std::vector<PolicyConfig> policies = {
      make_policy_config("full", {}), make_policy_config("streamingllm", {{"budget", "8"}})};
  live::EvalOptions o;
  o.gen_len = 6;
  const auto rows = live::evaluate_prompt(engine, prompt, policies, o);
  ASSERT_EQ(rows.size(), 2u);
  const auto& full = rows[0];
  EXPECT_EQ(full.mean_kl, 0.0);
  EXPECT_EQ(full.top1_agreement, 1.0);
  EXPECT_EQ(full.first_divergence, 7);  // the whole answer: prefill token + 6 steps
  EXPECT_EQ(full.answer_overlap, 1.0);
  EXPECT_EQ(full.ref_loglik, full.ref_loglik_full);
  EXPECT_LT(full.ref_loglik, 0.0);
  EXPECT_EQ(full.peak_kv_bytes, full.full_peak_kv_bytes);
  const auto& sl = rows[1];
  EXPECT_GT(sl.mean_kl, 0.0);
  EXPECT_NE(sl.ref_loglik, sl.ref_loglik_full);
  // 9 rows per layer and KV head while attending, 2 x 2 of them, 2 x 8 floats x 4 bytes each.
  EXPECT_EQ(sl.peak_kv_bytes, 2 * 2 * 9 * 64);
  EXPECT_EQ(sl.prompt_kv_bytes, 2 * 2 * 48 * 64);
  ASSERT_EQ(sl.steps.size(), 6u);
  EXPECT_EQ(sl.steps[0].position, 48);
  EXPECT_GE(sl.first_divergence, 1);  // the prefill's token never differs
}

TEST_F(LiveFixture, EvaluateDecodesAndScoresTheAnswers) {
  // A llama2.c vocabulary for the model's 64 ids: piece i is " w<i>".
  const std::string dir = temp_path("answer_vocab");
  std::filesystem::create_directories(dir);
  nlohmann::json vocab = {{"bos_id", 62}, {"eos_id", 63}, {"pieces", nlohmann::json::array()}};
  for (int i = 0; i < c.vocab_size; ++i) vocab["pieces"].push_back(" w" + std::to_string(i));
  std::ofstream(dir + "/vocab.json") << vocab.dump();
  const auto v = live::Vocabulary::find(dir);
  ASSERT_TRUE(v.has_value());
  PromptSample prompt = tiny_prompt(48, 4, 24, c.vocab_size);
  const std::vector<PolicyConfig> policies = {
      make_policy_config("full", {}), make_policy_config("streamingllm", {{"budget", "8"}})};
  live::EvalOptions o;
  o.gen_len = 5;
  o.vocabulary = &*v;
  auto piece = [](std::int32_t id) { return id >= 62 ? std::string() : " w" + std::to_string(id); };
  auto rows = live::evaluate_prompt(engine, prompt, policies, o);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_TRUE(rows[0].has_answers);
  EXPECT_FALSE(rows[0].has_reference);  // no reference attribute: no scores
  // The answer is the prefill's token and one per step: its text ends with the steps' pieces.
  std::string full_steps, policy_steps;
  int same = 1;  // predicted[0] comes from the uncompressed prefill in both runs
  for (const auto& st : rows[1].steps) {
    full_steps += piece(st.full_token);
    policy_steps += piece(st.policy_token);
    same += st.full_token == st.policy_token;
  }
  EXPECT_EQ(rows[0].answer, rows[0].full_answer);
  EXPECT_EQ(rows[1].full_answer, rows[0].full_answer);
  ASSERT_GE(rows[0].full_answer.size(), full_steps.size());
  EXPECT_EQ(rows[0].full_answer.substr(rows[0].full_answer.size() - full_steps.size()), full_steps);
  EXPECT_EQ(rows[1].answer.substr(rows[1].answer.size() - policy_steps.size()), policy_steps);
  EXPECT_DOUBLE_EQ(rows[0].token_match, 1.0);
  EXPECT_DOUBLE_EQ(rows[1].token_match, same / 6.0);
  // With the full cache's answer as the reference, the full cache is exactly right.
  prompt.info.reference = rows[0].full_answer;
  rows = live::evaluate_prompt(engine, prompt, policies, o);
  EXPECT_TRUE(rows[0].has_reference);
  EXPECT_TRUE(rows[0].score.exact);
  EXPECT_TRUE(rows[0].full_score.exact);
  EXPECT_TRUE(rows[1].full_score.exact);
  EXPECT_EQ(rows[1].score.exact, live::normalize_vqa_answer(rows[1].answer) ==
                                     live::normalize_vqa_answer(rows[0].answer));
  std::string csv;
  live::append_eval_summary_csv(csv, rows[0], false);
  EXPECT_NE(csv.find(",1,1,1,1,"), std::string::npos) << csv;  // the four answer scores
}

TEST(PromptFile, RoundTripAndErrors) {
  PromptSample s = tiny_prompt(10, 2, 4, 50, 6);
  s.reference_ids = {1, 2, 3};
  s.info.media_id = {-1, -1, 0, 0, 0, 0, -1, -1, -1, -1};  // image 0 at positions 2..5
  const std::string path = temp_path("prompts_rt.h5");
  write_prompt_file(path, {s});
  const PromptSample back = PromptReader(path).read(s.info.name);
  EXPECT_EQ(back.info.token_ids, s.info.token_ids);
  EXPECT_EQ(back.info.modality, s.info.modality);
  EXPECT_EQ(back.info.segment, s.info.segment);
  EXPECT_EQ(back.info.media_id, s.info.media_id);
  EXPECT_EQ(back.reference_ids, s.reference_ids);
  EXPECT_EQ(back.inputs_embeds, s.inputs_embeds);
  EXPECT_EQ(back.embed_positions(), (std::vector<int>{2, 3, 4, 5}));
  PromptSample bad = s;
  bad.inputs_embeds.resize(3 * 6);  // 3 rows for 4 vision positions
  write_prompt_file(path, {bad});
  expect_error([&] { PromptReader(path).read(s.info.name); }, "inputs_embeds");
  bad = s;
  bad.info.modality.pop_back();
  write_prompt_file(path, {bad});
  expect_error([&] { PromptReader(path).read(s.info.name); }, "'modality': length 9");
  bad = s;
  bad.info.media_id[3] = -1;  // an image position without its image
  write_prompt_file(path, {bad});
  expect_error([&] { PromptReader(path).read(s.info.name); },
               "'media_id': value -1 at position 3 for a vision token");
  expect_error([&] { PromptReader(temp_path("capture_trace_missing.h5")); }, "cannot open");
}

TEST(LiveCli, EvaluateWritesIdenticalBytesAndRejectsOracle) {
  const std::string dir = temp_path("cli_model"), prompts = temp_path("cli_prompts.h5");
  std::filesystem::remove_all(dir);
  ASSERT_EQ(kvsim("live make-model -o " + dir + " --arch qwen2 --dtype bf16 --shards 2").code, 0);
  ASSERT_EQ(kvsim("live make-prompt -o " + prompts +
                  " --samples 1 --prompt-len 64 --image-tokens 32 --embed-dim 64 "
                  "--reference-len 4")
                .code,
            0);
  const std::string common = "live evaluate -m " + dir + " --prompts " + prompts +
                             " -p streamingllm -p snapkv --budget 75% --gen 5 --no-timing";
  std::string bytes[2];
  for (int i = 0; i < 2; ++i) {
    const std::string out = temp_path("cli_eval" + std::to_string(i));
    const CliRun r = kvsim(common + " -j" + std::to_string(i + 1) + " -o " + out +
                           ".csv --summary " + out + "_summary.csv");
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_EQ(r.output.find("ms/token"), std::string::npos) << r.output;  // --no-timing
    bytes[i] = slurp(out + ".csv") + slurp(out + "_summary.csv");
  }
  EXPECT_EQ(bytes[0], bytes[1]);
  const std::string figs = temp_path("cli_live_figs");
  const CliRun fig = kvsim("figures " + temp_path("cli_eval0.csv") + " " +
                           temp_path("cli_eval0_summary.csv") + " -o " + figs);
  ASSERT_EQ(fig.code, 0) << fig.output;
  for (const char* f : {"live_kl_by_step.png", "live_summary.pdf"})
    EXPECT_TRUE(std::filesystem::exists(figs + "/" + f)) << f;
  EXPECT_NE(bytes[0].find("snapkv,000000,75%,64,5,"), std::string::npos);  // budget, P, G
  const CliRun oracle =
      kvsim("live evaluate -m " + dir + " --prompts " + prompts + " -p oracle --gen 3");
  EXPECT_NE(oracle.code, 0);
  EXPECT_NE(oracle.output.find("lookahead"), std::string::npos) << oracle.output;
  const std::string trace = temp_path("cli_capture.h5");
  ASSERT_EQ(kvsim("live capture -m " + dir + " --prompts " + prompts +
                  " --gen 4 --dtype float16 -o " + trace)
                .code,
            0);
  const CliRun replay = kvsim("replay -t " + trace + " -p full -p h2o --budget 50%");
  EXPECT_EQ(replay.code, 0) << replay.output;
}

// The summary's held-over-budget under a prompt tail: the budget is a share of the whole prompt,
// the positions compressed are the prompt less its tail (prompt_fed), so a policy holding its
// budget under --equal-memory reads exactly 1, with a tail or without.
TEST(LiveCli, HeldOverBudgetCountsThePartCompressed) {
  const std::string dir = temp_path("held_model"), prompts = temp_path("held_prompts.h5");
  std::filesystem::remove_all(dir);
  ASSERT_EQ(kvsim("live make-model -o " + dir + " --arch llama").code, 0);
  ASSERT_EQ(kvsim("live make-prompt -o " + prompts +
                  " --samples 1 --prompt-len 64 --image-tokens 32 --embed-dim 64")
                .code,
            0);
  for (const int tail : {0, 4}) {
    const std::string summary = temp_path("held_" + std::to_string(tail) + ".csv");
    const CliRun r =
        kvsim("live evaluate -m " + dir + " --prompts " + prompts +
              " -p snapkv -p h2o --budget 25% --equal-memory --gen 3 --no-timing " +
              (tail ? "--prompt-tail " + std::to_string(tail) + " " : "") + "--summary " + summary);
    ASSERT_EQ(r.code, 0) << r.output;
    const CsvTable t = read_csv_table(summary);
    const auto sample = t.strings("sample");
    const auto held = t.numbers("peak_held_over_budget"), fed = t.numbers("prompt_fed");
    const auto kv = t.numbers("prompt_kv_bytes");
    int rows = 0;
    for (std::size_t i = 0; i < t.rows.size(); ++i) {
      if (sample[i] == "all") continue;
      ++rows;
      EXPECT_DOUBLE_EQ(held[i], 1.0) << "tail " << tail << " row " << i;
      EXPECT_EQ(fed[i], tail);
      // Two KV heads of 16 dimensions, float32 keys and values, two layers: the part compressed.
      EXPECT_EQ(kv[i], 2.0 * 2 * 2 * 16 * 4 * (64 - tail)) << "row " << i;
    }
    EXPECT_EQ(rows, 2);
  }
}

TEST(LiveCli, PromptsAreCheckedAgainstTheModelFirst) {
  // Before any work: the embedding width and every token and reference id against the model,
  // each error naming the prompt file and the sample; and a model without a vocabulary, on
  // prompts with reference answers, is a warning that accuracy stays empty.
  const std::string dir = temp_path("fit_model"), prompts = temp_path("fit_prompts.h5");
  std::filesystem::remove_all(dir);
  ASSERT_EQ(kvsim("live make-model -o " + dir + " --arch llama").code, 0);  // hidden 64, V 256
  PromptSample p = tiny_prompt(12, 3, 0, 64);
  p.info.reference = "a cat";
  write_prompt_file(prompts, {p});
  const std::string run = "live evaluate -m " + dir + " --prompts " + prompts + " -p h2o --gen 2";
  CliRun r = kvsim(run);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("kvsim: warning: " + dir +
                          " has no vocabulary (vocab.json or "
                          "tokenizer.json; --tokenizer names one): the answers cannot be "
                          "decoded, so answer accuracy is left empty for the 1 sample(s) with a "
                          "reference answer\n"),
            std::string::npos)
      << r.output;
  const PromptSample wide = tiny_prompt(12, 3, 3, 64, 16);  // image rows 16 wide
  write_prompt_file(prompts, {wide});
  r = kvsim(run);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(
      r.output.find("kvsim: error: " + prompts + ", sample '" + p.info.name +
                    "': inputs_embeds rows have 16 columns, the hidden_size of " + dir + " is 64"),
      std::string::npos)
      << r.output;
  PromptSample outside = p;
  outside.info.token_ids[5] = 300;
  write_prompt_file(prompts, {outside});
  r = kvsim(run);
  EXPECT_NE(r.output.find(prompts + ", sample '" + p.info.name +
                          "': token id 300 at position 5 "
                          "is outside the vocabulary of " +
                          dir + " [0, 256)"),
            std::string::npos)
      << r.output;
  PromptSample reference = p;
  reference.reference_ids = {3, -1};
  write_prompt_file(prompts, {reference});
  r = kvsim(run);
  EXPECT_NE(r.output.find("': reference token id -1 at position 1 is outside the vocabulary"),
            std::string::npos)
      << r.output;
}

TEST(LiveCli, PolicyNotesInReplaysWords) {
  // SnapKV with 3 entries under its window notes the clamp: live evaluate says it as replay says
  // it of the captured trace, on the console, in the policies sidecar and in the summary rows.
  const std::string dir = temp_path("notes_model"), prompts = temp_path("notes_prompts.h5");
  std::filesystem::remove_all(dir);
  ASSERT_EQ(kvsim("live make-model -o " + dir + " --arch llama").code, 0);
  ASSERT_EQ(kvsim("live make-prompt -o " + prompts + " --samples 2 --prompt-len 40").code, 0);
  const std::string trace = temp_path("notes_capture.h5");
  ASSERT_EQ(kvsim("live capture -m " + dir + " --prompts " + prompts + " --gen 3 -o " + trace).code,
            0);
  const CliRun replay = kvsim("replay " + trace + " -p snapkv --set snapkv.budget=3");
  ASSERT_EQ(replay.code, 0) << replay.output;
  std::vector<std::string> warnings;
  std::istringstream lines(replay.output);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("kvsim: warning: snapkv:", 0) == 0) warnings.push_back(line);
  ASSERT_EQ(warnings.size(), 1u) << replay.output;
  EXPECT_NE(warnings[0].find("(2 of 2 sample(s))"), std::string::npos) << warnings[0];
  const std::string out = temp_path("notes_eval");
  const CliRun live = kvsim("live evaluate -m " + dir + " --prompts " + prompts +
                            " -p snapkv --set snapkv.budget=3 --gen 3 --no-timing -o " + out +
                            ".csv --summary " + out + "_summary.csv");
  ASSERT_EQ(live.code, 0) << live.output;
  EXPECT_NE(live.output.find(warnings[0] + "\n"), std::string::npos) << live.output;
  const std::string note = warnings[0].substr(std::string("kvsim: warning: ").size());
  EXPECT_NE(slurp(out + ".policies.csv").find(note), std::string::npos);
  const std::string bare = note.substr(0, note.rfind(" (2 of 2"));
  const std::string summary = slurp(out + "_summary.csv");
  EXPECT_NE(summary.find(",notes,"), std::string::npos);
  EXPECT_NE(summary.find("\"" + bare + "\""), std::string::npos) << summary;
}

}  // namespace
}  // namespace kvsim::test
