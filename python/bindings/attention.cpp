// Causal attention of packed sequences for training the assembled VLM's decoder
// (core/causal_attention.hpp), on numpy arrays; python/kvsim/vlm/attention.py wraps it as a
// torch autograd function. Beside it, what that training sets and records of the machine: the
// kernels' instruction set (simd) and OpenBLAS's thread count (blas_threads).
#include <cstdint>
#include <string>

#include "core/causal_attention.hpp"
#include "core/kernels/kernels.hpp"
#include "python/bindings/common.hpp"

namespace kvsim::python {

namespace {

using Floats = py::array_t<float, py::array::c_style | py::array::forcecast>;
using Bounds = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>;

// The shape of q [tokens, heads, dim] and k, v [tokens, kv_heads, dim] with the items' bounds;
// ValueError naming what disagrees.
PackedAttention shape_of(const Floats& q, const Floats& k, const Floats& v, const Bounds& bounds) {
  if (q.ndim() != 3 || k.ndim() != 3 || v.ndim() != 3)
    throw py::value_error("causal_attention: q, k and v must be [tokens, heads, dim]");
  if (bounds.ndim() != 1 || bounds.shape(0) < 1)
    throw py::value_error("causal_attention: bounds must be [items + 1] token offsets");
  PackedAttention s{static_cast<int>(q.shape(0)),
                    static_cast<int>(q.shape(1)),
                    static_cast<int>(k.shape(1)),
                    static_cast<int>(q.shape(2)),
                    bounds.data(),
                    static_cast<int>(bounds.shape(0)) - 1};
  for (const auto* a : {&k, &v})
    if (a->shape(0) != s.tokens || a->shape(1) != s.kv_heads || a->shape(2) != s.dim)
      throw py::value_error(std::string("causal_attention: ") + (a == &k ? "k" : "v") +
                            " is not [tokens, kv_heads, dim] of q's tokens and dim");
  try {
    s.check();
  } catch (const std::invalid_argument& e) {
    throw py::value_error(e.what());
  }
  return s;
}

Floats like(const Floats& a) {
  return Floats({a.shape(0), a.shape(1), a.shape(2)});
}

py::tuple forward(const Floats& q, const Floats& k, const Floats& v, const Bounds& bounds,
                  float scale, int threads) {
  const PackedAttention s = shape_of(q, k, v, bounds);
  Floats out = like(q), lse({q.shape(0), q.shape(1)});
  float *o = out.mutable_data(), *l = lse.mutable_data();
  run_without_gil([&] {
    causal_attention_forward(s, q.data(), k.data(), v.data(), scale, o, l, thread_count(threads));
  });
  return py::make_tuple(out, lse);
}

py::tuple backward(const Floats& q, const Floats& k, const Floats& v, const Floats& out,
                   const Floats& lse, const Floats& dout, const Bounds& bounds, float scale,
                   int threads) {
  const PackedAttention s = shape_of(q, k, v, bounds);
  if (out.size() != q.size() || dout.size() != q.size() || lse.size() != q.size() / s.dim)
    throw py::value_error("causal_attention: out and dout must be q's shape, lse [tokens, heads]");
  Floats dq = like(q), dk = like(k), dv = like(v);
  float *gq = dq.mutable_data(), *gk = dk.mutable_data(), *gv = dv.mutable_data();
  run_without_gil([&] {
    causal_attention_backward(s, q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(),
                              scale, gq, gk, gv, thread_count(threads));
  });
  return py::make_tuple(dq, dk, dv);
}

}  // namespace

void bind_attention(py::module_& m) {
  m.def(
      "simd", [] { return std::string(kernels::active().name); },
      "The instruction set of the vector kernels in use (baseline, avx2, avx512; KVSIM_SIMD).");
  m.def(
      "blas_threads",
      [](int threads) {
        const int before = openblas_get_num_threads();
        if (threads > 0) openblas_set_num_threads(threads);
        return before;
      },
      py::arg("threads") = 0,
      "Sets OpenBLAS's thread count for the process (threads > 0) and returns the count before.");
  m.def("causal_attention_forward", &forward, py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("bounds"), py::arg("scale"), py::arg("threads") = 0,
        "Causal attention of packed items (item n: tokens bounds[n]..bounds[n+1]-1): (out "
        "[tokens, heads, dim], lse [tokens, heads]).");
  m.def("causal_attention_backward", &backward, py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("out"), py::arg("lse"), py::arg("dout"), py::arg("bounds"), py::arg("scale"),
        py::arg("threads") = 0, "The gradients (dq, dk, dv) of causal_attention_forward.");
}

}  // namespace kvsim::python
