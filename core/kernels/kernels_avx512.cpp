// Built with -mavx512f -mavx512cd -mavx512dq -mavx512bw (CMakeLists.txt); called only where the
// CPU and its OS support AVX-512.
#include "core/kernels/kernels_impl.hpp"

namespace kvsim::kernels {
const Table& table_avx512() {
  static const Table t = make_table<xsimd::avx512bw>("avx512");
  return t;
}
}  // namespace kvsim::kernels
