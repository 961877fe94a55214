#!/usr/bin/env bash
# Runs one recipe of experiments/recipes/ (a sweep file without traces) on the given traces
# (default: the demo trace), then writes its table and figures:
#   experiments/run_recipe.sh hae_fig4_r [TRACE ...]  ->  results/recipes/hae_fig4_r/
# $KVSIM (default ./build/kvsim) is the binary and $KVSIM_RESULTS replaces results/ (paths are
# taken from the repository's root).
set -euo pipefail
cd "$(dirname "$0")/.."
recipe="${1:?usage: run_recipe.sh RECIPE [TRACE ...] (recipes: $(ls experiments/recipes | sed 's/\.ini$//' | tr '\n' ' '))}"
shift
ini="experiments/recipes/${recipe}.ini"
[ -f "$ini" ] || { echo "run_recipe: no recipe $ini" >&2; exit 2; }
traces=("$@")
[ ${#traces[@]} -gt 0 ] || traces=(demo/demo.h5)
out="${KVSIM_RESULTS:-results}/recipes/${recipe}"
args=()
for t in "${traces[@]}"; do args+=(--trace "$t"); done
"${KVSIM:-./build/kvsim}" sweep --file "$ini" "${args[@]}" --out "$out"
/usr/bin/python3 analysis/sweep_report.py "$out/results.csv" --out "$out"
