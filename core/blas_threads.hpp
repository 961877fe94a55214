#pragma once
// Restores OpenBLAS's thread count at the end of a scope.

#include <cblas.h>

namespace kvsim {

// kvsim's work sets OpenBLAS's thread count to 1 for the whole process (BLAS runs inside kvsim's
// own threads: a product's bits then never depend on OpenBLAS's split). A process that also uses
// OpenBLAS for itself (PyTorch beside the Python module) must get its own count back, or its
// later products run single-threaded, slower and, with some kernels, with other bits.
class BlasThreadsRestored {
 public:
  BlasThreadsRestored() : threads_(openblas_get_num_threads()) {}
  ~BlasThreadsRestored() { openblas_set_num_threads(threads_); }
  BlasThreadsRestored(const BlasThreadsRestored&) = delete;
  BlasThreadsRestored& operator=(const BlasThreadsRestored&) = delete;

 private:
  int threads_;
};

}  // namespace kvsim
