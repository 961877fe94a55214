#!/usr/bin/env bash
# The front door: install what is missing, build the kvsim command and the Python module (Release,
# in build/), then compare eviction policies the way kvsim is meant to: on a small synthetic
# multimodal trace of 12 samples (4 layers, 8 heads, d = 64; 144 image tokens of a 180-token
# prompt, 16 generated), every budgeted policy held to 20% of the prompt at every step
# (--equal-memory), means over the samples with their 95% intervals, the self-sizing methods
# apart, and paired tests of each policy against the random floor at the same memory.
# About 30 MB written; the replay takes seconds. experiments/llava_demo.sh is the larger,
# LLaVA-1.5-7B-shaped demo that docs/demo.md describes.
#   experiments/demo.sh [OUT_DIR]    outputs in OUT_DIR (default: demo/ in the current directory)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-demo}  # relative to the caller's directory, not the repository's
"$repo/install-deps.sh"
cmake -S "$repo" -B "$repo/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$repo/build" -j"$(nproc)" --target kvsim _kvsim
kvsim="$repo/build/kvsim"
mkdir -p "$out"
[ -f "$out/small.h5" ] || "$kvsim" synth --out "$out/small.h5" --samples 12 --layers 4 --heads 8 \
  --kv-heads 8 --head-dim 64 --media-tokens 144 --user-tokens 16 --gen 16
# The floors (random over five draws, downsample), the baselines, the lookahead oracle (an upper
# bound, labelled), the multimodal methods; st3, fastv and vtw size their caches themselves.
"$kvsim" replay "$out/small.h5" \
  -p full,random,downsample,streamingllm,h2o,snapkv,pyramidkv,adakv,tova,knorm,oracle \
  -p lookm,hae,madakv,meda,avl,st3,fastv,vtw --set avl.max_new_tokens=16 \
  --set st3.max_new_tokens=16 --budget 20% --equal-memory --summary "$out/summary.csv"
"$kvsim" compare "$out/summary.csv" --metric mean_output_rel_error --reference random \
  -o "$out/compare.csv"
echo "results: $out/summary.csv (per sample and layer; docs/outputs.md), $out/compare.csv"
echo "Python: PYTHONPATH=$repo/build/python /usr/bin/python3 -c 'import kvsim; help(kvsim)'"
