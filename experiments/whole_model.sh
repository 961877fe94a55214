#!/usr/bin/env bash
# A whole model's sample end to end (docs/performance.md, "A whole model's sample"): a synthetic
# video sample with Qwen2-VL-7B's shape (28 layers, 28 query heads, 4 KV heads, d = 128, M-RoPE,
# frames of 256 tokens, 64 generated tokens) written as a full trace, compacted (with the
# entropies, the default), and replayed from both files with the floors, the baselines and the
# five methods at equal memory (20%). Each stage's wall time and peak memory, each file's size,
# beside the GEMM floor of the stage's products at the rates measured here in the same run (each
# product at the rate of its key count: kvsim_bench_compact --floors).
#
#   experiments/whole_model.sh [--compact-only] OUT_DIR [PROMPT=32768] [LAYERS=28] [THREADS=$(nproc)]
#   experiments/whole_model.sh wm 2048 4        # the same steps, small (about 15 seconds)
#   experiments/whole_model.sh --compact-only wm32k   # 32k without the full trace's replay
#
# Needs build/kvsim and build/kvsim_bench_compact (the Release build's benchmarks; $KVSIM and
# $KVSIM_BENCH_COMPACT name others). Writes OUT_DIR/whole_model.csv (stage, seconds, peak_mib,
# file_mib, gflop, floor_seconds), the floors (OUT_DIR/floors.csv) and both replays' result
# files, and fails unless the two replays' results are byte-identical. Each stage's time is kept in
# OUT_DIR/STAGE.time as it ends, and a trace or compact trace already in OUT_DIR is reused, not
# rewritten (the table then gives the time its own run kept, or none). At 32k and 28 layers the
# traces take about 9 GB and 2.3 GB. --compact-only leaves out the full trace's replay (and so the
# byte comparison of the two replays): it recomputes the compaction's statistics, so at 32k on
# 2 cores it would add about as long as writing and compacting take (46 minutes on one machine).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
replay_full=1
if [ "${1:-}" = --compact-only ]; then
  replay_full=0
  shift
fi
[ $# -ge 1 ] || { sed -n '2,21p' "$0" | cut -c3-; exit 2; }
out=$1
prompt=${2:-32768}
layers=${3:-28}
threads=${4:-$(nproc)}
for value in "PROMPT=$prompt" "LAYERS=$layers" "THREADS=$threads"; do
  [[ ${value#*=} =~ ^[1-9][0-9]*$ ]] ||
    { echo "whole_model.sh: ${value%%=*} is '${value#*=}': a whole number of at least 1" >&2; exit 2; }
done
kvsim=${KVSIM:-$repo/build/kvsim}
bench=${KVSIM_BENCH_COMPACT:-$repo/build/kvsim_bench_compact}
for tool in "$kvsim" "$bench"; do
  [ -x "$tool" ] || { echo "whole_model.sh: $tool is missing: build the Release tree first" >&2; exit 1; }
done
# Frames of 256 tokens after the 35-token system prompt and before the 29-token question.
frames=$(((prompt - 35 - 29 + 128) / 256))
[ "$frames" -ge 1 ] || { echo "whole_model.sh: PROMPT $prompt is too short for one frame" >&2; exit 1; }
mkdir -p "$out"
full=$out/full.h5
compact=$out/compact.h5
csv=$out/whole_model.csv
policies=(full random downsample text_only streamingllm h2o snapkv pyramidkv adakv tova knorm
  lookm hae madakv avl st3 meda)
replay_args=(--budget 20% --equal-memory -j "$threads" --set avl.max_new_tokens=64
  --set st3.max_new_tokens=64)
for p in "${policies[@]}"; do replay_args+=(-p "$p"); done

# measure STAGE CMD...: runs CMD (output to OUT_DIR/STAGE.log) and prints "seconds,peak_mib":
# wall time, and the largest resident set of the processes it ran; kept in OUT_DIR/STAGE.time.
measure() {
  local stage=$1
  shift
  /usr/bin/python3 - "$out/$stage.log" "$@" <<'PY'
import resource, subprocess, sys, time
start = time.monotonic()
with open(sys.argv[1], "w") as log:
    code = subprocess.call(sys.argv[2:], stdout=log, stderr=subprocess.STDOUT)
seconds = time.monotonic() - start
if code != 0:
    sys.exit(f"whole_model.sh: {' '.join(sys.argv[2:4])} failed ({code}): see {sys.argv[1]}")
print(f"{seconds:.1f},{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024:.0f}")
PY
}
# kept STAGE: the time an earlier run kept for STAGE, or nothing.
kept() { [ -f "$out/$1.time" ] && cat "$out/$1.time" || true; }
mib() { awk -v b="$(stat -c %s "$1")" 'BEGIN { printf "%.0f", b / 1048576 }'; }

declare -A timed
if [ ! -f "$full" ]; then
  echo "writing the full trace ($layers layers, $frames frames of 256 tokens) ..."
  rm -f "$out/write.time" "$out/compact.time"
  timed[write]=$(measure write "$kvsim" synth --out "$full" --model synthetic-qwen2-vl-7b-video \
    --layers "$layers" --heads 28 --kv-heads 4 --head-dim 128 --video --mrope \
    --media-count "$frames" --media-tokens 256 --separator-tokens 0 --gen-tokens 64)
  echo "${timed[write]}" > "$out/write.time"
else
  timed[write]=$(kept write)
fi
if [ ! -f "$compact" ]; then
  echo "compacting it ..."
  timed[compact]=$(measure compact "$kvsim" compact "$full" "$compact" -j "$threads")
  echo "${timed[compact]}" > "$out/compact.time"
else
  timed[compact]=$(kept compact)
fi
if [ "$replay_full" = 1 ]; then
  echo "replaying the full trace (${#policies[@]} policies) ..."
  timed[replay_full]=$(measure replay_full "$kvsim" replay "$full" "${replay_args[@]}" \
    --out "$out/full_results.csv" --summary "$out/full_summary.csv")
  echo "${timed[replay_full]}" > "$out/replay_full.time"
fi
echo "replaying the compact trace (${#policies[@]} policies) ..."
timed[replay_compact]=$(measure replay_compact "$kvsim" replay "$compact" "${replay_args[@]}" \
  --out "$out/compact_results.csv" --summary "$out/compact_summary.csv")
echo "${timed[replay_compact]}" > "$out/replay_compact.time"
if [ "$replay_full" = 1 ]; then
  for f in results.csv results.policies.csv summary.csv; do
    cmp -s "$out/full_$f" "$out/compact_$f" ||
      { echo "whole_model.sh: full_$f and compact_$f differ" >&2; exit 1; }
  done
fi
echo "measuring the GEMM rate for the floors ..."
"$bench" --floors "$full" --compact "$compact" 2> "$out/floors.log" |
  grep -E '^[a-z_]+,' > "$out/floors.csv"

floor_of() { awk -F, -v s="$1" '$1 == s { print $2 "," $4 }' "$out/floors.csv"; }
{
  echo "stage,seconds,peak_mib,file_mib,gflop,floor_seconds"
  [ -n "${timed[write]:-}" ] && echo "write,${timed[write]},$(mib "$full"),,"
  [ -n "${timed[compact]:-}" ] &&
    echo "compact,${timed[compact]},$(mib "$compact"),$(floor_of compaction_with_entropies)"
  [ -n "${timed[replay_full]:-}" ] && echo "replay_full,${timed[replay_full]},,$(floor_of full_replay)"
  echo "replay_compact,${timed[replay_compact]},,$(floor_of compact_replay)"
} > "$csv"
if [ "$replay_full" = 1 ]; then
  echo "results byte-identical from both traces; $csv:"
else
  echo "the full trace was not replayed (--compact-only); $csv:"
fi
cat "$csv"
