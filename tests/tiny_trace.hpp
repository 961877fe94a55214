// Hand-made traces for tests: one KV head, d = 1 and scale = 1, so that a query q_i = c and keys
// k_j = ln w_j give causal attention p_ij = w_j^c / Σ_{m<=i} w_m^c, worked out by hand in each
// test (c = 1: proportional to w; c = 0: uniform).
#pragma once

#include <string>
#include <vector>

#include "traces/kvtrace_writer.hpp"

namespace kvsim::test {

// A fresh path under the test temp directory.
std::string temp_path(const std::string& name);

struct TinyTrace {
  int prompt_len = 0;
  std::vector<double> weights;         // w_j, T of them
  std::vector<double> query_power;     // c_i per position (default 1)
  std::vector<double> values;          // v_j (d = 1), empty: no v
  std::vector<std::uint8_t> modality;  // default all text
  std::vector<std::int32_t> media_id;  // default none (-1 on text, the image's id elsewhere)
  std::vector<std::uint8_t> segment;   // default: prompt 1 (user), generated 2
  int layers = 1;
  int heads = 1;  // query heads; all share the single KV head (GQA when > 1)
  // A second KV head with its own weights (then heads = 2, query head h uses KV head h).
  std::vector<double> weights_kv1;
  // Query power of head h > 0 at position i: query_power[i] * head_power[h] (default 1).
  std::vector<double> head_power;
  // Query power of layer l: multiplies every query of that layer (default 1).
  std::vector<double> layer_power;
  DType dtype = DType::kFloat32;
  std::string write(const std::string& name) const;  // returns the path
};

// A small synthetic trace (GQA 4 query heads on 2 KV heads, d = 16) for engine-level tests.
std::string small_synthetic_trace(const std::string& name, int layers = 3, bool with_v = true,
                                  int heads = 4, int kv_heads = 2);

}  // namespace kvsim::test
