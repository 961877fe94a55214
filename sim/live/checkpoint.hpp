// Hugging Face decoder checkpoints: config.json plus model.safetensors, or shards listed by
// model.safetensors.index.json. LLaMA family (LLaMA, Vicuna, LLaVA-1.5's language model),
// Mistral and Qwen2, stored in bf16, fp16 or fp32; weights are held as float32. Vision-language
// checkpoints as transformers saves them are read for their language model alone: LLaVA
// (`text_config`; tensors under `language_model.` or, since transformers 4.52,
// `model.language_model.`) and Qwen2-VL / Qwen2.5-VL (Qwen2 with M-RoPE).
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvsim::live {

// Every problem with a checkpoint: the message names the file and the key or tensor.
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class WeightDType { kBFloat16, kFloat16, kFloat32 };
const char* safetensors_dtype_name(WeightDType t);  // "BF16", "F16", "F32"

// The fields of config.json the decoder uses (names as in transformers).
struct ModelConfig {
  std::string model_type;  // llama, mistral or qwen2
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int head_dim = 0;  // config's head_dim, or hidden_size / num_attention_heads
  int vocab_size = 0;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;   // Qwen2 always; LLaMA when attention_bias
  bool o_bias = false;     // LLaMA's attention_bias also biases o_proj
  int sliding_window = 0;  // 0: none; otherwise runs longer than this are refused
  int max_position_embeddings = 0;
  std::string torch_dtype;  // as written, informational
  // The checkpoint's own model_type when the decoder is the language model of a vision-language
  // model (llava, llava_next, llava_onevision, qwen2_vl, qwen2_5_vl); empty for a decoder alone.
  std::string vlm_type;
  // M-RoPE (Qwen2-VL): frequencies [0, s0) rotate by a token's temporal position id, the next s1
  // by its height id, the last s2 by its width id (rope_scaling.mrope_section = [s0, s1, s2],
  // s0 + s1 + s2 = head_dim / 2). Empty: plain RoPE, one position per token.
  std::vector<int> mrope_section;
  bool mrope() const { return !mrope_section.empty(); }
};

// Parses and checks config.json; unsupported architectures, activations or rope scalings are
// errors naming the key.
ModelConfig read_model_config(const std::string& path);
ModelConfig parse_model_config(const std::string& json_text, const std::string& path);
std::string model_config_json(const ModelConfig& c, WeightDType dtype);  // for writing

struct HostTensor {
  std::vector<std::int64_t> shape;
  std::vector<float> data;
};

// Every tensor of a checkpoint directory, converted to float32.
struct Checkpoint {
  std::string dir;
  ModelConfig config;
  WeightDType dtype = WeightDType::kFloat32;  // of the first tensor read
  std::map<std::string, HostTensor> tensors;
  // The tensor `name` with the expected shape; throws naming it when missing or misshapen.
  const HostTensor& get(const std::string& name, std::vector<std::int64_t> shape) const;
};

Checkpoint load_checkpoint(const std::string& dir);

// The end-of-sequence ids greedy generation stops at: eos_token_id (an int or a list) of the
// directory's generation_config.json when it has one, as transformers' generate() uses it, else
// of config.json; empty when neither says. Throws naming the file when the value is malformed.
std::vector<std::int32_t> read_eos_token_ids(const std::string& dir);

// The tensor names and shapes a decoder with this config must have.
std::vector<std::pair<std::string, std::vector<std::int64_t>>> expected_tensors(
    const ModelConfig& c);

// --- safetensors ---
struct SafetensorsEntry {
  std::string name;
  WeightDType dtype;
  std::vector<std::int64_t> shape;
};
// Reads every tensor of one .safetensors file into `out` (float32).
void read_safetensors(const std::string& path, std::map<std::string, HostTensor>& out,
                      WeightDType* first_dtype = nullptr);
// The same from the file's bytes; `path` names it in errors.
void parse_safetensors(const char* bytes, std::size_t size, const std::string& path,
                       std::map<std::string, HostTensor>& out, WeightDType* first_dtype = nullptr);
// Writes tensors (converted from float32 to dtype) to one .safetensors file.
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, const HostTensor*>>& tensors,
                       WeightDType dtype);

float bfloat16_to_float(std::uint16_t b);
std::uint16_t float_to_bfloat16(float f);  // round to nearest even, as torch does

// A random-initialised checkpoint in the exact HF layout (tests, demos, CI): weights N(0, std),
// norms around 1; `shards` > 1 writes model-0000i-of-0000n.safetensors plus the index.
void write_random_checkpoint(const std::string& dir, const ModelConfig& config, WeightDType dtype,
                             int shards, std::uint64_t seed, double std = 0.05);

}  // namespace kvsim::live
