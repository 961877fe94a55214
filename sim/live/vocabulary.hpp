// Token ids back to text, for answer-level accuracy: the vocabulary beside a checkpoint. Two
// formats: a llama2.c vocabulary as JSON (vocab.json with "pieces", "bos_id", "eos_id", as
// stories260K has) and a Hugging Face tokenizer.json (BPE with a ByteLevel decoder, as GPT-2 and
// Qwen2 have, or SentencePiece-style pieces with '▁' spaces and <0xNN> byte fallback, as LLaMA
// has). Special tokens are skipped, as transformers' decode(skip_special_tokens=True) does.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace kvsim::live {

class Vocabulary {
 public:
  // Reads vocab.json (llama2.c) or tokenizer.json; errors (CheckpointError) name the file.
  static Vocabulary load(const std::string& path);
  // The directory's vocab.json in llama2.c's format, else its tokenizer.json; none when neither.
  static std::optional<Vocabulary> find(const std::string& dir);

  std::string decode(const std::vector<std::int32_t>& ids) const;
  const std::string& path() const { return path_; }

 private:
  enum class Kind { kLlama2c, kByteLevel, kSentencePiece };
  Kind kind_ = Kind::kLlama2c;
  std::string path_;
  std::unordered_map<std::int32_t, std::string> pieces_;
  std::unordered_set<std::int32_t> special_;
  std::int32_t bos_ = -1;
  bool strip_leading_space_ = false;  // tokenizer.json's Strip decoder (LLaMA's)
};

}  // namespace kvsim::live
