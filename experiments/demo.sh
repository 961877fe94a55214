#!/usr/bin/env bash
# The main job: install what is missing, build Release, make the demo trace (LLaVA-1.5-7B shape),
# replay it through the baseline policies and print the comparison table. Outputs go to demo/.
set -euo pipefail
cd "$(dirname "$0")/.."
./install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target kvsim
mkdir -p demo
[ -f demo/demo.h5 ] || ./build/kvsim synth --out demo/demo.h5
./build/kvsim inspect demo/demo.h5
# The demo's generation limit is 64 tokens (what the synthetic trace generates): A-VL sizes its text
# window from it and ST3 sets τ above it (τ = 65, its VTA ablation's advice).
# HAE sizes its cache itself (l = |S_1|, what DAP leaves); with Table 5's RC_size = 64 = G the
# recycle bin would flush once, at the last step, so the demo uses 16 (four flushes).
./build/kvsim replay --trace demo/demo.h5 \
  --policy full --policy streamingllm --policy h2o --policy snapkv --policy oracle \
  --policy fastv --policy vtw --policy pyramidkv --policy adakv --policy tova --policy lookm \
  --policy hae --policy hae:table1 --policy madakv --policy avl --policy st3 --policy meda \
  --budget 20% --set avl.max_new_tokens=64 --set st3.max_new_tokens=64 --set hae.budget=auto --set hae.rc_size=16 --out demo/results.csv --summary demo/summary.csv \
  --dump-decisions demo/decisions.h5
echo "results: demo/results.csv (per step), demo/results.policies.csv, demo/summary.csv, demo/decisions.h5"
