#include <algorithm>
#include <cfloat>
#include <stdexcept>
#include <string>

#include "gpu/kernels.cuh"

namespace kvsim::gpu {

namespace {

constexpr int kWarp = 32;
constexpr int kDecodeThreads = 128;  // 4 warps
constexpr int kDecodeWarps = kDecodeThreads / kWarp;
constexpr int kChunk = 256;  // most cache entries per decode block
constexpr int kMinChunk = 32;
constexpr int kUnroll = 4;    // key/value rows a warp loads before using them (loads in flight)
constexpr int kMaxGroup = 8;  // query heads per KV head
constexpr int kMaxVec = 2;    // float4 per lane: head_dim <= 256

__device__ float warp_sum(float x) {
  for (int o = kWarp / 2; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ float warp_max(float x) {
  for (int o = kWarp / 2; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// Sum over a block of blockDim.x (a multiple of 32, <= 1024) threads; every thread gets it.
__device__ float block_sum(float x, float* shared32) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  x = warp_sum(x);
  if (lane == 0) shared32[warp] = x;
  __syncthreads();
  float total = 0;
  for (int w = 0; w < blockDim.x / kWarp; ++w) total += shared32[w];
  __syncthreads();
  return total;
}
__device__ float block_max(float x, float* shared32) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  x = warp_max(x);
  if (lane == 0) shared32[warp] = x;
  __syncthreads();
  float m = -FLT_MAX;
  for (int w = 0; w < blockDim.x / kWarp; ++w) m = fmaxf(m, shared32[w]);
  __syncthreads();
  return m;
}

__global__ void embed_kernel(const float* table, const std::int32_t* ids, int rows, int dim,
                             float* out) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<std::size_t>(rows) * dim) return;
  const std::size_t r = i / dim, c = i % dim;
  out[i] = table[static_cast<std::size_t>(ids[r]) * dim + c];
}

__global__ void rms_norm_kernel(const float* x, const float* w, int dim, float eps, float* out) {
  __shared__ float shared[32];
  const float* xr = x + static_cast<std::size_t>(blockIdx.x) * dim;
  float ss = 0;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
  const float inv = rsqrtf(block_sum(ss, shared) / dim + eps);
  for (int i = threadIdx.x; i < dim; i += blockDim.x)
    out[static_cast<std::size_t>(blockIdx.x) * dim + i] = xr[i] * inv * w[i];
}

__global__ void add_bias_kernel(float* y, const float* bias, int rows, int n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < static_cast<std::size_t>(rows) * n) y[i] += bias[i % n];
}

__global__ void rope_kernel(float* x, int rows, int heads, int d, const std::int32_t* positions,
                            int axes, const std::int32_t* axis, const float* inv_freq) {
  const int half = d / 2;
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<std::size_t>(rows) * heads * half) return;
  const int f = i % half;
  const std::size_t rh = i / half;  // row * heads + head
  const int r = rh / heads;
  float s, c;
  sincosf(static_cast<float>(positions[r * axes + (axis ? axis[f] : 0)]) * inv_freq[f], &s, &c);
  float* v = x + rh * d;
  const float a = v[f], b = v[f + half];
  v[f] = a * c - b * s;
  v[f + half] = b * c + a * s;
}

__global__ void swiglu_kernel(const float* gate, const float* up, std::size_t n, float* out) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

__global__ void add_kernel(float* x, const float* y, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] += y[i];
}

__global__ void causal_softmax_kernel(float* scores, int cols) {
  __shared__ float shared[32];
  const int row = blockIdx.x;
  float* s = scores + static_cast<std::size_t>(row) * cols;
  float m = -FLT_MAX;
  for (int j = threadIdx.x; j <= row; j += blockDim.x) m = fmaxf(m, s[j]);
  m = block_max(m, shared);
  float sum = 0;
  for (int j = threadIdx.x; j <= row; j += blockDim.x) sum += expf(s[j] - m);
  const float inv = 1.0f / block_sum(sum, shared);
  for (int j = threadIdx.x; j < cols; j += blockDim.x) s[j] = j <= row ? expf(s[j] - m) * inv : 0;
}

__global__ void gather_rows_kernel(const float* rows, const std::int32_t* index, int n, int d,
                                   float* out) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<std::size_t>(n) * d) return;
  out[i] = rows[static_cast<std::size_t>(index[i / d]) * d + i % d];
}

// Scratch layout of the decode attention.
struct DecodeScratch {
  float *logits, *part_max, *part_sum, *part_out, *lse;
  __host__ __device__ DecodeScratch(float* base, int heads, int d, int max_length, int chunk) {
    const int splits = (max_length + chunk - 1) / chunk;
    logits = base;                                                     // [H, max_length]
    part_max = logits + static_cast<std::size_t>(heads) * max_length;  // [splits, H]
    part_sum = part_max + static_cast<std::size_t>(splits) * heads;    // [splits, H]
    part_out = part_sum + static_cast<std::size_t>(splits) * heads;    // [splits, H, d]
    lse = part_out + static_cast<std::size_t>(splits) * heads * d;     // [H]
  }
};

// Rows e0..e0+kUnroll-1 (those below end) of a [rows, d] cache head, lane's float4 slices;
// all loads issue before any is used (zeros beyond end or d).
template <int V>
__device__ void load_rows(const float* rows, int e0, int end, int d, int lane,
                          float4 (&out)[kUnroll][V]) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u)
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const int c = (v * kWarp + lane) * 4, e = e0 + u;
      out[u][v] = e < end && c < d
                      ? *reinterpret_cast<const float4*>(rows + static_cast<std::size_t>(e) * d + c)
                      : make_float4(0, 0, 0, 0);
    }
}

// Where one decode block works: KV head g, chunk `split` of its entries [begin, end), the query
// heads per KV head, and the calling thread's lane and warp.
struct ChunkBlock {
  int g, split, group, lane, warp, begin, end;
};

// The calling block's and thread's place: KV head blockIdx.x, chunk blockIdx.y.
__device__ __forceinline__ ChunkBlock chunk_block(const DecodeAttentionArgs& a) {
  const int g = blockIdx.x, split = blockIdx.y, group = a.heads / a.kv_heads;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int n = a.lengths[g], begin = split * a.chunk, end = min(n, begin + a.chunk);
  return {g, split, group, lane, warp, begin, end};
}

// The group's query rows, lane's float4 slices (zeros beyond the group or d), kept in registers.
template <int G, int V>
__device__ __forceinline__ void load_queries(const DecodeAttentionArgs& a, const ChunkBlock& b,
                                             float4 (&q)[G][V]) {
#pragma unroll
  for (int h = 0; h < G; ++h)
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const int c = (v * kWarp + b.lane) * 4;
      q[h][v] = h < b.group && c < a.d
                    ? *reinterpret_cast<const float4*>(a.q + (b.g * b.group + h) * a.d + c)
                    : make_float4(0, 0, 0, 0);
    }
}

// Lane's share of the dot product of a query row and a key row (its float4 slices).
template <int V>
__device__ __forceinline__ float lane_dot(const float4 (&q)[V], const float4 (&k)[V]) {
  float acc = 0;
#pragma unroll
  for (int v = 0; v < V; ++v)
    acc += q[v].x * k[v].x + q[v].y * k[v].y + q[v].z * k[v].z + q[v].w * k[v].w;
  return acc;
}

// o += w * row, on lane's float4 slices.
template <int V>
__device__ __forceinline__ void add_scaled(float4 (&o)[V], float w, const float4 (&row)[V]) {
#pragma unroll
  for (int v = 0; v < V; ++v) {
    o[v].x += w * row[v].x, o[v].y += w * row[v].y;
    o[v].z += w * row[v].z, o[v].w += w * row[v].w;
  }
}

// o = 0.
template <int G, int V>
__device__ __forceinline__ void zero_outputs(float4 (&o)[G][V]) {
#pragma unroll
  for (int h = 0; h < G; ++h)
#pragma unroll
    for (int v = 0; v < V; ++v) o[h][v] = make_float4(0, 0, 0, 0);
}

// Per query head (a warp each): the chunk's largest logit and sum of exponentials into the
// scratch; p becomes exp(logit - max), 0 where every logit is -inf.
template <int G>
__device__ __forceinline__ void chunk_softmax(const DecodeAttentionArgs& a, const ChunkBlock& b,
                                              const DecodeScratch& sc, float (&p)[G][kChunk]) {
  for (int h = b.warp; h < b.group; h += kDecodeWarps) {
    float m = -INFINITY;
    for (int i = b.lane; i < b.end - b.begin; i += kWarp) m = fmaxf(m, p[h][i]);
    m = warp_max(m);
    float sum = 0;
    for (int i = b.lane; i < b.end - b.begin; i += kWarp) {
      const float x = m == -INFINITY ? 0.0f : expf(p[h][i] - m);
      p[h][i] = x;
      sum += x;
    }
    sum = warp_sum(sum);
    if (b.lane == 0) {
      sc.part_max[b.split * a.heads + b.g * b.group + h] = m;
      sc.part_sum[b.split * a.heads + b.g * b.group + h] = sum;
    }
  }
}

// The warps' stashed outputs summed into the scratch's part_out of the chunk.
template <int G, int V>
__device__ __forceinline__ void sum_warp_outputs(const DecodeAttentionArgs& a, const ChunkBlock& b,
                                                 const DecodeScratch& sc,
                                                 const float (&reduce)[kDecodeWarps][G][V * 128]) {
  for (int i = threadIdx.x; i < b.group * a.d; i += kDecodeThreads) {
    const int h = i / a.d, c = i % a.d;
    float s = 0;
    for (int w = 0; w < kDecodeWarps; ++w) s += reduce[w][h][c];
    sc.part_out[(static_cast<std::size_t>(b.split) * a.heads + b.g * b.group + h) * a.d + c] = s;
  }
}

// One block per (KV head, chunk of kChunk entries): every query head of the group reads each key
// and value row once (GQA-friendly), rows are read as float4 by a whole warp (coalesced).
// Writes the chunk's raw logits, its max, sum of exponentials and unnormalised output. Each warp
// takes kUnroll consecutive rows per round and issues all their loads first.
// G >= the group size and V float4 per lane (head_dim <= 128 V) are compile-time so that the
// per-head query and output fragments stay in registers (fully unrolled loops).
template <int G, int V>
__global__ void __launch_bounds__(kDecodeThreads) decode_partial_kernel(DecodeAttentionArgs a) {
  __shared__ float p[G][kChunk];
  __shared__ float reduce[kDecodeWarps][G][V * 128];
  const ChunkBlock b = chunk_block(a);
  const auto [g, split, group, lane, warp, begin, end] = b;
  DecodeScratch sc(a.scratch, a.heads, a.d, a.max_length, a.chunk);
  const float* krows = a.k + static_cast<std::size_t>(g) * a.capacity * a.d;
  const float* vrows = a.v + static_cast<std::size_t>(g) * a.capacity * a.d;
  const std::uint8_t* mask = a.mask ? a.mask + static_cast<std::size_t>(g) * a.capacity : nullptr;
  float4 q[G][V];
  load_queries<G, V>(a, b, q);
  for (int e0 = begin + warp * kUnroll; e0 < end; e0 += kDecodeWarps * kUnroll) {
    float4 kv[kUnroll][V];
    load_rows<V>(krows, e0, end, a.d, lane, kv);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int e = e0 + u;
      if (e >= end) break;
#pragma unroll
      for (int h = 0; h < G; ++h) {
        if (h >= group) break;
        const float logit = warp_sum(lane_dot<V>(q[h], kv[u])) * a.scale;
        if (lane == 0) {
          const float x = (mask && !mask[e]) ? -INFINITY : logit;
          p[h][e - begin] = x;
          sc.logits[static_cast<std::size_t>(g * group + h) * a.max_length + e] = x;
        }
      }
    }
  }
  __syncthreads();
  chunk_softmax<G>(a, b, sc, p);
  __syncthreads();
  float4 o[G][V];
  zero_outputs<G, V>(o);
  for (int e0 = begin + warp * kUnroll; e0 < end; e0 += kDecodeWarps * kUnroll) {
    float4 vv[kUnroll][V];
    load_rows<V>(vrows, e0, end, a.d, lane, vv);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (e0 + u >= end) break;
#pragma unroll
      for (int h = 0; h < G; ++h) {
        const float w = h < group ? p[h][e0 + u - begin] : 0.0f;
        add_scaled<V>(o[h], w, vv[u]);
      }
    }
  }
#pragma unroll
  for (int h = 0; h < G; ++h)
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const int c = (v * kWarp + lane) * 4;
      if (h >= group || c >= a.d) continue;
      reduce[warp][h][c] = o[h][v].x, reduce[warp][h][c + 1] = o[h][v].y;
      reduce[warp][h][c + 2] = o[h][v].z, reduce[warp][h][c + 3] = o[h][v].w;
    }
  __syncthreads();
  sum_warp_outputs<G, V>(a, b, sc, reduce);
}

template <int G>
void launch_partial(const DecodeAttentionArgs& a, int splits, cudaStream_t s) {
  if (a.d <= 128)
    decode_partial_kernel<G, 1><<<dim3(a.kv_heads, splits), kDecodeThreads, 0, s>>>(a);
  else
    decode_partial_kernel<G, 2><<<dim3(a.kv_heads, splits), kDecodeThreads, 0, s>>>(a);
}

// One block per query head: combines the chunks (flash-decoding's log-sum-exp merge).
__global__ void decode_reduce_kernel(DecodeAttentionArgs a, int splits) {
  const int h = blockIdx.x;
  DecodeScratch sc(a.scratch, a.heads, a.d, a.max_length, a.chunk);
  float m = -INFINITY;
  for (int s = 0; s < splits; ++s) m = fmaxf(m, sc.part_max[s * a.heads + h]);
  float total = 0;
  for (int s = 0; s < splits; ++s) {
    const float ms = sc.part_max[s * a.heads + h];
    if (ms != -INFINITY) total += sc.part_sum[s * a.heads + h] * expf(ms - m);
  }
  for (int c = threadIdx.x; c < a.d; c += blockDim.x) {
    float acc = 0;
    for (int s = 0; s < splits; ++s) {
      const float ms = sc.part_max[s * a.heads + h];
      if (ms != -INFINITY)
        acc += sc.part_out[(static_cast<std::size_t>(s) * a.heads + h) * a.d + c] * expf(ms - m);
    }
    a.out[h * a.d + c] = acc / total;
  }
  if (threadIdx.x == 0) sc.lse[h] = m + logf(total);
}

__global__ void decode_probs_kernel(DecodeAttentionArgs a) {
  const int h = blockIdx.x, group = a.heads / a.kv_heads;
  const int e = blockIdx.y * blockDim.x + threadIdx.x;
  if (e >= a.lengths[h / group]) return;
  DecodeScratch sc(a.scratch, a.heads, a.d, a.max_length, a.chunk);
  const float logit = sc.logits[static_cast<std::size_t>(h) * a.max_length + e];
  a.probs[static_cast<std::size_t>(h) * a.capacity + e] =
      logit == -INFINITY ? 0.0f : expf(logit - sc.lse[h]);
}

unsigned blocks(std::size_t n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

}  // namespace

void launch_embed(const float* table, const std::int32_t* ids, int rows, int dim, float* out,
                  cudaStream_t s) {
  embed_kernel<<<blocks(static_cast<std::size_t>(rows) * dim, 256), 256, 0, s>>>(table, ids, rows,
                                                                                 dim, out);
  check_launch("embed");
}

void launch_rms_norm(const float* x, const float* w, int rows, int dim, float eps, float* out,
                     cudaStream_t s) {
  rms_norm_kernel<<<rows, 256, 0, s>>>(x, w, dim, eps, out);
  check_launch("rms_norm");
}

void launch_add_bias(float* y, const float* bias, int rows, int n, cudaStream_t s) {
  add_bias_kernel<<<blocks(static_cast<std::size_t>(rows) * n, 256), 256, 0, s>>>(y, bias, rows, n);
  check_launch("add_bias");
}

void launch_rope(float* x, int rows, int heads, int d, const std::int32_t* positions, int axes,
                 const std::int32_t* axis, const float* inv_freq, cudaStream_t s) {
  rope_kernel<<<blocks(static_cast<std::size_t>(rows) * heads * (d / 2), 256), 256, 0, s>>>(
      x, rows, heads, d, positions, axes, axis, inv_freq);
  check_launch("rope");
}

void launch_swiglu(const float* gate, const float* up, std::size_t n, float* out, cudaStream_t s) {
  swiglu_kernel<<<blocks(n, 256), 256, 0, s>>>(gate, up, n, out);
  check_launch("swiglu");
}

void launch_add(float* x, const float* y, std::size_t n, cudaStream_t s) {
  add_kernel<<<blocks(n, 256), 256, 0, s>>>(x, y, n);
  check_launch("add");
}

void launch_causal_softmax(float* scores, int rows, int cols, cudaStream_t s) {
  causal_softmax_kernel<<<rows, 256, 0, s>>>(scores, cols);
  check_launch("causal_softmax");
}

void launch_gather_rows(const float* rows, const std::int32_t* index, int n, int d, float* out,
                        cudaStream_t s) {
  if (n == 0) return;
  gather_rows_kernel<<<blocks(static_cast<std::size_t>(n) * d, 256), 256, 0, s>>>(rows, index, n, d,
                                                                                  out);
  check_launch("gather_rows");
}

std::size_t decode_attention_scratch_floats(int heads, int d, int max_length) {
  const std::size_t splits = (max_length + kMinChunk - 1) / kMinChunk;  // the most splits
  return static_cast<std::size_t>(heads) * max_length + 2 * splits * heads + splits * heads * d +
         heads;
}

// Entries per block: enough blocks to fill every SM twice, within [kMinChunk, kChunk].
int choose_chunk(int kv_heads, int max_length) {
  static int sms = [] {
    int device = 0, count = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
    return count > 0 ? count : 100;
  }();
  const long per_block = (static_cast<long>(max_length) * kv_heads + 2 * sms - 1) / (2 * sms);
  const int rounded = static_cast<int>((per_block + kMinChunk - 1) / kMinChunk * kMinChunk);
  return std::max(kMinChunk, std::min(kChunk, rounded));
}

void launch_decode_attention(const DecodeAttentionArgs& args, cudaStream_t s) {
  DecodeAttentionArgs a = args;
  a.chunk = choose_chunk(a.kv_heads, a.max_length);
  const int group = a.heads / a.kv_heads;
  if (group > kMaxGroup || a.d > kMaxVec * 128 || a.d % 4 != 0)
    throw std::invalid_argument("decode attention supports up to " + std::to_string(kMaxGroup) +
                                " query heads per KV head and head_dim <= " +
                                std::to_string(kMaxVec * 128) + ", a multiple of 4");
  const int splits = (a.max_length + a.chunk - 1) / a.chunk;
  if (group == 1)
    launch_partial<1>(a, splits, s);
  else if (group == 2)
    launch_partial<2>(a, splits, s);
  else if (group <= 4)
    launch_partial<4>(a, splits, s);
  else
    launch_partial<8>(a, splits, s);
  check_launch("decode_partial");
  decode_reduce_kernel<<<a.heads, 128, 0, s>>>(a, splits);
  check_launch("decode_reduce");
  if (a.probs) {
    decode_probs_kernel<<<dim3(a.heads, blocks(a.max_length, 256)), 256, 0, s>>>(a);
    check_launch("decode_probs");
  }
}

}  // namespace kvsim::gpu
