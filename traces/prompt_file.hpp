// Prompt files (kvprompt v1): the input of `kvsim live`. One HDF5 file, one group per sample,
// with the token metadata of kvtrace v1 for the prompt only (docs/live.md, "Prompt files"):
//   /                       attrs kvprompt_version = 1, model (optional, free text)
//   /samples/<name>         attrs task, reference (optional strings)
//     token_ids     int32 [P]          required
//     modality      uint8 [P]          optional (default all text): 0 text, 1 image, 2 video
//     segment       uint8 [P]          optional (default all user): 0 system, 1 user
//     media_id      int32 [P]          optional
//     inputs_embeds float16|32 [Nv, D] optional: rows replacing the token embeddings of the
//                                      Nv vision positions (modality != 0), in position order
//     reference_ids int32 [R]          optional: a reference answer, scored by log-likelihood
//     attrs question_len (int), context_id (string): optional; samples naming one context_id
//     share their context (the prompt less its question_len tokens)
#pragma once

#include <string>
#include <vector>

#include "traces/kvtrace.hpp"

namespace kvsim {

struct PromptSample {
  SampleInfo info;  // prompt_len = P, gen_len = 0; modality/segment/media_id/token_ids of length P
  std::vector<float> inputs_embeds;  // [Nv, hidden] or empty
  int embed_dim = 0;                 // hidden size of inputs_embeds (0 when absent)
  std::vector<std::int32_t> reference_ids;
  // M-RoPE models (Qwen2-VL): [P, 3] row-major, the temporal, height and width position ids of
  // each prompt token, as transformers' get_rope_index computes them; empty otherwise.
  std::vector<std::int32_t> position_ids;
  // Positions whose embedding comes from inputs_embeds (the vision positions), or empty.
  std::vector<int> embed_positions() const;
};

class PromptReader {
 public:
  explicit PromptReader(const std::string& path);
  const std::string& path() const { return path_; }
  const std::vector<std::string>& sample_names() const { return samples_; }
  PromptSample read(const std::string& name) const;
  // The sample's prompt length, from its token_ids' shape alone (splitting work by cost).
  int prompt_len(const std::string& name) const;
  // The sample's context_id attribute alone ("" when it has none).
  std::string context_id(const std::string& name) const;

 private:
  std::string path_;
  H5Handle file_;
  std::vector<std::string> samples_;
};

// Checks that the samples naming one context_id share their context: the same prompt less the
// question (question_length: question_len, else the text after the last image), that is the same
// token ids, modality, segment, media ids, M-RoPE ids and image rows. Throws TraceError naming
// the file and the two samples otherwise. Samples without a context_id are not read.
void check_shared_contexts(const PromptReader& prompts, const std::vector<std::string>& samples);

void write_prompt_file(const std::string& path, const std::vector<PromptSample>& samples,
                       const std::string& model = "");

}  // namespace kvsim
