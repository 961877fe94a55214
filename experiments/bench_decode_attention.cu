// Achieved HBM bandwidth of kvsim's decode attention kernel (gpu/kernels.cu) at batch 1, one
// query token over a KV cache of 1k, 4k and 16k tokens per head. Bandwidth = bytes of K and V
// read / kernel time (the convention of FlashInfer's batch-decode figures), against the nominal
// peak and the read bandwidth measured on the device in the same run. Needs a GPU:
//   kvsim_gpu_bench [--peak-gbs 3350] [--heads 32] [--kv-heads 8] [--head-dim 128]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "gpu/kernels.cuh"

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "kvsim_gpu_bench: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

float* device_random(std::size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> host(n);
  for (auto& x : host) x = d(rng);
  float* p = nullptr;
  check(cudaMalloc(&p, n * sizeof(float)), "cudaMalloc");
  check(cudaMemcpy(p, host.data(), n * sizeof(float), cudaMemcpyHostToDevice), "upload");
  return p;
}

// Streams a buffer once (float4 loads, grid-stride): the device's achievable read bandwidth, the
// reference the attention kernel's figures are compared with. The sum is stored only if it takes
// an impossible value, which keeps the loads without a reduction.
__global__ void read_everything(const float4* __restrict__ x, std::size_t n, float* sink) {
  float acc = 0.0f;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float4 v = x[i];
    acc += v.x + v.y + v.z + v.w;
  }
  if (acc == 1234.5f) sink[0] = acc;
}

double measured_read_gbs() {
  const std::size_t bytes = std::size_t{1} << 30, n = bytes / sizeof(float4);
  float4* x = nullptr;
  float* sink = nullptr;
  check(cudaMalloc(&x, bytes), "cudaMalloc (read bandwidth)");
  check(cudaMemset(x, 0, bytes), "cudaMemset");
  check(cudaMalloc(&sink, sizeof(float)), "cudaMalloc");
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "SM count");
  for (int w = 0; w < 3; ++w) read_everything<<<sms * 8, 256>>>(x, n, sink);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  const int iters = 20;
  cudaEventRecord(start);
  for (int it = 0; it < iters; ++it) read_everything<<<sms * 8, 256>>>(x, n, sink);
  cudaEventRecord(stop);
  check(cudaEventSynchronize(stop), "read bandwidth");
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaFree(x);
  cudaFree(sink);
  return static_cast<double>(bytes) * iters / (ms / 1000.0) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  double peak_gbs = 3350;
  int H = 32, Hkv = 8, d = 128;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--peak-gbs")) peak_gbs = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--heads")) H = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--kv-heads")) Hkv = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--head-dim")) d = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: %s [--peak-gbs G] [--heads H] [--kv-heads K] [--head-dim D]\n",
                   argv[0]);
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "kvsim_gpu_bench: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop;
  check(cudaGetDeviceProperties(&prop, 0), "properties");
  const double read_gbs = measured_read_gbs();
  std::printf(
      "device,%s\nheads,%d,kv_heads,%d,head_dim,%d,kv_dtype,float32,peak_gbs,%.0f,"
      "measured_read_gbs,%.0f\n",
      prop.name, H, Hkv, d, peak_gbs, read_gbs);
  std::printf("tokens,probs,us_per_call,kv_bytes,gbs,percent_of_peak,percent_of_measured_read\n");
  std::mt19937 rng(1);
  for (int n : {1024, 4096, 16384}) {
    const std::size_t rows = static_cast<std::size_t>(Hkv) * n * d;
    float *k = device_random(rows, rng), *v = device_random(rows, rng),
          *q = device_random(static_cast<std::size_t>(H) * d, rng), *out = nullptr, *probs = nullptr,
          *scratch = nullptr;
    std::int32_t* lengths = nullptr;
    std::vector<std::int32_t> host_len(Hkv, n);
    check(cudaMalloc(&out, H * d * sizeof(float)), "out");
    check(cudaMalloc(&probs, static_cast<std::size_t>(H) * n * sizeof(float)), "probs");
    check(cudaMalloc(&scratch,
                     kvsim::gpu::decode_attention_scratch_floats(H, d, n) * sizeof(float)),
          "scratch");
    check(cudaMalloc(&lengths, Hkv * sizeof(std::int32_t)), "lengths");
    check(cudaMemcpy(lengths, host_len.data(), Hkv * sizeof(std::int32_t),
                     cudaMemcpyHostToDevice),
          "lengths");
    for (bool with_probs : {false, true}) {
      kvsim::gpu::DecodeAttentionArgs a{q, k, v, lengths, nullptr, H, Hkv, d, n, n,
                                        0.08838834764f, out, with_probs ? probs : nullptr,
                                        scratch};
      for (int w = 0; w < 20; ++w) kvsim::gpu::launch_decode_attention(a, 0);
      cudaEvent_t start, stop;
      cudaEventCreate(&start);
      cudaEventCreate(&stop);
      const int iters = 200;
      cudaEventRecord(start);
      for (int it = 0; it < iters; ++it) kvsim::gpu::launch_decode_attention(a, 0);
      cudaEventRecord(stop);
      check(cudaEventSynchronize(stop), "timing");
      float ms = 0;
      cudaEventElapsedTime(&ms, start, stop);
      const double seconds = ms / 1000.0 / iters;
      const double bytes = 2.0 * rows * sizeof(float);
      const double gbs = bytes / seconds / 1e9;
      std::printf("%d,%d,%.2f,%.0f,%.1f,%.1f,%.1f\n", n, with_probs ? 1 : 0, seconds * 1e6, bytes,
                  gbs, 100.0 * gbs / peak_gbs, 100.0 * gbs / read_gbs);
    }
    for (void* p : {static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(q),
                    static_cast<void*>(out), static_cast<void*>(probs),
                    static_cast<void*>(scratch), static_cast<void*>(lengths)})
      cudaFree(p);
  }
  return 0;
}
