#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) in build-fuzz/ and runs each for SECONDS.
#   tests/fuzz/run.sh SECONDS [TARGET ...]      (default: every target, 60 s each)
# Corpora grow in build-fuzz/corpus/<target>/ (seeded from tests/fuzz/corpus/<target>/); inputs
# that crash, leak, hit undefined behaviour, allocate more than 2 GiB or time out land in
# build-fuzz/findings/<target>/. Copy each into tests/fuzz/regressions/<target>/ once fixed: the
# ordinary test suite replays them. A line per target goes to build-fuzz/summary.tsv.
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-60}
shift || true
targets=("$@")
((${#targets[@]})) || targets=(safetensors config_json kvtrace kvprompt ini_config cli_values result_table)

./install-deps.sh fuzz
CC=clang CXX=clang++ cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS_DEBUG=-O1 -DCMAKE_C_FLAGS_DEBUG=-O1 -DKVSIM_FUZZ=ON \
  -DKVSIM_SANITIZE=address,undefined -DKVSIM_TESTS=OFF -DKVSIM_BENCH=OFF -DKVSIM_PYTHON=OFF \
  -DKVSIM_CUDA=OFF -DKVSIM_MPI=OFF >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target "${targets[@]/#/kvsim_fuzz_}"

export TMPDIR=${TMPDIR:-/tmp}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
[ -f build-fuzz/summary.tsv ] || printf 'target\tseconds\texecs\tcorpus\tfindings\n' >build-fuzz/summary.tsv
run_target() {
  local t=$1 corpus=build-fuzz/corpus/$1 findings=build-fuzz/findings/$1 log=build-fuzz/$1.log
  mkdir -p "$corpus" "$findings"
  cp -n tests/fuzz/corpus/"$t"/* "$corpus"/ 2>/dev/null || true
  echo "fuzz: $t for ${seconds}s (log $log)"
  # -rss_limit_mb / -malloc_limit_mb: a small input must never need more than 2 GiB.
  build-fuzz/kvsim_fuzz_"$t" "$corpus" -max_total_time="$seconds" -rss_limit_mb=2048 \
    -malloc_limit_mb=2048 -timeout=10 -max_len=4096 -artifact_prefix="$findings"/ \
    -print_final_stats=1 >"$log" 2>&1 || true
  local execs
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  printf '%s\t%s\t%s\t%s\t%s\n' "$t" "$seconds" "${execs:-?}" "$(ls "$corpus" | wc -l)" \
    "$(ls "$findings" | wc -l)" | tee -a build-fuzz/summary.tsv
}
# One target per core at a time (libFuzzer itself is single-threaded).
jobs=${KVSIM_FUZZ_JOBS:-$(nproc)}
for t in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n; done
  run_target "$t" &
done
wait
