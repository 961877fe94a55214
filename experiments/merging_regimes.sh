#!/usr/bin/env bash
# When does merging beat evicting the same entries? Runs the merging_vs_eviction recipe (LOOK-M's
# three merge variants and MEDA's average merging, each against its selection without merging, at
# 5-40%) on synthetic traces that differ in one structural property at a time:
#
#   demo               the demo's knobs (image attention concentrated in deep layers, image
#                      tokens individually less attended than text, one value mean for all tokens)
#   value_gap          + the image tokens' values share their own mean (--vision-value-mean 1.5)
#   visible            value_gap + image tokens individually as attended as text (--vision-offset 0)
#   flat_deep          value_gap + deep-layer image logits nearly flat (--saliency-last 0.2,
#                      --noise 0.1)
#   flat_deep_visible  all three
#
#   experiments/merging_regimes.sh [LAYERS] [SEEDS]
#     -> results/merging_regimes/traces/REGIME_L<LAYERS>_s<SEED>.h5 (kept and reused)
#     -> results/merging_regimes/recipes/merging_vs_eviction/ (the sweep, table_by_trace.csv/.md)
#     -> results/merging_regimes/merging.csv/.md (experiments/reports/merging_report.py:
#        merging against eviction per regime, policy and budget, averaged over the seeds, with
#        the number of seeds on which merging was lower)
#
# LAYERS (default 8) sets each trace's depth and SEEDS (default "1 2 3 4"; 1 is the demo's) the
# generator's seeds; the shape is otherwise the demo's (LLaVA-1.5-7B).
# $KVSIM (default: the repository's build/kvsim) is the binary and $KVSIM_RESULTS replaces
# results/; relative paths are the caller's (nothing is written into the repository).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
reports=$repo/experiments/reports  # the experiments' own reports
layers=${1:-8}
seeds=${2:-"1 2 3 4"}
out="${KVSIM_RESULTS:-results}/merging_regimes"
mkdir -p "$out/traces"
declare -A knobs=(
  [demo]=""
  [value_gap]="--vision-value-mean 1.5"
  [visible]="--vision-value-mean 1.5 --vision-offset 0"
  [flat_deep]="--vision-value-mean 1.5 --saliency-last 0.2 --noise 0.1"
  [flat_deep_visible]="--vision-value-mean 1.5 --saliency-last 0.2 --noise 0.1 --vision-offset 0"
)
traces=()
for regime in demo value_gap visible flat_deep flat_deep_visible; do
  for seed in $seeds; do
    trace="$out/traces/${regime}_L${layers}_s${seed}.h5"
    # shellcheck disable=SC2086  # the knobs are words
    [ -f "$trace" ] || "${KVSIM:-$repo/build/kvsim}" synth --out "$trace" --layers "$layers" \
      --seed "$seed" ${knobs[$regime]} > /dev/null
    traces+=("$trace")
  done
done
KVSIM_RESULTS="$out" "$repo/experiments/run_recipe.sh" merging_vs_eviction "${traces[@]}"
# The kvsim package the report imports: the build's beside the binary, else the source tree's.
built=$(dirname "${KVSIM:-$repo/build/kvsim}")/python
PYTHONPATH="$built:$repo/python${PYTHONPATH:+:$PYTHONPATH}" \
  /usr/bin/python3 "$reports/merging_report.py" \
  "$out/recipes/merging_vs_eviction/table_by_trace.csv" --out "$out"
echo "merging_regimes: $out/merging.md"
