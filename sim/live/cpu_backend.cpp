// The CPU reference backend: scalar loops for everything but the matrix products (OpenBLAS),
// a std::vector per cache head that really shrinks when rows are evicted.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "core/parallel.hpp"
#include "sim/live/backend.hpp"

namespace kvsim::live {

namespace {

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }

  float* alloc(std::size_t n) override { return new float[n](); }
  void release(float* p) override { delete[] p; }
  void upload(float* dst, const float* host, std::size_t n) override {
    std::memcpy(dst, host, n * sizeof(float));
  }
  void download(float* host, const float* src, std::size_t n) override {
    std::memcpy(host, src, n * sizeof(float));
  }

  void embed(const float* table, const std::int32_t* ids, int rows, int dim, float* out) override {
    for (int r = 0; r < rows; ++r)
      std::memcpy(out + static_cast<std::size_t>(r) * dim,
                  table + static_cast<std::size_t>(ids[r]) * dim, dim * sizeof(float));
  }

  void rms_norm(const float* x, const float* w, int rows, int dim, float eps, float* out) override {
    for (int r = 0; r < rows; ++r) {
      const float* xr = x + static_cast<std::size_t>(r) * dim;
      double ss = 0;
      for (int i = 0; i < dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
      const float inv = static_cast<float>(1.0 / std::sqrt(ss / dim + eps));
      for (int i = 0; i < dim; ++i) out[static_cast<std::size_t>(r) * dim + i] = xr[i] * inv * w[i];
    }
  }

  // OpenBLAS's own threads split a product differently with their number (and kvsim's statistics
  // set that number to 1 process-wide), which made a sample's bits depend on the machine and on
  // the samples run before it. So OpenBLAS runs single-threaded on fixed blocks of output features
  // and kvsim's threads share the blocks: the same calls for any thread count, the same bytes
  // (and, measured on the live demo, 44 s instead of 54 s for `evaluate` on 2 cores).
  void linear(const float* x, int rows, int k, const float* w, int n, const float* bias,
              float* y) override {
    openblas_set_num_threads(1);
    constexpr int kBlock = 128;
    parallel_for((n + kBlock - 1) / kBlock, threads_, [&](int b) {
      const int j0 = b * kBlock, nb = std::min(kBlock, n - j0);
      const float* wb = w + static_cast<std::size_t>(j0) * k;
      if (rows == 1)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, nb, k, 1.0f, wb, k, x, 1, 0.0f, y + j0, 1);
      else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, nb, k, 1.0f, x, k, wb, k, 0.0f,
                    y + j0, n);
    });
    if (bias)
      for (int r = 0; r < rows; ++r)
        for (int j = 0; j < n; ++j) y[static_cast<std::size_t>(r) * n + j] += bias[j];
  }

  void rope(float* x, int rows, int heads, int d, const std::int32_t* positions, int axes,
            const std::int32_t* axis, const float* inv_freq) override {
    const int half = d / 2;
    for (int r = 0; r < rows; ++r)
      for (int i = 0; i < half; ++i) {
        // transformers computes the angle in float32; so does this.
        const std::int32_t position = positions[r * axes + (axis ? axis[i] : 0)];
        const float angle = static_cast<float>(position) * inv_freq[i];
        const float c = std::cos(angle), s = std::sin(angle);
        for (int h = 0; h < heads; ++h) {
          float* v = x + (static_cast<std::size_t>(r) * heads + h) * d;
          const float a = v[i], b = v[i + half];
          v[i] = a * c - b * s;
          v[i + half] = b * c + a * s;
        }
      }
  }

  void swiglu(const float* gate, const float* up, std::size_t n, float* out) override {
    for (std::size_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
  }

  void add(float* x, const float* y, std::size_t n) override {
    for (std::size_t i = 0; i < n; ++i) x[i] += y[i];
  }

  void causal_attention(const float* q, const float* k, const float* v, int P, int H, int Hkv,
                        int d, float scale, float* out) override {
    const int group = H / Hkv;
    std::vector<float> p(P);
    for (int h = 0; h < H; ++h) {
      const int g = h / group;
      for (int i = 0; i < P; ++i) {
        const float* qi = q + (static_cast<std::size_t>(i) * H + h) * d;
        float mx = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          p[j] = scale * dot(qi, k + (static_cast<std::size_t>(j) * Hkv + g) * d, d);
          mx = std::max(mx, p[j]);
        }
        double sum = 0;
        for (int j = 0; j <= i; ++j) sum += p[j] = std::exp(p[j] - mx);
        float* o = out + (static_cast<std::size_t>(i) * H + h) * d;
        std::fill(o, o + d, 0.0f);
        for (int j = 0; j <= i; ++j) {
          const float w = static_cast<float>(p[j] / sum);
          const float* vj = v + (static_cast<std::size_t>(j) * Hkv + g) * d;
          for (int e = 0; e < d; ++e) o[e] += w * vj[e];
        }
      }
    }
  }

  void cache_reset(int layers, int kv_heads, int d, int capacity) override {
    d_ = d;
    kv_heads_ = kv_heads;
    heads_.assign(static_cast<std::size_t>(layers) * kv_heads, Head{});
  }
  void cache_assign(int layer, int g, const float* k, const float* v, int n,
                    std::size_t stride) override {
    Head& h = head(layer, g);
    h.k.resize(static_cast<std::size_t>(n) * d_);
    h.v.resize(static_cast<std::size_t>(n) * d_);
    for (int r = 0; r < n; ++r) {
      std::memcpy(&h.k[static_cast<std::size_t>(r) * d_], k + r * stride, d_ * sizeof(float));
      std::memcpy(&h.v[static_cast<std::size_t>(r) * d_], v + r * stride, d_ * sizeof(float));
    }
  }
  void cache_append(int layer, int g, const float* k, const float* v) override {
    Head& h = head(layer, g);
    h.k.insert(h.k.end(), k, k + d_);
    h.v.insert(h.v.end(), v, v + d_);
  }
  void cache_keep(int layer, int g, const std::vector<int>& rows) override {
    Head& h = head(layer, g);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      std::memmove(&h.k[i * d_], &h.k[static_cast<std::size_t>(rows[i]) * d_], d_ * sizeof(float));
      std::memmove(&h.v[i * d_], &h.v[static_cast<std::size_t>(rows[i]) * d_], d_ * sizeof(float));
    }
    h.k.resize(rows.size() * d_);
    h.v.resize(rows.size() * d_);
  }
  void cache_write(int layer, int g, int e, const float* k, const float* v) override {
    Head& h = head(layer, g);
    std::memcpy(&h.k[static_cast<std::size_t>(e) * d_], k, d_ * sizeof(float));
    std::memcpy(&h.v[static_cast<std::size_t>(e) * d_], v, d_ * sizeof(float));
  }
  void cache_read(int layer, int g, int e, float* k, float* v) const override {
    const Head& h = head(layer, g);
    std::memcpy(k, &h.k[static_cast<std::size_t>(e) * d_], d_ * sizeof(float));
    std::memcpy(v, &h.v[static_cast<std::size_t>(e) * d_], d_ * sizeof(float));
  }
  int cache_rows(int layer, int g) const override {
    return static_cast<int>(heads_[static_cast<std::size_t>(layer) * kv_heads_ + g].k.size() / d_);
  }

  void decode_attention(int layer, const float* q, int H, float scale,
                        const std::vector<std::vector<std::uint8_t>>& attended, float* out,
                        std::vector<std::vector<float>>& probs) override {
    const int group = H / kv_heads_;
    probs.resize(kv_heads_);
    for (int g = 0; g < kv_heads_; ++g) {
      const Head& hd = head(layer, g);
      const int n = cache_rows(layer, g);
      const bool masked = !attended.empty() && !attended[g].empty();
      probs[g].assign(static_cast<std::size_t>(group) * n, 0.0f);
      for (int r = 0; r < group; ++r) {
        const int h = g * group + r;
        float* p = &probs[g][static_cast<std::size_t>(r) * n];
        float mx = -INFINITY;
        for (int e = 0; e < n; ++e)
          if (!masked || attended[g][e]) {
            p[e] = scale * dot(q + static_cast<std::size_t>(h) * d_, &hd.k[e * d_], d_);
            mx = std::max(mx, p[e]);
          }
        double sum = 0;
        for (int e = 0; e < n; ++e)
          if (!masked || attended[g][e]) sum += p[e] = std::exp(p[e] - mx);
        float* o = out + static_cast<std::size_t>(h) * d_;
        std::fill(o, o + d_, 0.0f);
        for (int e = 0; e < n; ++e) {
          if (masked && !attended[g][e]) continue;
          p[e] = static_cast<float>(p[e] / sum);
          for (int i = 0; i < d_; ++i) o[i] += p[e] * hd.v[static_cast<std::size_t>(e) * d_ + i];
        }
      }
    }
  }

 private:
  struct Head {
    std::vector<float> k, v;  // [rows, d]
  };
  static float dot(const float* a, const float* b, int d) {
    float s = 0;
    for (int i = 0; i < d; ++i) s += a[i] * b[i];
    return s;
  }
  Head& head(int layer, int g) { return heads_[static_cast<std::size_t>(layer) * kv_heads_ + g]; }
  const Head& head(int layer, int g) const {
    return heads_[static_cast<std::size_t>(layer) * kv_heads_ + g];
  }
  int d_ = 0, kv_heads_ = 0;
  std::vector<Head> heads_;
  int threads_ = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() {
  return std::make_unique<CpuBackend>();
}

std::unique_ptr<Backend> make_backend(const std::string& name, int device) {
  if (name == "cpu") return make_cpu_backend();
  if (name == "cuda") return make_cuda_backend(device);
  throw std::invalid_argument("backend '" + name + "' is unknown (cpu, cuda)");
}

}  // namespace kvsim::live
