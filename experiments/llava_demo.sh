#!/usr/bin/env bash
# The LLaVA-1.5-7B-shaped demo (docs/demo.md): install what is missing, build Release, make the
# trace (one 640-token sample, 528 MiB), replay it through every policy and print the table.
# experiments/demo.sh is the small front-door demo; this one is what docs/demo.md and
# docs/methods.md describe.
#   experiments/llava_demo.sh [OUT_DIR]    outputs in OUT_DIR (default: demo/ in the current directory)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-demo}  # relative to the caller's directory, not the repository's
"$repo/install-deps.sh"
cmake -S "$repo" -B "$repo/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$repo/build" -j"$(nproc)" --target kvsim
kvsim="$repo/build/kvsim"
mkdir -p "$out"
[ -f "$out/demo.h5" ] || "$kvsim" synth --out "$out/demo.h5"
"$kvsim" inspect "$out/demo.h5"
# The demo's generation limit is 64 tokens (what the synthetic trace generates): A-VL would size its
# text window from it with text_window=limit (its default is the text seen so far), and ST3 would
# set τ = 65 from it with tau=auto (its default is the ablation's τ = 50).
# HAE sizes its cache itself (l = |S_1|, what DAP leaves); with Table 5's RC_size = 64 = G the
# recycle bin would flush once, at the last step, so the demo uses 16 (four flushes).
# The floors every selection must beat run beside them: random (five draws), downsample (a uniform
# grid of the image tokens) and text_only (every image entry evicted after the prefill).
"$kvsim" replay --trace "$out/demo.h5" \
  --policy full --policy random --policy downsample --policy text_only \
  --policy streamingllm --policy h2o --policy snapkv --policy oracle \
  --policy fastv --policy vtw --policy pyramidkv --policy adakv --policy tova --policy lookm \
  --policy hae --policy hae:table1 --policy madakv --policy avl --policy st3 --policy meda \
  --budget 20% --set avl.max_new_tokens=64 --set st3.max_new_tokens=64 --set hae.budget=auto --set hae.rc_size=16 --out "$out/results.csv" --summary "$out/summary.csv" \
  --dump-decisions "$out/decisions.h5"
echo "results: $out/results.csv (per step), $out/results.policies.csv, $out/summary.csv, $out/decisions.h5"
