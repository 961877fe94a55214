#include "sim/live/checkpoint.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "traces/half.hpp"

namespace kvsim::live {

namespace fs = std::filesystem;
using json = nlohmann::json;

const char* safetensors_dtype_name(WeightDType t) {
  switch (t) {
    case WeightDType::kBFloat16:
      return "BF16";
    case WeightDType::kFloat16:
      return "F16";
    default:
      return "F32";
  }
}

float bfloat16_to_float(std::uint16_t b) {
  const std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::uint16_t float_to_bfloat16(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if (std::isnan(f)) return static_cast<std::uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<std::uint16_t>(bits >> 16);
}

namespace {

json parse_json(const std::string& text, const std::string& path) {
  try {
    json j = json::parse(text);
    if (!j.is_object()) throw CheckpointError(path + ": not a JSON object");
    return j;
  } catch (const json::exception& e) {
    throw CheckpointError(path + ": not valid JSON: " + e.what());
  }
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw CheckpointError(path + ": cannot open (does it exist?)");
  return parse_json(std::string(std::istreambuf_iterator<char>(in), {}), path);
}

std::string get_string(const json& j, const std::string& key, const std::string& path,
                       const std::string& fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_string()) throw CheckpointError(path + ": key '" + key + "' must be a string");
  return j[key].get<std::string>();
}

int get_int(const json& j, const std::string& key, const std::string& path, int fallback = -1) {
  if (!j.contains(key) || j[key].is_null()) {
    if (fallback >= 0) return fallback;
    throw CheckpointError(path + ": missing key '" + key + "'");
  }
  // 2^30 bounds every size a model has, and keeps products of two sizes within 64 bits.
  if (!j[key].is_number_integer() || j[key].get<long long>() <= 0 ||
      j[key].get<long long>() > (1ll << 30))
    throw CheckpointError(path + ": key '" + key + "' must be a positive integer (at most 2^30)");
  return j[key].get<int>();
}

double get_double(const json& j, const std::string& key, const std::string& path, double fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_number() || !(j[key].get<double>() > 0) || !std::isfinite(j[key].get<double>()))
    throw CheckpointError(path + ": key '" + key + "' must be a positive number");
  return j[key].get<double>();
}

bool get_bool(const json& j, const std::string& key, const std::string& path, bool fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_boolean())
    throw CheckpointError(path + ": key '" + key + "' must be true or false");
  return j[key].get<bool>();
}

WeightDType parse_dtype(const std::string& s, const std::string& where) {
  if (s == "BF16") return WeightDType::kBFloat16;
  if (s == "F16") return WeightDType::kFloat16;
  if (s == "F32") return WeightDType::kFloat32;
  throw CheckpointError(where + ": dtype " + s + " is not supported (BF16, F16 or F32)");
}

std::size_t dtype_size(WeightDType t) {
  return t == WeightDType::kFloat32 ? 4 : 2;
}

}  // namespace

std::vector<std::int32_t> read_eos_token_ids(const std::string& dir) {
  for (const char* name : {"generation_config.json", "config.json"}) {
    const std::string path = (std::filesystem::path(dir) / name).string();
    if (!std::filesystem::exists(path)) continue;
    const json j = read_json(path);
    if (!j.contains("eos_token_id") || j["eos_token_id"].is_null()) continue;
    const json& e = j["eos_token_id"];
    std::vector<std::int32_t> ids;
    if (e.is_number_integer()) {
      ids.push_back(e.get<std::int32_t>());
    } else if (e.is_array()) {
      for (const json& x : e) {
        if (!x.is_number_integer())
          throw CheckpointError(path + ": eos_token_id holds " + x.dump() + ", not an integer");
        ids.push_back(x.get<std::int32_t>());
      }
    } else {
      throw CheckpointError(path + ": eos_token_id is " + e.dump() +
                            ", not an integer or a list of integers");
    }
    return ids;
  }
  return {};
}

ModelConfig read_model_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw CheckpointError(path + ": cannot open (does it exist?)");
  return parse_model_config(std::string(std::istreambuf_iterator<char>(in), {}), path);
}

namespace {

// transformers' LlamaConfig defaults, which LLaVA's config.json leaves out of its text_config
// (llava-1.5-7b-hf gives only the vocabulary, positions and rms_norm_eps).
const std::map<std::string, json> kLlamaDefaults = {
    {"hidden_size", 4096},      {"intermediate_size", 11008}, {"num_hidden_layers", 32},
    {"num_attention_heads", 32}, {"vocab_size", 32000},        {"max_position_embeddings", 2048}};

// rope_scaling (transformers 4) or rope_parameters (transformers 5): plain RoPE, or M-RoPE when it
// has mrope_section. Anything else is refused.
void parse_rope(const json& j, const std::string& path, ModelConfig& c) {
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    const json& r = j[key];
    const std::string where = path + ": " + key;
    if (!r.is_object()) throw CheckpointError(where + " " + r.dump() + " is not an object");
    const std::string type = get_string(r, "rope_type", where, get_string(r, "type", where, ""));
    if (r.contains("rope_theta")) c.rope_theta = get_double(r, "rope_theta", where, c.rope_theta);
    if (r.contains("mrope_section")) {
      const json& m = r["mrope_section"];
      if (!m.is_array() || m.size() != 3)
        throw CheckpointError(where + ".mrope_section must be three integers");
      int sum = 0;
      for (const json& x : m) {
        if (!x.is_number_integer() || x.get<int>() < 0)
          throw CheckpointError(where + ".mrope_section must be three integers >= 0");
        c.mrope_section.push_back(x.get<int>());
        sum += x.get<int>();
      }
      if (2 * sum != c.head_dim)
        throw CheckpointError(where + ".mrope_section " + m.dump() + " sums to " +
                              std::to_string(sum) + ", not head_dim / 2 = " +
                              std::to_string(c.head_dim / 2));
      continue;
    }
    if (type != "default")
      throw CheckpointError(where + " " + r.dump() +
                            " is not supported (only plain RoPE, and Qwen2-VL's M-RoPE)");
  }
}

// One decoder's keys (a config.json, or the text_config of a vision-language one).
ModelConfig parse_decoder(const json& j, const std::string& path, const std::string& type) {
  ModelConfig c;
  c.model_type = type;
  const std::string act = get_string(j, "hidden_act", path, "silu");
  if (act != "silu")
    throw CheckpointError(path + ": hidden_act '" + act + "' is not supported (silu)");
  c.hidden_size = get_int(j, "hidden_size", path);
  c.intermediate_size = get_int(j, "intermediate_size", path);
  c.num_hidden_layers = get_int(j, "num_hidden_layers", path);
  c.num_attention_heads = get_int(j, "num_attention_heads", path);
  c.num_key_value_heads = get_int(j, "num_key_value_heads", path, c.num_attention_heads);
  c.head_dim = get_int(j, "head_dim", path, c.hidden_size / c.num_attention_heads);
  c.vocab_size = get_int(j, "vocab_size", path);
  c.rope_theta = get_double(j, "rope_theta", path, 10000.0);
  // Read exactly as written; when absent, transformers' default for all three architectures:
  // LlamaConfig, MistralConfig and Qwen2Config all declare rms_norm_eps=1e-6.
  c.rms_norm_eps = get_double(j, "rms_norm_eps", path, 1e-6);
  c.tie_word_embeddings = get_bool(j, "tie_word_embeddings", path, false);
  c.max_position_embeddings = get_int(j, "max_position_embeddings", path, 0);
  c.torch_dtype = get_string(j, "torch_dtype", path, "");
  if (c.model_type == "qwen2") {
    c.qkv_bias = true;
    if (get_bool(j, "use_sliding_window", path, false))
      c.sliding_window = get_int(j, "sliding_window", path);
  } else if (c.model_type == "llama") {
    c.qkv_bias = c.o_bias = get_bool(j, "attention_bias", path, false);
    if (get_bool(j, "mlp_bias", path, false))
      throw CheckpointError(path + ": mlp_bias = true is not supported");
  } else {
    c.sliding_window = get_int(j, "sliding_window", path, 0);
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    throw CheckpointError(path + ": num_attention_heads (" + std::to_string(c.num_attention_heads) +
                          ") is not a multiple of num_key_value_heads (" +
                          std::to_string(c.num_key_value_heads) + ")");
  if (c.head_dim <= 0 || c.head_dim % 2 != 0)
    throw CheckpointError(path + ": head_dim = " + std::to_string(c.head_dim) +
                          " must be positive and even for RoPE");
  parse_rope(j, path, c);
  return c;
}

bool is_decoder_type(const std::string& t) {
  return t == "llama" || t == "mistral" || t == "qwen2";
}

}  // namespace

ModelConfig parse_model_config(const std::string& text, const std::string& path) {
  const json j = parse_json(text, path);
  if (!j.contains("model_type")) throw CheckpointError(path + ": missing key 'model_type'");
  const std::string type = get_string(j, "model_type", path, "");
  if (is_decoder_type(type)) return parse_decoder(j, path, type);
  if (type == "llava" || type == "llava_next" || type == "llava_onevision") {
    const std::string where = path + " (text_config)";
    if (!j.contains("text_config") || !j["text_config"].is_object())
      throw CheckpointError(path + ": a " + type + " config without a text_config object");
    json text_config = j["text_config"];
    const std::string text_type = get_string(text_config, "model_type", where, "llama");
    if (!is_decoder_type(text_type))
      throw CheckpointError(where + ": model_type '" + text_type +
                            "' is not supported (llama, mistral, qwen2)");
    if (text_type == "llama")
      for (const auto& [key, value] : kLlamaDefaults)
        if (!text_config.contains(key) || text_config[key].is_null()) text_config[key] = value;
    ModelConfig c = parse_decoder(text_config, where, text_type);
    c.vlm_type = type;
    return c;
  }
  if (type == "qwen2_vl" || type == "qwen2_5_vl") {
    // transformers 5 nests the language model's keys in text_config; 4.x keeps them at the top.
    const bool nested = j.contains("text_config") && j["text_config"].is_object() &&
                        j["text_config"].contains("hidden_size");
    ModelConfig c = parse_decoder(nested ? j["text_config"] : j,
                                  nested ? path + " (text_config)" : path, "qwen2");
    c.vlm_type = type;
    return c;
  }
  throw CheckpointError(path + ": model_type '" + type +
                        "' is not supported (llama, mistral, qwen2; the language models of llava, "
                        "llava_next, llava_onevision, qwen2_vl, qwen2_5_vl)");
}

std::string model_config_json(const ModelConfig& c, WeightDType dtype) {
  static const std::map<std::string, std::string> arch = {{"llama", "LlamaForCausalLM"},
                                                          {"mistral", "MistralForCausalLM"},
                                                          {"qwen2", "Qwen2ForCausalLM"}};
  json j = {{"architectures", {arch.at(c.model_type)}},
            {"model_type", c.model_type},
            {"hidden_size", c.hidden_size},
            {"intermediate_size", c.intermediate_size},
            {"num_hidden_layers", c.num_hidden_layers},
            {"num_attention_heads", c.num_attention_heads},
            {"num_key_value_heads", c.num_key_value_heads},
            {"head_dim", c.head_dim},
            {"vocab_size", c.vocab_size},
            {"rope_theta", c.rope_theta},
            {"rms_norm_eps", c.rms_norm_eps},
            {"tie_word_embeddings", c.tie_word_embeddings},
            {"hidden_act", "silu"},
            {"max_position_embeddings", c.max_position_embeddings},
            {"rope_scaling", nullptr},
            {"torch_dtype", dtype == WeightDType::kBFloat16  ? "bfloat16"
                            : dtype == WeightDType::kFloat16 ? "float16"
                                                             : "float32"}};
  if (c.model_type == "llama") j["attention_bias"] = c.qkv_bias;
  return j.dump(2) + "\n";
}

std::vector<std::pair<std::string, std::vector<std::int64_t>>> expected_tensors(
    const ModelConfig& c) {
  const std::int64_t D = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const std::int64_t q = static_cast<std::int64_t>(c.num_attention_heads) * c.head_dim;
  const std::int64_t kv = static_cast<std::int64_t>(c.num_key_value_heads) * c.head_dim;
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> out;
  out.push_back({"model.embed_tokens.weight", {V, D}});
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    out.push_back({p + "input_layernorm.weight", {D}});
    out.push_back({p + "self_attn.q_proj.weight", {q, D}});
    out.push_back({p + "self_attn.k_proj.weight", {kv, D}});
    out.push_back({p + "self_attn.v_proj.weight", {kv, D}});
    out.push_back({p + "self_attn.o_proj.weight", {D, q}});
    if (c.qkv_bias) {
      out.push_back({p + "self_attn.q_proj.bias", {q}});
      out.push_back({p + "self_attn.k_proj.bias", {kv}});
      out.push_back({p + "self_attn.v_proj.bias", {kv}});
    }
    if (c.o_bias) out.push_back({p + "self_attn.o_proj.bias", {D}});
    out.push_back({p + "post_attention_layernorm.weight", {D}});
    out.push_back({p + "mlp.gate_proj.weight", {I, D}});
    out.push_back({p + "mlp.up_proj.weight", {I, D}});
    out.push_back({p + "mlp.down_proj.weight", {D, I}});
  }
  out.push_back({"model.norm.weight", {D}});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", {V, D}});
  return out;
}

namespace {

std::string shape_str(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw CheckpointError(path + ": cannot open (does it exist?)");
  const auto size = static_cast<std::size_t>(in.tellg());
  std::vector<char> bytes(size);
  in.seekg(0);
  if (!in.read(bytes.data(), static_cast<std::streamsize>(size)))
    throw CheckpointError(path + ": read failed");
  return bytes;
}

void convert(const char* src, WeightDType t, std::size_t n, float* dst) {
  if (n == 0) return;
  if (t == WeightDType::kFloat32) {
    std::memcpy(dst, src, n * 4);
  } else {
    std::vector<std::uint16_t> raw(n);
    std::memcpy(raw.data(), src, n * 2);
    if (t == WeightDType::kFloat16) {
      half_to_float(raw.data(), dst, n);
    } else {
      for (std::size_t i = 0; i < n; ++i) dst[i] = bfloat16_to_float(raw[i]);
    }
  }
}

}  // namespace

namespace {

std::uint64_t json_offset(const json& offsets, int i, const std::string& where) {
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[i].is_number_unsigned())
    throw CheckpointError(where + ": data_offsets must be two non-negative integers");
  return offsets[i].get<std::uint64_t>();
}

// Elements of `shape` (each a non-negative integer); throws when the count cannot fit `limit`.
std::size_t json_shape(const json& shape, std::size_t limit, std::vector<std::int64_t>& dims,
                       const std::string& where) {
  if (!shape.is_array()) throw CheckpointError(where + ": shape must be an array");
  std::size_t n = 1;
  for (const auto& s : shape) {
    if (!s.is_number_unsigned() || s.get<std::uint64_t>() > limit)
      throw CheckpointError(where + ": shape " + shape.dump() +
                            " must hold non-negative integers within the file's size");
    dims.push_back(s.get<std::int64_t>());
    if (dims.back() != 0 && n > limit / static_cast<std::size_t>(dims.back()))
      throw CheckpointError(where + ": shape " + shape.dump() +
                            " holds more elements than the file");
    n *= static_cast<std::size_t>(dims.back());
  }
  return n;
}

}  // namespace

void parse_safetensors(const char* bytes, std::size_t size, const std::string& path,
                       std::map<std::string, HostTensor>& out, WeightDType* first_dtype) {
  if (size < 8) throw CheckpointError(path + ": too short for a safetensors file");
  std::uint64_t header_len = 0;
  std::memcpy(&header_len, bytes, 8);  // little-endian on every supported host
  if (header_len > size - 8)
    throw CheckpointError(path + ": header length " + std::to_string(header_len) +
                          " exceeds the file (truncated or not safetensors?)");
  json header;
  try {
    header = json::parse(bytes + 8, bytes + 8 + header_len);
  } catch (const json::exception& e) {
    throw CheckpointError(path + ": header is not valid JSON: " + e.what());
  }
  if (!header.is_object()) throw CheckpointError(path + ": header is not a JSON object");
  const std::size_t data_start = 8 + header_len, data_len = size - data_start;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string where = path + ": tensor '" + name + "'";
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets"))
      throw CheckpointError(where + ": entry lacks dtype, shape or data_offsets");
    if (!entry["dtype"].is_string()) throw CheckpointError(where + ": dtype must be a string");
    const WeightDType t = parse_dtype(entry["dtype"].get<std::string>(), where);
    HostTensor tensor;
    const std::size_t n = json_shape(entry["shape"], data_len, tensor.shape, where);
    const auto begin = json_offset(entry["data_offsets"], 0, where);
    const auto end = json_offset(entry["data_offsets"], 1, where);
    if (end < begin || end > data_len || end - begin != n * dtype_size(t))
      throw CheckpointError(where + ": data_offsets [" + std::to_string(begin) + ", " +
                            std::to_string(end) + ") do not fit shape " + shape_str(tensor.shape) +
                            " in " + std::to_string(data_len) + " data bytes (truncated file?)");
    tensor.data.resize(n);
    convert(bytes + data_start + begin, t, n, tensor.data.data());
    for (std::size_t i = 0; i < n; ++i)
      if (!std::isfinite(tensor.data[i]))
        throw CheckpointError(where + ": non-finite value at flat index " + std::to_string(i));
    if (first_dtype && out.empty()) *first_dtype = t;
    out[name] = std::move(tensor);
  }
}

void read_safetensors(const std::string& path, std::map<std::string, HostTensor>& out,
                      WeightDType* first_dtype) {
  const std::vector<char> bytes = read_file(path);
  parse_safetensors(bytes.data(), bytes.size(), path, out, first_dtype);
}

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, const HostTensor*>>& tensors,
                       WeightDType dtype) {
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};
  std::uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    const std::uint64_t bytes = t->data.size() * dtype_size(dtype);
    header[name] = {{"dtype", safetensors_dtype_name(dtype)},
                    {"shape", t->shape},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  while ((8 + h.size()) % 8 != 0) h += ' ';  // the format pads the header with spaces
  std::ofstream out(path, std::ios::binary);
  if (!out) throw CheckpointError(path + ": cannot create");
  const std::uint64_t len = h.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const auto& [name, t] : tensors) {
    if (dtype == WeightDType::kFloat32) {
      out.write(reinterpret_cast<const char*>(t->data.data()),
                static_cast<std::streamsize>(t->data.size() * 4));
      continue;
    }
    std::vector<std::uint16_t> raw(t->data.size());
    if (dtype == WeightDType::kFloat16)
      float_to_half(t->data.data(), raw.data(), raw.size());
    else
      for (std::size_t i = 0; i < raw.size(); ++i) raw[i] = float_to_bfloat16(t->data[i]);
    out.write(reinterpret_cast<const char*>(raw.data()),
              static_cast<std::streamsize>(raw.size() * 2));
  }
  if (!out) throw CheckpointError(path + ": write failed");
}

const HostTensor& Checkpoint::get(const std::string& name, std::vector<std::int64_t> shape) const {
  auto it = tensors.find(name);
  if (it == tensors.end())
    throw CheckpointError(dir + ": missing tensor '" + name + "' (model_type " + config.model_type +
                          ")");
  if (it->second.shape != shape)
    throw CheckpointError(dir + ": tensor '" + name + "' has shape " + shape_str(it->second.shape) +
                          ", config.json implies " + shape_str(shape));
  return it->second;
}

namespace {

// A vision-language checkpoint's language model under the decoder's own names ("model.",
// "lm_head.weight"); the vision tower and projector are dropped. Layouts, as transformers saves
// them: LlavaForConditionalGeneration before 4.52 (language_model.model.*,
// language_model.lm_head.weight), since 4.52 and in 5 (model.language_model.*, lm_head.weight);
// Qwen2VLForConditionalGeneration before 4.52 (model.*, lm_head.weight, beside visual.*) and
// since (model.language_model.*, lm_head.weight).
void keep_language_model(Checkpoint& ck) {
  if (ck.config.vlm_type.empty()) return;
  static const std::pair<const char*, const char*> kLayouts[] = {
      {"model.language_model.", "lm_head.weight"},
      {"language_model.model.", "language_model.lm_head.weight"},
      {"model.", "lm_head.weight"}};
  for (const auto& [prefix, head] : kLayouts) {
    if (!ck.tensors.count(std::string(prefix) + "embed_tokens.weight")) continue;
    std::map<std::string, HostTensor> kept;
    for (auto& [name, t] : ck.tensors) {
      if (name.rfind(prefix, 0) == 0)
        kept["model." + name.substr(std::strlen(prefix))] = std::move(t);
      else if (name == head)
        kept["lm_head.weight"] = std::move(t);
    }
    ck.tensors = std::move(kept);
    return;
  }
  throw CheckpointError(ck.dir + ": a " + ck.config.vlm_type +
                        " checkpoint without its language model's embeddings (looked for "
                        "model.language_model.embed_tokens.weight, "
                        "language_model.model.embed_tokens.weight and model.embed_tokens.weight)");
}

}  // namespace

Checkpoint load_checkpoint(const std::string& dir) {
  Checkpoint ck;
  ck.dir = dir;
  ck.config = read_model_config((fs::path(dir) / "config.json").string());
  const fs::path single = fs::path(dir) / "model.safetensors";
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(single)) {
    read_safetensors(single.string(), ck.tensors, &ck.dtype);
  } else if (fs::exists(index)) {
    const json j = read_json(index.string());
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      throw CheckpointError(index.string() + ": missing object 'weight_map'");
    std::set<std::string> shards;
    for (const auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos)
        throw CheckpointError(index.string() + ": weight_map['" + name +
                              "'] must name a shard file of the directory");
      shards.insert(file.get<std::string>());
    }
    for (const auto& shard : shards)
      read_safetensors((fs::path(dir) / shard).string(), ck.tensors, &ck.dtype);
    for (const auto& [name, file] : j["weight_map"].items())
      if (!ck.tensors.count(name))
        throw CheckpointError(index.string() + ": tensor '" + name + "' is listed in " +
                              file.get<std::string>() + " but that shard lacks it");
  } else {
    throw CheckpointError(dir + ": neither model.safetensors nor model.safetensors.index.json");
  }
  keep_language_model(ck);
  for (const auto& [name, shape] : expected_tensors(ck.config)) ck.get(name, shape);
  return ck;
}

void write_random_checkpoint(const std::string& dir, const ModelConfig& config, WeightDType dtype,
                             int shards, std::uint64_t seed, double std) {
  fs::create_directories(dir);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, static_cast<float>(std));
  std::map<std::string, HostTensor> tensors;
  std::vector<std::string> order;
  for (const auto& [name, shape] : expected_tensors(config)) {
    HostTensor t;
    t.shape = shape;
    std::size_t n = 1;
    for (auto s : shape) n *= static_cast<std::size_t>(s);
    t.data.resize(n);
    const bool norm = name.find("norm") != std::string::npos;
    for (auto& x : t.data) x = norm ? 1.0f + normal(rng) : normal(rng);
    order.push_back(name);
    tensors[name] = std::move(t);
  }
  {
    std::ofstream cfg(fs::path(dir) / "config.json");
    cfg << model_config_json(config, dtype);
  }
  shards = std::max(1, std::min<int>(shards, static_cast<int>(order.size())));
  if (shards == 1) {
    std::vector<std::pair<std::string, const HostTensor*>> all;
    for (const auto& n : order) all.push_back({n, &tensors[n]});
    write_safetensors((fs::path(dir) / "model.safetensors").string(), all, dtype);
    return;
  }
  json map = json::object();
  std::uint64_t total = 0;
  const std::size_t per = (order.size() + shards - 1) / shards;
  for (int s = 0; s < shards; ++s) {
    char file[64];
    std::snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", s + 1, shards);
    std::vector<std::pair<std::string, const HostTensor*>> part;
    for (std::size_t i = s * per; i < std::min(order.size(), (s + 1) * per); ++i) {
      part.push_back({order[i], &tensors[order[i]]});
      map[order[i]] = file;
      total += tensors[order[i]].data.size() * dtype_size(dtype);
    }
    write_safetensors((fs::path(dir) / file).string(), part, dtype);
  }
  std::ofstream idx(fs::path(dir) / "model.safetensors.index.json");
  idx << json{{"metadata", {{"total_size", total}}}, {"weight_map", map}}.dump(2) << "\n";
}

}  // namespace kvsim::live
