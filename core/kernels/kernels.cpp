#include "core/kernels/kernels.hpp"

#include <cstdlib>
#include <stdexcept>

namespace kvsim::kernels {

const Table& table_baseline();
#if defined(KVSIM_X86_KERNELS)
const Table& table_avx2();
const Table& table_avx512();
#endif

namespace {

struct Isa {
  const char* name;
  const Table& (*table)();
  bool (*cpu_has)();
};

// __builtin_cpu_supports reads CPUID and, for AVX and AVX-512, whether the OS saves their
// registers (XGETBV), so a kernel is never chosen where it would fault.
const Isa kIsas[] = {
    {"baseline", &table_baseline, [] { return true; }},
#if defined(KVSIM_X86_KERNELS)
    {"avx2", &table_avx2,
     [] { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }},
    {"avx512", &table_avx512,
     [] {
       return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
              __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw");
     }},
#endif
};

void cpu_init() {
#if defined(KVSIM_X86_KERNELS)
  __builtin_cpu_init();
#endif
}

const Table& choose() {
  cpu_init();
  const char* wanted = std::getenv("KVSIM_SIMD");
  if (wanted && *wanted) {
    for (const Isa& isa : kIsas)
      if (std::string(isa.name) == wanted) {
        if (!isa.cpu_has())
          throw std::runtime_error(std::string("KVSIM_SIMD=") + wanted +
                                   ": this CPU does not support that instruction set");
        return isa.table();
      }
    throw std::runtime_error(std::string("KVSIM_SIMD=") + wanted +
                             ": unknown instruction set (baseline, avx2 or avx512)");
  }
  const Table* best = nullptr;
  for (const Isa& isa : kIsas)
    if (isa.cpu_has()) best = &isa.table();
  return *best;
}

}  // namespace

const Table& active() {
  static const Table& t = choose();
  return t;
}

std::vector<const Table*> supported() {
  cpu_init();
  std::vector<const Table*> out;
  for (const Isa& isa : kIsas)
    if (isa.cpu_has()) out.push_back(&isa.table());
  return out;
}

std::vector<std::string> compiled() {
  std::vector<std::string> out;
  for (const Isa& isa : kIsas) out.push_back(isa.name);
  return out;
}

}  // namespace kvsim::kernels
