// Built with -mavx2 -mfma (CMakeLists.txt); called only where the CPU has both.
#include "core/kernels/kernels_impl.hpp"

namespace kvsim::kernels {
const Table& table_avx2() {
  static const Table t = make_table<xsimd::fma3<xsimd::avx2>>("avx2");
  return t;
}
}  // namespace kvsim::kernels
