#!/bin/sh
# Thread scaling of replay: the five baselines at 20% through a one-sample and a
# four-sample synthetic trace (by default the shape: 8 layers x 32 heads, d = 128, a
# 2,048-token prompt, 64 generated tokens), timed with each thread count, best of REPEATS runs.
#
#   replay_scaling.sh KVSIM OUT_DIR [THREADS="1 2"] [REPEATS=3] [synth options...]
#   replay_scaling.sh build/kvsim results "1 4 16"          # on a 16-core machine
#
# Writes OUT_DIR/replay_scaling.csv: trace,samples,threads,seconds,speedup_over_one_thread, and
# checks that every thread count writes the same results file.
set -eu
kvsim=$1
out=$2
threads=${3:-"1 2"}
repeats=${4:-3}
shift 2
[ $# -gt 0 ] && shift
[ $# -gt 0 ] && shift
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ $# -eq 0 ]; then
  set -- --layers 8 --heads 32 --kv-heads 32 --head-dim 128 --system-tokens 35 \
    --media-tokens 1984 --user-tokens 29 --gen-tokens 64
fi
csv="$out/replay_scaling.csv"
echo "trace,samples,threads,seconds,speedup_over_one_thread" > "$csv"
for samples in 1 4; do
  trace="$work/scaling_$samples.h5"
  "$kvsim" synth --force --out "$trace" --samples "$samples" "$@" > /dev/null
  one=""
  for j in $threads; do
    best=""
    for r in $(seq "$repeats"); do
      start=$(date +%s.%N)
      "$kvsim" replay -t "$trace" -p full -p streamingllm -p h2o -p snapkv -p oracle \
        --budget 20% -j "$j" -o "$work/result_$j.csv" > /dev/null
      seconds=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
      if [ -z "$best" ] || awk -v s="$seconds" -v b="$best" 'BEGIN { exit !(s < b) }'; then
        best=$seconds
      fi
    done
    [ -z "$one" ] && one=$best
    cmp -s "$work/result_$j.csv" "$work/result_$(echo "$threads" | cut -d' ' -f1).csv" ||
      { echo "replay_scaling.sh: -j $j wrote different results" >&2; exit 1; }
    awk -v t="$(basename "$trace")" -v n="$samples" -v j="$j" -v s="$best" -v one="$one" \
      'BEGIN { printf "%s,%s,%s,%.3f,%.2f\n", t, n, j, s, one / s }' >> "$csv"
  done
done
cat "$csv"
