#!/bin/sh
# experiments/merging_regimes.sh runs end to end (one-layer traces and two seeds here; the
# docs/demo.md's table uses eight layers and four seeds): ten traces, each through the 24
# configurations of the merging_vs_eviction recipe, tabled per trace and compared by
# experiments/reports/merging_report.py; then merging_report.py on a table worked out by hand.
# Usage: check_merging_regimes.sh KVSIM
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
reports=$here/experiments/reports  # the experiments' own reports
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail() { echo "$1"; exit 1; }
# The kvsim package merging_report.py imports: the build's beside the binary, else the source's.
PYTHONPATH="$(dirname "$1")/python:$here/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH
KVSIM=$1 KVSIM_RESULTS="$out" "$here/experiments/merging_regimes.sh" 1 "1 2" > /dev/null
table="$out/merging_regimes/recipes/merging_vs_eviction/table_by_trace.csv"
rows=$(($(wc -l < "$table") - 1))
[ "$rows" -eq 240 ] || fail "expected 10 traces x 24 configurations in $table, got $rows rows"
for regime in demo value_gap visible flat_deep flat_deep_visible; do
  grep -q "${regime}_L1_s2.h5,\"lookm\[budget=5%,merge=average\]\"," "$table" ||
    fail "$table lacks lookm at 5% with merging on $regime, seed 2"
done
merging="$out/merging_regimes/merging.csv"
rows=$(($(wc -l < "$merging") - 1))
[ "$rows" -eq 80 ] || fail "expected 5 regimes x 16 merging configurations in $merging, got $rows"
grep -q "^flat_deep_visible,meda,40%,true,2," "$merging" || fail "$merging lacks meda at 40%"

# By hand: on regime r, seed 1 merging is lower (0.2 < 0.3), seed 2 higher (0.5 > 0.4): means
# 0.35 evicting and 0.35 merging, lower in 1 of 2 seeds, not bold.
cat > "$out/hand.csv" << 'CSV'
trace,label,policy,params,mean_mass_recall,mean_output_rel_error,mean_output_value_error,mean_cache_size,kv_mib_per_step
x/r_L8_s1.h5,"meda[budget=5%,merge=false]",meda,,0.5,0.3,0.2,10,1
x/r_L8_s1.h5,"meda[budget=5%,merge=true]",meda,,0.5,0.2,0.1,10,1
x/r_L8_s2.h5,"meda[budget=5%,merge=false]",meda,,0.5,0.4,0.3,10,1
x/r_L8_s2.h5,"meda[budget=5%,merge=true]",meda,,0.5,0.5,0.4,10,1
x/r_L8_s1.h5,"lookm[budget=5%,merge=none]",lookm,,0.5,0.3,0.2,10,1
x/r_L8_s1.h5,"lookm[budget=5%,merge=average]",lookm,,0.5,0.1,0.1,10,1
CSV
/usr/bin/python3 "$reports/merging_report.py" "$out/hand.csv" --out "$out/hand" > /dev/null
grep -qx "r,meda,5%,true,2,0.35,0.35,1,0.25,0.25" "$out/hand/merging.csv" ||
  { cat "$out/hand/merging.csv"; fail "merging.csv: wrong meda row"; }
grep -qx '| `r` | \*\*0.300 → 0.100 (1/1)\*\* | 0.350 → 0.350 (1/2) |' "$out/hand/merging.md" ||
  { cat "$out/hand/merging.md"; fail "merging.md: wrong row"; }
# A configuration without its eviction twin is an error naming it.
grep -v "merge=none" "$out/hand.csv" > "$out/orphan.csv"
if /usr/bin/python3 "$reports/merging_report.py" "$out/orphan.csv" --out "$out/o" 2>"$out/err"
then
  fail "merging_report.py accepted a merging run without its eviction twin"
fi
grep -q "r seed 1: lookm at 5% has no run without merging" "$out/err" || fail "$(cat "$out/err")"
echo "merging_regimes.sh and merging_report.py: ok"
