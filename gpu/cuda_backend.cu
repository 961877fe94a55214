// The CUDA backend, built as a loadable module (libkvsim_cuda.so) so that kvsim starts without
// loading the CUDA runtime and runs on machines without one. cuBLAS for the matrix products,
// gpu/kernels.cu for the rest. The KV cache is one device buffer per tensor holding, per (layer,
// KV head), `capacity` rows of which the first lengths[] are live: eviction compacts rows in
// place (gather), merging overwrites a row. Capacity is reserved up front (P + decode steps);
// the reported KV memory counts live rows, what a paged allocator would hold.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu/kernels.cuh"
#include "sim/live/backend.hpp"

namespace kvsim::live {

namespace {

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
}
void cublas_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cuBLAS: ") + what + " failed with status " +
                             std::to_string(static_cast<int>(s)));
}

// A device buffer that grows on demand (small per-call uploads: ids, positions, indices).
template <typename T>
struct DeviceScratch {
  T* ptr = nullptr;
  std::size_t size = 0;
  T* get(std::size_t n) {
    if (n > size) {
      if (ptr) cudaFree(ptr);
      cuda_check(cudaMalloc(&ptr, n * sizeof(T)), "scratch allocation");
      size = n;
    }
    return ptr;
  }
  T* upload(const T* host, std::size_t n) {
    T* p = get(std::max<std::size_t>(n, 1));
    cuda_check(cudaMemcpy(p, host, n * sizeof(T), cudaMemcpyHostToDevice), "upload");
    return p;
  }
  ~DeviceScratch() {
    if (ptr) cudaFree(ptr);
  }
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
      throw std::runtime_error("no CUDA device is visible");
    // Current for this host thread, which makes every later call (backend.hpp).
    cuda_check(cudaSetDevice(device % count), "cudaSetDevice");
    cublas_check(cublasCreate(&blas_), "cublasCreate");
  }
  ~CudaBackend() override {
    free_cache();
    cublasDestroy(blas_);
  }
  std::string name() const override { return "cuda"; }

  float* alloc(std::size_t n) override {
    float* p = nullptr;
    cuda_check(cudaMalloc(&p, std::max<std::size_t>(n, 1) * sizeof(float)), "cudaMalloc");
    cuda_check(cudaMemset(p, 0, n * sizeof(float)), "cudaMemset");
    return p;
  }
  void release(float* p) override { cudaFree(p); }
  void upload(float* dst, const float* host, std::size_t n) override {
    cuda_check(cudaMemcpy(dst, host, n * sizeof(float), cudaMemcpyHostToDevice), "upload");
  }
  void download(float* host, const float* src, std::size_t n) override {
    cuda_check(cudaMemcpy(host, src, n * sizeof(float), cudaMemcpyDeviceToHost), "download");
  }
  void synchronize() override { cuda_check(cudaDeviceSynchronize(), "synchronize"); }

  void embed(const float* table, const std::int32_t* ids, int rows, int dim, float* out) override {
    gpu::launch_embed(table, ints_.upload(ids, rows), rows, dim, out, 0);
  }
  void rms_norm(const float* x, const float* w, int rows, int dim, float eps, float* out) override {
    gpu::launch_rms_norm(x, w, rows, dim, eps, out, 0);
  }
  void linear(const float* x, int rows, int k, const float* w, int n, const float* bias,
              float* y) override {
    // Row-major y[rows, n] = x W^T is column-major y^T = W^T(col) x^T: W (k x n col-major) ^T.
    const float one = 1.0f, zero = 0.0f;
    cublas_check(
        cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, n, rows, k, &one, w, k, x, k, &zero, y, n),
        "linear");
    if (bias) gpu::launch_add_bias(y, bias, rows, n, 0);
  }
  void rope(float* x, int rows, int heads, int d, const std::int32_t* positions, int axes,
            const std::int32_t* axis, const float* inv_freq) override {
    float* freq = floats_.upload(inv_freq, d / 2);
    if (!axis) {  // plain RoPE: the positions as they are, no host copy on the decode path
      gpu::launch_rope(x, rows, heads, d,
                       ints_.upload(positions, static_cast<std::size_t>(rows) * axes), axes,
                       nullptr, freq, 0);
      return;
    }
    // M-RoPE: one upload of positions and axis (the staging buffer is reused per call).
    std::vector<std::int32_t> ints(positions, positions + static_cast<std::size_t>(rows) * axes);
    ints.insert(ints.end(), axis, axis + d / 2);
    const std::int32_t* dev = ints_.upload(ints.data(), ints.size());
    gpu::launch_rope(x, rows, heads, d, dev, axes, dev + rows * axes, freq, 0);
  }
  void swiglu(const float* gate, const float* up, std::size_t n, float* out) override {
    gpu::launch_swiglu(gate, up, n, out, 0);
  }
  void add(float* x, const float* y, std::size_t n) override { gpu::launch_add(x, y, n, 0); }

  void causal_attention(const float* q, const float* k, const float* v, int P, int H, int Hkv,
                        int d, float scale, float* out) override {
    // Per head: S = scale Q_h K_g^T (cuBLAS), causal softmax, O_h = S V_g (cuBLAS). One [P, P]
    // score matrix at a time.
    float* scores = scores_.get(static_cast<std::size_t>(P) * P);
    const float one = 1.0f, zero = 0.0f;
    const int group = H / Hkv;
    for (int h = 0; h < H; ++h) {
      const float* qh = q + static_cast<std::size_t>(h) * d;
      const float* kg = k + static_cast<std::size_t>(h / group) * d;
      const float* vg = v + static_cast<std::size_t>(h / group) * d;
      cublas_check(cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, P, P, d, &scale, kg, Hkv * d, qh,
                               H * d, &zero, scores, P),
                   "prefill scores");
      gpu::launch_causal_softmax(scores, P, P, 0);
      cublas_check(cublasSgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_N, d, P, P, &one, vg, Hkv * d, scores,
                               P, &zero, out + static_cast<std::size_t>(h) * d, H * d),
                   "prefill output");
    }
  }

  void cache_reset(int layers, int kv_heads, int d, int capacity) override {
    free_cache();
    layers_ = layers, kv_heads_ = kv_heads, d_ = d, capacity_ = capacity;
    const std::size_t n = static_cast<std::size_t>(layers) * kv_heads * capacity * d;
    k_ = alloc(n);
    v_ = alloc(n);
    lengths_.assign(static_cast<std::size_t>(layers) * kv_heads, 0);
  }
  void cache_assign(int layer, int g, const float* k, const float* v, int n,
                    std::size_t stride) override {
    check_capacity(n, layer, g);
    std::vector<float> kk(static_cast<std::size_t>(n) * d_), vv(kk.size());
    for (int r = 0; r < n; ++r)
      for (int i = 0; i < d_; ++i)
        kk[r * d_ + i] = k[r * stride + i], vv[r * d_ + i] = v[r * stride + i];
    upload(row(k_, layer, g, 0), kk.data(), kk.size());
    upload(row(v_, layer, g, 0), vv.data(), vv.size());
    length(layer, g) = n;
  }
  void cache_append(int layer, int g, const float* k, const float* v) override {
    int& n = length(layer, g);
    check_capacity(n + 1, layer, g);
    cuda_check(cudaMemcpy(row(k_, layer, g, n), k, d_ * sizeof(float), cudaMemcpyDeviceToDevice),
               "append key");
    cuda_check(cudaMemcpy(row(v_, layer, g, n), v, d_ * sizeof(float), cudaMemcpyDeviceToDevice),
               "append value");
    ++n;
  }
  void cache_keep(int layer, int g, const std::vector<int>& rows) override {
    const int n = static_cast<int>(rows.size());
    std::vector<std::int32_t> index(rows.begin(), rows.end());
    const std::int32_t* dev_index = ints_.upload(index.data(), index.size());
    float* tmp = gather_.get(static_cast<std::size_t>(std::max(n, 1)) * d_);
    for (float* base : {k_, v_}) {
      gpu::launch_gather_rows(row(base, layer, g, 0), dev_index, n, d_, tmp, 0);
      cuda_check(
          cudaMemcpy(row(base, layer, g, 0), tmp, static_cast<std::size_t>(n) * d_ * sizeof(float),
                     cudaMemcpyDeviceToDevice),
          "compaction");
    }
    length(layer, g) = n;
  }
  void cache_write(int layer, int g, int e, const float* k, const float* v) override {
    upload(row(k_, layer, g, e), k, d_);
    upload(row(v_, layer, g, e), v, d_);
  }
  void cache_read(int layer, int g, int e, float* k, float* v) const override {
    cuda_check(cudaMemcpy(k, row(k_, layer, g, e), d_ * sizeof(float), cudaMemcpyDeviceToHost),
               "read key");
    cuda_check(cudaMemcpy(v, row(v_, layer, g, e), d_ * sizeof(float), cudaMemcpyDeviceToHost),
               "read value");
  }
  int cache_rows(int layer, int g) const override {
    return lengths_[static_cast<std::size_t>(layer) * kv_heads_ + g];
  }

  void decode_attention(int layer, const float* q, int H, float scale,
                        const std::vector<std::vector<std::uint8_t>>& attended, float* out,
                        std::vector<std::vector<float>>& probs) override {
    const int group = H / kv_heads_;
    int max_len = 1;
    for (int g = 0; g < kv_heads_; ++g) max_len = std::max(max_len, cache_rows(layer, g));
    gpu::DecodeAttentionArgs a{};
    a.q = q;
    a.k = row(k_, layer, 0, 0);
    a.v = row(v_, layer, 0, 0);
    a.lengths = ints_.upload(&lengths_[static_cast<std::size_t>(layer) * kv_heads_], kv_heads_);
    a.mask = upload_mask(attended);
    a.heads = H, a.kv_heads = kv_heads_, a.d = d_, a.capacity = capacity_, a.max_length = max_len;
    a.scale = scale;
    a.out = out;
    a.probs = probs_.get(static_cast<std::size_t>(H) * capacity_);
    a.scratch = decode_scratch_.get(gpu::decode_attention_scratch_floats(H, d_, max_len));
    gpu::launch_decode_attention(a, 0);
    host_probs_.resize(static_cast<std::size_t>(H) * capacity_);
    cuda_check(cudaMemcpy(host_probs_.data(), a.probs, host_probs_.size() * sizeof(float),
                          cudaMemcpyDeviceToHost),
               "decode probabilities");
    probs.resize(kv_heads_);
    for (int g = 0; g < kv_heads_; ++g) {
      const int n = cache_rows(layer, g);
      probs[g].resize(static_cast<std::size_t>(group) * n);
      for (int r = 0; r < group; ++r)
        std::copy_n(&host_probs_[static_cast<std::size_t>(g * group + r) * capacity_], n,
                    &probs[g][static_cast<std::size_t>(r) * n]);
    }
  }

 private:
  float* row(float* base, int layer, int g, int e) const {
    return base + ((static_cast<std::size_t>(layer) * kv_heads_ + g) * capacity_ + e) * d_;
  }
  int& length(int layer, int g) {
    return lengths_[static_cast<std::size_t>(layer) * kv_heads_ + g];
  }
  void check_capacity(int n, int layer, int g) const {
    if (n > capacity_)
      throw std::logic_error("CUDA cache: layer " + std::to_string(layer) + ", KV head " +
                             std::to_string(g) + " would hold " + std::to_string(n) +
                             " rows, capacity " + std::to_string(capacity_));
  }
  const std::uint8_t* upload_mask(const std::vector<std::vector<std::uint8_t>>& attended) {
    bool any = false;
    for (const auto& m : attended) any |= !m.empty();
    if (!any) return nullptr;
    std::vector<std::uint8_t> flat(static_cast<std::size_t>(kv_heads_) * capacity_, 1);
    for (int g = 0; g < static_cast<int>(attended.size()); ++g)
      std::copy(attended[g].begin(), attended[g].end(),
                &flat[static_cast<std::size_t>(g) * capacity_]);
    return mask_.upload(flat.data(), flat.size());
  }
  void free_cache() {
    if (k_) release(k_);
    if (v_) release(v_);
    k_ = v_ = nullptr;
  }

  cublasHandle_t blas_ = nullptr;
  int layers_ = 0, kv_heads_ = 0, d_ = 0, capacity_ = 0;
  float *k_ = nullptr, *v_ = nullptr;
  std::vector<int> lengths_;
  std::vector<float> host_probs_;
  DeviceScratch<std::int32_t> ints_;
  DeviceScratch<std::uint8_t> mask_;
  DeviceScratch<float> floats_, scores_, gather_, probs_, decode_scratch_;
};

}  // namespace

}  // namespace kvsim::live

// The module's entry points, found with dlsym by sim/live/cuda_module.cpp.
extern "C" kvsim::live::Backend* kvsim_cuda_make_backend_on(int device, char* error,
                                                            int error_len) {
  try {
    if (device < 0) throw std::invalid_argument("negative CUDA device index");
    return new kvsim::live::CudaBackend(device);
  } catch (const std::exception& e) {
    std::snprintf(error, error_len, "%s", e.what());
    return nullptr;
  }
}

extern "C" int kvsim_cuda_device_count() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}
