#!/usr/bin/env python3
"""Merging against eviction, per trace regime, from experiments/merging_regimes.sh's sweep.

    merging_report.py TABLE_BY_TRACE.csv --out DIR

Reads sweep_report.py's per-trace table of the merging_vs_eviction recipe, whose traces are named
REGIME_L<layers>_s<seed>.h5, pairs every merging configuration (lookm merge=average|pivotal|
weighted, meda merge=true) with the same policy and budget without merging (lookm merge=none,
meda merge=false) on the same trace, and writes

  DIR/merging.csv  regime, policy, budget, merge, seeds, evict_error, merge_error,
                   merge_lower_in, evict_value_error, merge_value_error
                   (errors: mean output errors averaged over the seeds; merge_lower_in: on how
                   many seeds merging gave the lower output error)
  DIR/merging.md   averaging only (lookm average, meda true): "evict → merge (k/S)" per budget,
                   in bold where merging is lower on every seed.
"""
import argparse
import csv
import os
import re
import sys
from collections import defaultdict

from kvsim.report.sweep_report import parse_label

WITHOUT_MERGING = {"lookm": "none", "meda": "false"}
AVERAGING = {"lookm": "average", "meda": "true"}
TRACE_NAME = re.compile(r"^(?P<regime>.+)_L\d+_s(?P<seed>\d+)\.h5$")


def read_errors(path):
    """{(regime, seed, policy, budget, merge): (output error, value error)}."""
    errors = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            m = TRACE_NAME.match(os.path.basename(r["trace"]))
            name, axes = parse_label(r["label"])
            if not m or name not in WITHOUT_MERGING or "merge" not in axes:
                raise ValueError(f"{path}: row {r['trace']} {r['label']} is not a "
                                 "merging_regimes.sh trace and merging_vs_eviction configuration")
            if not r["mean_output_rel_error"]:
                raise ValueError(f"{path}: {r['trace']} has no output errors (a trace without v)")
            key = (m["regime"], int(m["seed"]), name, axes["budget"], axes["merge"])
            errors[key] = (float(r["mean_output_rel_error"]), float(r["mean_output_value_error"]))
    return errors


def compare(errors):
    seeds = defaultdict(list)
    for regime, seed, policy, budget, merge in errors:
        if merge != WITHOUT_MERGING[policy]:
            seeds[(regime, policy, budget, merge)].append(seed)
    rows = []
    for (regime, policy, budget, merge), ss in seeds.items():
        pairs = []
        for s in sorted(ss):
            evict = errors.get((regime, s, policy, budget, WITHOUT_MERGING[policy]))
            if evict is None:
                raise ValueError(f"{regime} seed {s}: {policy} at {budget} has no run without "
                                 "merging to compare with")
            pairs.append((evict, errors[(regime, s, policy, budget, merge)]))
        n = len(pairs)
        rows.append({
            "regime": regime, "policy": policy, "budget": budget, "merge": merge, "seeds": n,
            "evict_error": sum(e[0] for e, _ in pairs) / n,
            "merge_error": sum(m[0] for _, m in pairs) / n,
            "merge_lower_in": sum(m[0] < e[0] for e, m in pairs),
            "evict_value_error": sum(e[1] for e, _ in pairs) / n,
            "merge_value_error": sum(m[1] for _, m in pairs) / n,
        })
    return rows


def budget_order(budget):
    return float(budget.rstrip("%"))


def write(rows, out):
    os.makedirs(out, exist_ok=True)
    regimes = list(dict.fromkeys(r["regime"] for r in rows))  # the sweep's trace order
    rows.sort(key=lambda r: (regimes.index(r["regime"]), r["policy"], budget_order(r["budget"]),
                             r["merge"]))
    with open(os.path.join(out, "merging.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    budgets = sorted({r["budget"] for r in rows}, key=budget_order)
    cell = {(r["regime"], r["policy"], r["budget"]): r for r in rows
            if r["merge"] == AVERAGING[r["policy"]]}
    head = ["trace"] + [f"{p} {b}" for p in AVERAGING for b in budgets]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for regime in regimes:
        cells = [f"`{regime}`"]
        for policy in AVERAGING:
            for b in budgets:
                r = cell.get((regime, policy, b))
                if r is None:  # not in the sweep
                    cells.append("–")
                    continue
                text = (f"{r['evict_error']:.3f} → {r['merge_error']:.3f} "
                        f"({r['merge_lower_in']}/{r['seeds']})")
                cells.append(f"**{text}**" if r["merge_lower_in"] == r["seeds"] else text)
        lines.append("| " + " | ".join(cells) + " |")
    with open(os.path.join(out, "merging.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("table", help="table_by_trace.csv of the merging_vs_eviction sweep")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    try:
        rows = compare(read_errors(args.table))
    except (OSError, ValueError) as e:
        print(f"merging_report: {e}", file=sys.stderr)
        return 1
    if not rows:
        print(f"merging_report: no merging configurations in {args.table}", file=sys.stderr)
        return 1
    write(rows, args.out)
    print(os.path.join(args.out, "merging.csv"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
