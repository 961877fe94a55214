#!/usr/bin/env bash
# Runs one recipe of experiments/recipes/ (a sweep file without traces) on the given traces
# (default: the demo trace), then writes its table and figures:
#   experiments/run_recipe.sh hae_fig4_r [TRACE ...]  ->  results/recipes/hae_fig4_r/
# $KVSIM (default: the repository's build/kvsim) is the binary and $KVSIM_RESULTS replaces
# results/. Paths (traces, results) are the caller's: relative ones are taken from the current
# directory, and nothing is written into the repository.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
recipe="${1:?usage: run_recipe.sh RECIPE [TRACE ...] (recipes: $(ls "$repo/experiments/recipes" | sed 's/\.ini$//' | tr '\n' ' '))}"
shift
ini="$repo/experiments/recipes/${recipe}.ini"
[ -f "$ini" ] || { echo "run_recipe: no recipe $ini" >&2; exit 2; }
traces=("$@")
[ ${#traces[@]} -gt 0 ] || traces=(demo/demo.h5)
out="${KVSIM_RESULTS:-results}/recipes/${recipe}"
args=()
for t in "${traces[@]}"; do args+=(--trace "$t"); done
kvsim=${KVSIM:-$repo/build/kvsim}
"$kvsim" sweep --config "$ini" "${args[@]}" --out "$out"
# The report: the kvsim package built beside the binary (its intervals), else the source tree's.
PYTHONPATH="$(dirname "$kvsim")/python:$repo/python${PYTHONPATH:+:$PYTHONPATH}" \
  /usr/bin/python3 -m kvsim.report.sweep_report "$out/results.csv" --out "$out"
