// Writes kvtrace v1 files: used by `kvsim synth`, the tests, and (later) live capture.
#pragma once

#include <string>

#include "traces/kvtrace.hpp"

namespace kvsim {

struct WriteOptions {
  DType dtype = DType::kFloat16;
  // Compression shrinks float16 Q/K/V only to ~0.88 and slows reads 6-15x, so it is opt-in.
  int gzip_level = 0;    // 0 = none; 1..9 gzip (implies chunked storage)
  bool shuffle = false;  // byte shuffle before gzip (implies chunked storage)
  bool chunked = false;  // chunked storage, one chunk per token row block
};

class TraceWriter {
 public:
  // Creates (truncates) path and writes the file attributes.
  TraceWriter(const std::string& path, const TraceInfo& info, const WriteOptions& options);

  // Writes a sample's attributes and token metadata; layers follow with write_layer().
  void write_sample(const SampleInfo& sample);
  // Writes layers/<l>/{q,k,v} of a sample already written with write_sample(). v may be empty.
  // A compact trace (TraceInfo::compact_window > 0) writes the query rows as q_rows and the
  // layer's stored statistics (tensors.stored, required).
  void write_layer(const SampleInfo& sample, const LayerTensors& tensors);
  // An optional float32 [rows, cols] dataset of a written sample (kvtrace allows extra
  // datasets), e.g. the logits of a live capture.
  void write_sample_matrix(const SampleInfo& sample, const char* name, int rows, int cols,
                           const float* data);
  void close();

 private:
  void write_tensor(hid_t group, const char* name, const xt::xtensor<float, 3>& t);
  void write_stored_stats(hid_t layer_group, const SampleInfo& sample,
                          const StoredPromptStats& stats);
  std::string path_;
  TraceInfo info_;
  WriteOptions options_;
  H5Handle file_;
};

}  // namespace kvsim
