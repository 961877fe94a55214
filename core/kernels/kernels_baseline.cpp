// The instruction set every CPU of the target has (SSE2 on x86-64), built with the project's
// default flags.
#include "core/kernels/kernels_impl.hpp"

namespace kvsim::kernels {
const Table& table_baseline() {
  static const Table t = make_table<xsimd::default_arch>("baseline");
  return t;
}
}  // namespace kvsim::kernels
