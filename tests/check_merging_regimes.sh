#!/bin/sh
# experiments/merging_regimes.sh runs end to end (one-layer traces here; the README's table uses
# eight): five regime traces, each through the 24 configurations of the merging_vs_eviction
# recipe, tabled per trace. Usage: check_merging_regimes.sh KVSIM
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
KVSIM=$1 KVSIM_RESULTS="$out" "$here/experiments/merging_regimes.sh" 1 > /dev/null
table="$out/merging_regimes/recipes/merging_vs_eviction/table_by_trace.csv"
rows=$(($(wc -l < "$table") - 1))
[ "$rows" -eq 120 ] || { echo "expected 5 traces x 24 configurations in $table, got $rows rows"; exit 1; }
for regime in demo value_gap visible flat_deep flat_deep_visible; do
  grep -q "${regime}_L1.h5,\"lookm\[budget=5%,merge=average\]\"," "$table" ||
    { echo "$table lacks lookm at 5% with merging on $regime"; exit 1; }
  grep -q "${regime}_L1.h5,\"meda\[budget=5%,merge=false\]\"," "$table" ||
    { echo "$table lacks meda at 5% without merging on $regime"; exit 1; }
done
echo "merging_regimes.sh: ok"
