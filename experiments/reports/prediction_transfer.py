#!/usr/bin/env python3
"""Does replay's metric predict the live accuracy of a task it was not fitted on? Runs the test
experiments/prediction_declaration.json declares (committed before the test was computed): the
metric chosen on the single-image task alone, then each split's fit and prediction unchanged.

    prediction_transfer.py --declaration experiments/prediction_declaration.json \\
        --task vlm_eval=DIR --task vlm_multi/compress=DIR --task vlm_multi/append=DIR --out DIR

Each DIR is vlm_eval_report.py's output for that task (its vlm_eval_by_image.csv). Writes
OUT/transfer.md and OUT/transfer.json: the choice (each candidate's family-left-out error on the
fit task) and, per split, the number of points, the error of the predicted accuracy, the
memory-only map's error, the skill with its 95% interval over the predicted side's policy
families, and whether each target is met.
"""
import argparse
import json
import os
import sys

import numpy as np
import pandas as pd

from kvsim.report.prediction_card import (configurations, fmt, isotonic, left_out_error, predict,
                                          skill_interval)

# Whether the live accuracy rises with the metric (mass recall) or falls (an error).
RISES_WITH = {"replay_output_rel_error": False, "replay_mass_recall": True}
RESAMPLES = 2000


def fail(message):
    sys.exit(f"prediction_transfer: {message}")


def task_points(directory, metric):
    """One point per (seed, budget, policy) of a task's budgeted runs."""
    path = os.path.join(directory, "vlm_eval_by_image.csv")
    if not os.path.exists(path):
        fail(f"{path}: no such file (run experiments/reports/vlm_eval_report.py for the task "
             "first)")
    rows = pd.read_csv(path, dtype={"sample": str, "budget": str})
    for column in ("seed", "budget", "policy", "sample", "contains", "kv_fraction", metric):
        if column not in rows:
            fail(f"{path}: no column '{column}'")
    rows = rows[rows["budget"] != "self"].copy()
    rows["full"] = rows["full_contains"]
    return configurations(rows, metric, "contains")


def family_left_out(points, metric):
    mae, _ = left_out_error(points, "family", "x", RISES_WITH[metric])
    return mae


def transfer(fit, test, metric, rng):
    """The map fitted on `fit`, its error on `test`, the memory-only map's, the skill and its
    interval over the test side's families drawn with replacement."""
    knots = isotonic(fit["x"], fit["y"], RISES_WITH[metric])
    memory = isotonic(fit["memory"], fit["y"], True)
    err = np.abs(predict(knots, test["x"]) - test["y"].to_numpy())
    base = np.abs(predict(memory, test["memory"]) - test["y"].to_numpy())
    # Families in sorted order, so that the draws do not depend on the rows' order.
    order = np.argsort(test["family"].to_numpy(), kind="stable")
    families = pd.Series(test["family"].to_numpy()[order])
    low_high = skill_interval(families, pd.Series(err[order]), pd.Series(base[order]), rng,
                              RESAMPLES)
    return {"points": int(len(test)), "families": int(families.nunique()),
            "error": float(err.mean()), "error_memory_only": float(base.mean()),
            "skill": float(1 - err.sum() / base.sum()) if base.sum() > 0 else float("nan"),
            "skill_ci": low_high}


def select(points, budgets):
    return points if not budgets else points[points["budget"].isin(budgets)]


def run(declaration, tasks):
    needed = {s[k] for s in declaration["splits"] for k in ("fit", "predict")}
    missing = sorted(needed - set(tasks))
    if missing:
        fail(f"the declaration's splits need --task for: {', '.join(missing)}")
    first = declaration["splits"][0]["fit"]
    choice = {m: family_left_out(task_points(tasks[first], m), m)
              for m in declaration["candidates"]}
    metric = min(declaration["candidates"], key=lambda m: (choice[m], declaration["candidates"].index(m)))
    rng = np.random.default_rng(0)
    points = {t: task_points(d, metric) for t, d in tasks.items() if t in needed}
    targets = declaration["targets"]
    splits = []
    for s in declaration["splits"]:
        fit = select(points[s["fit"]], s.get("fit_budgets"))
        test = select(points[s["predict"]], s.get("predict_budgets"))
        if fit.empty or test.empty:
            fail(f"split {s['name']!r}: no points on one side (its budgets?)")
        r = transfer(fit, test, metric, rng)
        r["name"] = s["name"]
        r["skill_met"] = bool(r["skill_ci"][0] >= targets["skill"])
        r["error_met"] = bool(r["error"] <= targets["error"])
        splits.append(r)
    return {"metric": metric, "choice": choice, "splits": splits, "targets": targets}


def write(result, path):
    t = result["targets"]
    with open(path, "w", encoding="utf-8") as f:
        f.write("**Prediction across tasks** (declared in experiments/prediction_declaration.json "
                "before it was computed). The metric, chosen on the single-image task by its "
                "family-left-out error (" + ", ".join(
                    f"`{m}` {fmt(v)}" for m, v in result["choice"].items()) +
                f"): `{result['metric']}`. Each split fits the isotonic map on one side and "
                "predicts the other's accuracy per (seed, budget, policy); skill = 1 − error / "
                "the memory-only map's error, with a 95% interval over the predicted side's "
                f"policy families drawn with replacement. Targets: skill ≥ {t['skill']} at the "
                f"interval's lower end (scale-free), error ≤ {t['error']}.\n\n"
                "| split | points (families) | error | memory alone | skill [95%] | skill target "
                "| error target |\n|---|---|---|---|---|---|---|\n")
        for r in result["splits"]:
            f.write(f"| {r['name']} | {r['points']} ({r['families']}) | {fmt(r['error'])} | "
                    f"{fmt(r['error_memory_only'])} | {fmt(r['skill'], '+.2f')} "
                    f"[{fmt(r['skill_ci'][0], '+.2f')}, {fmt(r['skill_ci'][1], '+.2f')}] | "
                    f"{'met' if r['skill_met'] else 'not met'} | "
                    f"{'met' if r['error_met'] else 'not met'} |\n")


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--declaration", required=True)
    ap.add_argument("--task", action="append", default=[], metavar="NAME=DIR",
                    help="a task's report directory (vlm_eval_report.py's OUT); repeatable")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    with open(a.declaration, encoding="utf-8") as f:
        declaration = json.load(f)
    unknown = [m for m in declaration["candidates"] if m not in RISES_WITH]
    if unknown:
        fail(f"{a.declaration}: no direction known for {', '.join(unknown)}")
    tasks = {}
    for item in a.task:
        name, sep, directory = item.partition("=")
        if not sep:
            fail(f"--task {item}: expected NAME=DIR")
        tasks[name] = directory
    result = run(declaration, tasks)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "transfer.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    write(result, os.path.join(a.out, "transfer.md"))
    print(open(os.path.join(a.out, "transfer.md"), encoding="utf-8").read())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
