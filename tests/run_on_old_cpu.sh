#!/bin/bash
# Runs a kvsim binary on an emulated x86-64 CPU without AVX (qemu-user, CPU model Nehalem):
# synthesises a small trace and replays it through the five baselines, with the dispatched
# kernels on the baseline set; the same replay natively must write the same decisions.
#   run_on_old_cpu.sh KVSIM_BINARY
# Exit 77 (skipped) without qemu-x86_64 (Debian's qemu-user, which ./install-deps.sh installs).
set -euo pipefail
kvsim=$1
command -v qemu-x86_64 >/dev/null || { echo "qemu-x86_64 not found: skipped"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# OpenBLAS picks its kernels from CPUID, and under qemu-user (7.2) it takes the emulated Nehalem
# for a Haswell and dies in sgemm_beta_HASWELL; on a real Nehalem it would choose its Nehalem
# kernels, so it is told that here. kvsim's own code gets no such hint.
old_cpu=(env OPENBLAS_CORETYPE=Nehalem qemu-x86_64 -cpu Nehalem)
# A binary with AVX outside the dispatched kernels dies here with SIGILL (exit 132).
"${old_cpu[@]}" "$kvsim" synth --out "$dir/t.h5" --layers 2 --heads 4 --kv-heads 2 --head-dim 16 \
  --media-tokens 96 --gen-tokens 8 --user-tokens 6 --system-tokens 5 > /dev/null
replay=(replay -t "$dir/t.h5" -p full -p streamingllm -p h2o -p snapkv -p oracle --budget 40 -j 2)
"${old_cpu[@]}" "$kvsim" "${replay[@]}" --dump-decisions "$dir/emulated.h5" > /dev/null
KVSIM_SIMD=baseline "$kvsim" "${replay[@]}" --dump-decisions "$dir/native.h5" > /dev/null
cmp "$dir/emulated.h5" "$dir/native.h5"
# And the kernels really were chosen at run time: asking for AVX2 there must be refused.
if KVSIM_SIMD=avx2 "${old_cpu[@]}" "$kvsim" "${replay[@]}" > "$dir/refused.txt" 2>&1; then
  echo "KVSIM_SIMD=avx2 was accepted on a CPU without AVX2"; exit 1
fi
grep -q "does not support" "$dir/refused.txt"
echo "ran on an emulated CPU without AVX; decisions identical to the native baseline kernels"
