// libFuzzer's entry point for one target, chosen at compile time (KVSIM_FUZZ_TARGET).
#include "tests/fuzz/targets.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  kvsim::fuzz::KVSIM_FUZZ_TARGET(data, size);
  return 0;
}
