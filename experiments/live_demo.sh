#!/bin/sh
# The live path end to end on the CPU backend, on a random LLaMA-shaped checkpoint kvsim writes
# itself (no weights are downloaded): make a model and a LLaVA-shaped prompt file (576 image
# positions with inputs_embeds), capture a trace, replay it, evaluate the same policies live, and
# plot replay against live. Usage: experiments/live_demo.sh [OUT_DIR] [BUILD_DIR]; OUT_DIR
# (default demo/live) is taken from the current directory, BUILD_DIR (default the repository's
# build/) is where kvsim is, or is built.
set -eu
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-demo/live}
build=${2:-$repo/build}
[ -x "$build/kvsim" ] || { cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release && cmake --build "$build" -j"$(nproc)" --target kvsim; }
k="$build/kvsim"
mkdir -p "$out"
[ -f "$out/model/config.json" ] || "$k" live make-model -o "$out/model" --arch llama --layers 8 \
  --hidden 1024 --intermediate 2816 --heads 16 --kv-heads 4 --vocab 8000 --dtype bf16 --shards 2
"$k" live make-prompt --force -o "$out/prompts.h5" --samples 2 --prompt-len 640 --image-tokens 576 \
  --vocab 8000 --embed-dim 1024 --reference-len 16
policies="-p full -p streamingllm -p h2o -p snapkv -p hae -p meda -p avl -p madakv"
"$k" live capture -m "$out/model" --prompts "$out/prompts.h5" --gen 32 --force -o "$out/trace.h5"
"$k" replay -t "$out/trace.h5" $policies --budget 20% -o "$out/replay.csv"
"$k" live evaluate -m "$out/model" --prompts "$out/prompts.h5" $policies --budget 20% --gen 32 \
  -o "$out/live.csv" --summary "$out/live_summary.csv"
"$k" figures "$out/replay.csv" "$out/live.csv" "$out/live_summary.csv" -o "$out/figures"
