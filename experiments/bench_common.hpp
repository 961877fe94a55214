// What the replay benchmarks (bench_replay.cpp, bench_compact.cpp) share: the machine's thread
// count and peak memory, the attention products a full replay computes, and the single-precision
// GEMM rate those products could reach (the floor each benchmark prints).
#pragma once

#include <benchmark/benchmark.h>
#include <cblas.h>
#include <sys/resource.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "core/parallel.hpp"
#include "traces/kvtrace.hpp"

namespace kvsim::bench {

inline int hardware_threads() {
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

inline double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024.0;
}

// The blocks of a causal prompt of P rows from row `first_row` (a multiple of 64) on, 64 rows
// each, each against the keys up to its last row (LayerAttention's prefill blocks):
// block(rows, keys) for each.
template <class Block>
void for_each_prompt_block(int P, int first_row, Block block) {
  for (int i0 = first_row; i0 < P; i0 += 64) block(std::min(64, P - i0), std::min(i0 + 64, P));
}

// The logits of those blocks from row 0, per head.
inline double causal_prompt_logits(int P) {
  double n = 0;
  for_each_prompt_block(P, 0, [&n](int rows, int keys) { n += static_cast<double>(rows) * keys; });
  return n;
}

// The attention products a full replay of the baselines computes, in GFLOP: the causal prompt
// logits in blocks of 64 rows (h2o's column sums), then per decode step the logits and the output
// over the T keys, for every query head, layer and sample.
inline double attention_gflop(const TraceReader& reader) {
  const auto& info = reader.info();
  double flop = 0;
  for (const auto& name : reader.sample_names()) {
    const auto s = reader.read_sample(name);
    const double P = s.prompt_len, G = s.gen_len, T = s.total_len(), d = info.head_dim;
    flop +=
        (causal_prompt_logits(P) * d * 2 + 2 * G * T * d * 2) * info.num_heads * info.num_layers;
  }
  return flop / 1e9;
}

// Single-precision GEMM throughput on every core with the shape of a block of prompt rows against
// `keys` keys (rows x keys x 128, each thread its own product, as the engine runs them; 64 rows
// the prompt's blocks, a KV group's heads of a block together the entropies'), reported as the
// counter "GFLOPs".
inline void measure_gemm_rate(benchmark::State& state, int keys, int rows = 64) {
  const int threads = hardware_threads();
  const int m = rows, n = keys, k = 128;
  std::vector<std::vector<float>> a(threads, std::vector<float>(m * k, 0.5f)),
      b(threads, std::vector<float>(static_cast<std::size_t>(n) * k, 0.25f)),
      c(threads, std::vector<float>(static_cast<std::size_t>(m) * n));
  openblas_set_num_threads(1);
  const int repeats = std::max(1, (50 * 2048) / n);  // 50 products of 2,048 keys per iteration
  for (auto _ : state)
    parallel_for(threads, threads, [&](int t) {
      for (int r = 0; r < repeats; ++r)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a[t].data(), k,
                    b[t].data(), k, 0.0f, c[t].data(), n);
    });
  const double flop = 2.0 * m * n * k * repeats * threads * state.iterations();
  state.counters["GFLOPs"] = benchmark::Counter(flop / 1e9, benchmark::Counter::kIsRate);
}

}  // namespace kvsim::bench
