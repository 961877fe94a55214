#!/bin/sh
# The GPU machine's scripts (experiments/live_gpu/) get minutes of device time when one is lent:
# check here, on the CPU backend and without transformers, that the whole-step benchmark and the
# replay scaling script run, and that their results become the tables of docs/live.md. Usage: check_gpu_scripts.sh KVSIM PYTHON
set -eu
kvsim=$1
python=${2:-python3}
here=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$python" "$here/experiments/live_gpu/bench_step.py" --kvsim "$kvsim" --backend cpu --layers 2 \
  --hidden 64 --heads 4 --kv-heads 2 --intermediate 128 --vocab 256 --prompt-len 48 --gen 3 \
  --out "$out" > /dev/null
"$here/experiments/replay_scaling.sh" "$kvsim" "$out" "1 2" 1 --layers 2 --heads 4 --kv-heads 2 \
  --head-dim 16 --media-tokens 200 --gen-tokens 6 > /dev/null
"$python" "$here/experiments/live_gpu/summarize.py" "$out" > /dev/null
for policy in full h2o tova streamingllm; do
  grep -q "| kvsim (cpu) | kvsim | $policy | " "$out/tables.md" ||
    { echo "tables.md lacks kvsim's $policy row:"; cat "$out/tables.md"; exit 1; }
done
"$python" -c "import json, sys; r = json.load(open(sys.argv[1])); assert len(r['rows']) == 4, r" \
  "$out/step.json"
grep -q "^| 4 | 2 | " "$out/tables.md" || { echo "tables.md lacks the scaling rows"; exit 1; }
echo "bench_step.py, replay_scaling.sh and summarize.py: ok"
