#!/bin/sh
# What kvsim decides on fixed inputs, written as text, so that a change meant to alter no behaviour
# (a refactoring) can be checked against the commit before it: every policy and preset at its
# defaults, replayed on synthetic MHA and GQA traces in three readings (as registered,
# --equal-memory, --prompt-tail 1), with the per-step results, the summaries and every eviction
# and merge; a sweep; a live evaluation of a random-initialised model; Python replays (built-in
# policies, a Python scorer policy, decisions). Times, versions and paths are left out.
# Usage: tests/behaviour_snapshot.sh BUILD_DIR OUT_DIR
#          write the snapshot of the kvsim built in BUILD_DIR (its kvsim and python/) to OUT_DIR
#        tests/behaviour_snapshot.sh --against COMMIT [BUILD_DIR]
#          build COMMIT in a temporary worktree (kvsim and the Python module, about 5 minutes on
#          2 cores), snapshot it and BUILD_DIR (default build/), and diff the two: exit 0 when
#          every file is equal, 1 with the differences listed
#        tests/behaviour_snapshot.sh --threads BUILD_DIR
#          snapshot BUILD_DIR with 1 and with 2 worker threads and diff the two (the ctest
#          behaviour_snapshot.threads: the same output whatever the thread count)
# Environment: KVSIM_SNAPSHOT_KEEP=1 keeps the worktree and both snapshots (printed);
#   KVSIM_SNAPSHOT_THREADS (2) the worker threads (the ctest compares 1 with 2).
set -eu
repo=$(cd "$(dirname "$0")/.." && pwd)
py=/usr/bin/python3
threads=${KVSIM_SNAPSHOT_THREADS:-2}

usage() { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

snapshot() {
  build=$(cd "$1" && pwd)
  mkdir -p "$2"
  out=$(cd "$2" && pwd)
  kvsim=$build/kvsim
  [ -x "$kvsim" ] || { echo "behaviour_snapshot: $kvsim: no kvsim binary there" >&2; exit 2; }
  work=$out/.work
  rm -rf "$work" && mkdir -p "$work"
  # Small traces that still exercise the multimodal policies: two images (MHA) and a video of
  # four frames with Qwen2-VL rotary positions (GQA, two query heads per KV head).
  "$kvsim" synth -o "$work/mha.h5" --layers 3 --heads 4 --kv-heads 4 --head-dim 32 \
    --samples 2 --media-count 2 --media-tokens 144 --gen 10 --seed 3 >/dev/null
  "$kvsim" synth -o "$work/gqa.h5" --layers 3 --heads 4 --kv-heads 2 --head-dim 32 \
    --samples 1 --media-count 4 --media-tokens 64 --video --mrope --gen 12 --seed 5 \
    --dtype float32 >/dev/null
  names=$("$kvsim" policies --json | "$py" -c '
import json, sys
d = json.load(sys.stdin)
print(" ".join([p["name"] for p in d["policies"]] + [p["name"] for p in d["presets"]]))')
  # Beside the defaults, settings that take other paths: NAME+KEY=VALUE+... (the window and sinks
  # of the random floor, the merges, per-layer rounding, a scorer inside adakv).
  configured="random+random.sinks=2+random.window=16 snapkv+snapkv.merge=weighted
    pyramidkv+pyramidkv.merge=pivot+pyramidkv.rounding=reference h2o+h2o.mode=oneshot
    adakv+adakv.scorer=knorm+adakv.window=0 expected_attention+expected_attention.vnorm=false"
  # One replay per policy and reading, so that a refusal (a reading a policy cannot run) is
  # recorded as its message and the others still run; the outputs of a (trace, reading) are
  # concatenated, each after a line naming its policy.
  for trace in mha gqa; do
    for reading in registered equal tail1; do
      case $reading in
        registered) extra= ;;
        equal) extra=--equal-memory ;;
        tail1) extra="--prompt-tail 1" ;;
      esac
      stem=$out/replay-$trace-$reading
      : >"$stem.csv"; : >"$stem.summary.csv"; : >"$stem.decisions.txt"; : >"$stem.messages.txt"
      for name in $names $configured; do
        rm -f "$work/steps.csv" "$work/summary.csv" "$work/decisions.h5"
        set=$(echo "$name" | sed -n 's/^[a-z0-9_]*+//p' | tr '+' '\n' | sed 's/^/--set /')
        # shellcheck disable=SC2086  # $extra and $set are lists of words
        if "$kvsim" replay "$work/$trace.h5" -p "${name%%+*}" --budget 20% --seeds 2 $extra $set \
          -j "$threads" -o "$work/steps.csv" --summary "$work/summary.csv" \
          --dump-decisions "$work/decisions.h5" >"$work/table.txt" 2>"$work/stderr.txt"; then
          status=0
        else
          status=$?
        fi
        echo "== $name: exit $status" >>"$stem.messages.txt"
        cat "$work/stderr.txt" "$work/table.txt" >>"$stem.messages.txt"
        [ $status -eq 0 ] || continue
        { echo "== $name"; cat "$work/steps.csv"; } >>"$stem.csv"
        { echo "== $name"; cat "$work/summary.csv"; } >>"$stem.summary.csv"
        { echo "== $name"; h5dump "$work/decisions.h5" | sed 1d; } >>"$stem.decisions.txt"
      done
    done
  done
  # The optional metrics and the checks: diagnostics (hit rates, misses, evicted mass), the
  # oracle's regret, and HAE's bounds, with the console table that reports the bounds' counts.
  for trace in mha gqa; do
    "$kvsim" replay "$work/$trace.h5" -p h2o,snapkv,hae,tova,oracle --budget 20% --diagnostics \
      --bounds "$work/bounds.csv" -o "$work/steps.csv" -j "$threads" >"$work/table.txt" 2>&1
    cp "$work/steps.csv" "$out/diagnostics-$trace.csv"
    cp "$work/bounds.csv" "$out/bounds-$trace.csv"
    cp "$work/table.txt" "$out/diagnostics-$trace.table.txt"
  done
  # How policy lists are built, with every warning given before a run: a replay and a sweep of
  # policies that size themselves, pinned presets, a wildcard setting and seeds at equal memory.
  "$kvsim" replay "$work/mha.h5" -p h2o,snapkv,hae,hae:table2,random,full,madakv,st3 \
    --budget 20% --seeds 2 --equal-memory --set '*.window=8' -j "$threads" \
    >"$out/list.replay.txt" 2>&1 || echo "exit $?" >>"$out/list.replay.txt"
  "$kvsim" sweep -t "$work/mha.h5" -p h2o,hae,random,st3,snapkv --budget 20% --seeds 2 \
    --equal-memory --grid h2o.recent=25%,50% --grid '*.window=4,8' --set hae.rc_size=8 \
    -o "$work/list-sweep" -j "$threads" >"$out/list.sweep.txt" 2>&1 ||
    echo "exit $?" >>"$out/list.sweep.txt"
  labels='import csv, sys; print(*dict.fromkeys(r["label"] for r in csv.DictReader(sys.stdin)))'
  "$py" -c "$labels" <"$work/list-sweep/results.csv" >>"$out/list.sweep.txt"
  "$kvsim" sweep -t "$work/mha.h5" -p h2o,snapkv,hae,random --seeds 2 \
    --grid h2o.budget=10%,30% --grid snapkv.window=4,8 -o "$work/sweep" -j "$threads" \
    >/dev/null 2>&1
  cp "$work/sweep/results.csv" "$out/sweep.results.csv"
  # Live: a random-initialised model and random prompts (both deterministic for their seeds).
  "$kvsim" live make-model -o "$work/model" >/dev/null 2>&1
  "$kvsim" live make-prompt -o "$work/prompts.h5" >/dev/null 2>&1
  "$kvsim" live evaluate -m "$work/model" --prompts "$work/prompts.h5" --gen 8 \
    -p h2o,snapkv,tova,knorm,random,streamingllm --budget 40% --seeds 2 \
    --summary "$work/live.csv" >"$work/live.table.txt" 2>/dev/null
  # The overall table (the per-sample lines before it carry each token's latency).
  sed -n '/held\/B/,$p' "$work/live.table.txt" >"$out/live.table.txt"
  # Latency and the machine are measured, not decided: left out.
  "$py" - "$work/live.csv" "$out/live.summary.csv" <<'EOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
keep = [c for c in rows[0] if not c.endswith("ms_per_token")]
with open(sys.argv[2], "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(keep)
    w.writerows([[r[c] for c in keep] for r in rows])
EOF
  PYTHONPATH=$build/python "$py" -W ignore::UserWarning - "$work/mha.h5" "$out" "$threads" <<'EOF'
import sys
import numpy as np
import kvsim

trace, out = sys.argv[1], sys.argv[2]

class NegativeKeyNorm(kvsim.ScorerPolicy):
    def score(self, view, cache):
        return -np.linalg.norm([view.keys(g) for g in range(view.num_kv_heads)], axis=-1)

res, dec = kvsim.replay(trace, {"knorm": {"budget": "20%"}, "py": NegativeKeyNorm(budget="20%"),
                                "h2o": {"budget": "20%"}, "snapkv:kvpress": None,
                                "adaptive": NegativeKeyNorm(budget="20%", selection="adaptive")},
                        decisions=True, threads=int(sys.argv[3]), as_frame=False)
diag = kvsim.replay(trace, {"h2o": {"budget": "20%"}, "oracle": {"budget": "20%"}},
                    diagnostics=True, threads=int(sys.argv[3]), as_frame=False)
import warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    listed = kvsim.replay(trace, {"h2o": None, "hae": None, "hae:table2": None, "random": None,
                                  "st3": None, "snapkv": {"window": "8"},
                                  "py": NegativeKeyNorm(budget="20%")},
                          budget="20%", seeds=2, equal_memory=True, threads=int(sys.argv[3]))
with open(f"{out}/python.list.txt", "w") as f:
    f.writelines(str(w.message) + "\n" for w in caught)
    f.write(" ".join(dict.fromkeys(listed["policy"])) + "\n")
for name, table in (("python.replay.csv", res), ("python.decisions.csv", dec),
                    ("python.diagnostics.csv", diag)):
    cols = list(table)
    with open(f"{out}/{name}", "w") as f:
        f.write(",".join(cols) + "\n")
        for i in range(len(table[cols[0]])):
            f.write(",".join(repr(table[c][i].item() if hasattr(table[c][i], "item")
                                   else table[c][i]) for c in cols) + "\n")
EOF
  rm -rf "$work"
  # Paths differ between the two snapshots: written as the file's name only.
  for f in "$out"/*; do sed -i "s|$out/.work/||g; s|$build/||g" "$f"; done
}

if [ "${1:-}" = --against ]; then
  [ $# -ge 2 ] || usage
  commit=$2
  build=${3:-$repo/build}
  tmp=$(mktemp -d)
  git -C "$repo" worktree add --detach "$tmp/src" "$commit" >/dev/null
  echo "behaviour_snapshot: building $commit in $tmp/src" >&2
  cmake -S "$tmp/src" -B "$tmp/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$tmp/build" -j2 --target kvsim _kvsim >/dev/null
  snapshot "$tmp/build" "$tmp/before"
  snapshot "$build" "$tmp/after"
  status=0
  diff -r "$tmp/before" "$tmp/after" >"$tmp/diff.txt" || status=1
  if [ $status -eq 0 ]; then
    echo "behaviour_snapshot: equal to $commit ($(find "$tmp/after" -type f | wc -l) files)" >&2
  else
    echo "behaviour_snapshot: differs from $commit:" >&2
    diff -rq "$tmp/before" "$tmp/after" >&2 || true
  fi
  if [ "${KVSIM_SNAPSHOT_KEEP:-0}" = 1 ]; then
    echo "behaviour_snapshot: kept $tmp (src, build, before, after, diff.txt)" >&2
  else
    git -C "$repo" worktree remove --force "$tmp/src"
    rm -rf "$tmp"
  fi
  exit $status
fi
if [ "${1:-}" = --threads ]; then
  [ $# -eq 2 ] || usage
  tmp=$(mktemp -d)
  # Each snapshot traced into a log, so that a step that fails is named (its last lines shown).
  for threads in 1 2; do
    if ! (set -x && snapshot "$2" "$tmp/threads$threads") 2>"$tmp/log$threads"; then
      echo "behaviour_snapshot: the snapshot with $threads thread(s) failed; its last steps:" >&2
      tail -25 "$tmp/log$threads" >&2
      rm -rf "$tmp"
      exit 1
    fi
  done
  status=0
  if ! diff -r "$tmp/threads1" "$tmp/threads2" >"$tmp/diff.txt"; then
    status=1
    echo "behaviour_snapshot: 1 and 2 threads differ (the first 60 lines of the diff):" >&2
    head -60 "$tmp/diff.txt" >&2
  else
    echo "behaviour_snapshot: 1 and 2 threads equal" >&2
  fi
  rm -rf "$tmp"
  exit $status
fi
[ $# -eq 2 ] || usage
snapshot "$1" "$2"
