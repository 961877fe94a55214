#!/bin/sh
# Everything the live path checks on a GPU machine (the device tool runs this from the repository
# root): build with CUDA, the GPU tests against the CPU reference, the decode-attention bandwidth
# benchmark, PyTorch SDPA on the same shapes, and logits against transformers. Results go to
# ${OUT:-gpu_results}/.
set -eu
out=${OUT:-gpu_results}
mkdir -p "$out"
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DKVSIM_NATIVE=OFF -DKVSIM_MPI=OFF > "$out/cmake.log"
cmake --build build-gpu -j"$(nproc)" > "$out/build.log"
(cd build-gpu && ./kvsim_tests --gtest_filter='Gpu*' | tee "../$out/gpu_tests.txt")
./build-gpu/kvsim_gpu_bench | tee "$out/decode_attention_bandwidth.csv"
./build-gpu/kvsim_gpu_bench --kv-heads 32 | tee "$out/decode_attention_bandwidth_mha.csv"
python3 experiments/live_gpu/bench_sdpa.py | tee "$out/sdpa_bandwidth.csv"
python3 experiments/live_gpu/compare_transformers.py --kvsim build-gpu/kvsim --backend cuda \
  --out "$out/compare_transformers.json"
