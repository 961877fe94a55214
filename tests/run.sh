#!/usr/bin/env bash
# Builds kvsim and its tests (Release) and runs the whole suite with ctest; then builds the
# GoogleTest suite a second time under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/,
# -O1) and runs it again. KVSIM_SKIP_SANITIZERS=1 skips the second pass.
set -euo pipefail
cd "$(dirname "$0")/.."
./install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
ctest --test-dir build --output-on-failure -j"$(nproc)"

[ "${KVSIM_SKIP_SANITIZERS:-0}" = 1 ] && exit 0
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-O1 \
  -DCMAKE_C_FLAGS_DEBUG=-O1 -DKVSIM_SANITIZE=address,undefined -DKVSIM_PYTHON=OFF \
  -DKVSIM_BENCH=OFF -DKVSIM_CUDA=OFF >/dev/null
cmake --build build-asan -j"$(nproc)" --target kvsim kvsim_tests
# Leaks are reported too (nothing is suppressed; only the mpirun test's ranks skip leak checking,
# since OpenMPI unloads its plugins before exit).
export ASAN_OPTIONS="detect_leaks=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
ctest --test-dir build-asan --output-on-failure -j"$(nproc)"
