#!/usr/bin/env python3
"""Does replay predict what eviction does to the model? Joins `kvsim replay --summary` files and
`kvsim live evaluate --summary` files of the same policies and budgets, and reports, per
(policy, budget): replay's mean mass recall and output errors on the captured trace, and the live
perplexity of the reference continuations under the policy and under the full cache; then,
across the configurations, Spearman's rank correlation between each replay metric and the live
perplexity increase.

    replay_vs_live.py --replay B=replay_B.csv ... --live B=live_B.csv ... --out DIR

Perplexity over a set of samples is exp(Σ token NLL / Σ tokens) (from ref_nll and ref_tokens);
the increase is that of the policy minus that of the full cache. Writes DIR/replay_vs_live.csv,
DIR/by_image.csv (one row per budget, policy and sample: the live ΔNLL beside replay's metrics on
that sample, what kvsim.report.prediction_card reads),
DIR/replay_vs_live.md (the table and the correlations) and, as PNG and PDF,
DIR/perplexity_vs_budget and DIR/replay_vs_live_perplexity. Needs numpy and matplotlib.
"""
import argparse
import csv
import gzip
import math
import os
import sys
from collections import defaultdict

import numpy as np

from .csv_table import write_csv
from .figure_style import new_figure, policy_style, save

REPLAY_METRICS = [("mean_mass_recall", "replay mass recall", -1),
                  ("mean_output_rel_error", "replay output error ‖o − ô‖/‖o‖", 1),
                  ("mean_output_value_error", "replay output error ‖o − ô‖/Σp‖v‖", 1)]


def ranks(x):
    """Ranks from 1, ties sharing their mean rank."""
    x = np.asarray(x, dtype=float)
    order = np.argsort(x, kind="stable")
    r = np.empty(len(x))
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and x[order[j + 1]] == x[order[i]]:
            j += 1
        r[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return r


def spearman(x, y):
    """Spearman's ρ: Pearson's correlation of the ranks (NaN with fewer than 3 points or a
    constant side)."""
    if len(x) < 3:
        return float("nan")
    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def parse_pairs(items, what):
    out = []
    for item in items:
        if "=" not in item:
            sys.exit(f"replay_vs_live: {what} '{item}': expected BUDGET=FILE")
        budget, path = item.split("=", 1)
        if not os.path.exists(path):
            sys.exit(f"replay_vs_live: {what} {path}: no such file")
        out.append((budget, path))
    return out


def open_table(path):
    """A result CSV for reading, gzip-compressed when its name ends in .gz (the committed results
    of experiments/results/)."""
    return gzip.open(path, "rt", newline="") if path.endswith(".gz") else open(path, newline="")


def read_replay(pairs):
    """(policy, budget) -> the summary's overall row (sample = layer = all)."""
    out = {}
    for budget, path in pairs:
        with open_table(path) as f:
            for r in csv.DictReader(f):
                if r["sample"] == "all" and r["layer"] == "all":
                    out[(r["policy"], budget)] = {
                        m: float(r[m]) if r[m] else float("nan")
                        for m in ["mean_cache_size"] + [m for m, _, _ in REPLAY_METRICS]}
    return out


def dnll_intervals(pairs):
    """(policy, budget) -> the mean over samples of each sample's ΔNLL (ref_nll − ref_nll_full,
    nats per token), with its 95% bootstrap interval over the samples (kvsim.summarize)."""
    import pandas as pd

    from .. import summarize

    out = {}
    for budget, path in pairs:
        t = pd.read_csv(path, dtype={"sample": str})
        t = t[(t["sample"] != "all") & (t["ref_tokens"] > 0)]
        s = summarize({"policy": t["policy"], "sample": t["sample"],
                       "dnll": t["ref_nll"] - t["ref_nll_full"]}, "dnll")
        for _, r in s.iterrows():
            out[(r["policy"], budget)] = {"dnll": r["mean"], "dnll_ci_low": r["ci_low"],
                                          "dnll_ci_high": r["ci_high"], "n": int(r["n"])}
    return out


def read_live(pairs):
    """(policy, budget) -> perplexity over the samples under the policy and the full cache."""
    sums = defaultdict(lambda: [0.0, 0.0, 0, 0])  # Σ nll·n, Σ nll_full·n, Σ n, samples
    for budget, path in pairs:
        with open_table(path) as f:
            for r in csv.DictReader(f):
                if r["sample"] == "all" or not r.get("ref_tokens") or float(r["ref_tokens"]) == 0:
                    continue
                n = int(r["ref_tokens"])
                s = sums[(r["policy"], budget)]
                s[0] += float(r["ref_nll"]) * n
                s[1] += float(r["ref_nll_full"]) * n
                s[2] += n
                s[3] += 1
    return {k: {"ppl": math.exp(a / n), "ppl_full": math.exp(b / n), "tokens": n, "samples": m}
            for k, (a, b, n, m) in sums.items()}


def by_image(replays, lives):
    """One row per (budget, policy, sample): the live ΔNLL of the reference (nats per token), the
    memory held and the teacher-forced KL, beside replay's output error and mass recall on that
    sample (its layer rows pooled): what kvsim.report.prediction_card fits."""
    import pandas as pd

    frames = []
    for (budget, rpath), (lbudget, lpath) in zip(replays, lives):
        if budget != lbudget:
            sys.exit(f"replay_vs_live: --replay and --live list budgets in another order "
                     f"({budget} and {lbudget})")
        r = pd.read_csv(rpath, dtype={"sample": str})
        r = r[r["sample"] != "all"].copy()
        for m in ("mean_output_rel_error", "mean_mass_recall"):
            r[m] = r[m] * r["rows"]
        g = r.groupby(["policy", "sample"])[["mean_output_rel_error", "mean_mass_recall",
                                             "rows"]].sum()
        rep = pd.DataFrame({"replay_output_rel_error": g["mean_output_rel_error"] / g["rows"],
                            "replay_mass_recall": g["mean_mass_recall"] / g["rows"]}).reset_index()
        lv = pd.read_csv(lpath, dtype={"sample": str})
        lv = lv[lv["sample"] != "all"]
        lv = pd.DataFrame({"policy": lv["policy"], "sample": lv["sample"],
                           "dnll": lv["ref_nll"] - lv["ref_nll_full"],
                           "kv_fraction": lv["kv_fraction"], "mean_kl": lv["mean_kl"]})
        m = lv.merge(rep, on=["policy", "sample"])
        m.insert(0, "budget", budget.rstrip("%"))
        frames.append(m)
    out = pd.concat(frames, ignore_index=True)
    return out[out["policy"] != "full"]


def budget_key(b):
    try:
        return float(b.rstrip("%"))
    except ValueError:
        return float("inf")


def _joined_rows(replay, live, dnll):
    """One row per (policy, budget) in both the replay and the live files."""
    rows = []
    for key in sorted(set(replay) & set(live), key=lambda k: (k[0], budget_key(k[1]))):
        row = {"policy": key[0], "budget": key[1], **replay[key], **live[key], **dnll[key]}
        row["ppl_increase"] = row["ppl"] - row["ppl_full"]
        rows.append(row)
    return rows


def _write_csv(rows, out):
    columns = ["policy", "budget", "mean_cache_size"] + [m for m, _, _ in REPLAY_METRICS] + [
        "ppl", "ppl_full", "ppl_increase", "tokens", "samples", "dnll", "dnll_ci_low",
        "dnll_ci_high"]
    with open(os.path.join(out, "replay_vs_live.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, columns, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def _write_markdown(rows, evicting, rho, out):
    with open(os.path.join(out, "replay_vs_live.md"), "w") as f:
        f.write("| policy | budget | held | recall | out_rel_err | out_v_err | perplexity | full | "
                "increase | ΔNLL per sample [95%] |\n|---|---|---|---|---|---|---|---|---|---|\n")
        for r in rows:
            f.write(f"| {r['policy']} | {r['budget']} | {r['mean_cache_size']:.1f} | "
                    f"{r['mean_mass_recall']:.4f} | "
                    f"{r['mean_output_rel_error']:.4f} | {r['mean_output_value_error']:.4f} | "
                    f"{r['ppl']:.3f} | {r['ppl_full']:.3f} | {r['ppl_increase']:+.3f} | "
                    f"{r['dnll']:+.3f} [{r['dnll_ci_low']:+.3f}, {r['dnll_ci_high']:+.3f}] |\n")
        n = rows[0]["n"]
        f.write(f"\nn = {n} samples; ΔNLL: the mean over samples of the reference's NLL under the "
                "policy minus under the full cache (nats per token), with its 95% percentile "
                "bootstrap interval over the samples.\n")
        f.write(f"\nSpearman ρ with the perplexity increase, over {len(evicting)} "
                "configurations (every policy but `full`, every budget):\n\n")
        for m, label, _ in REPLAY_METRICS:
            f.write(f"- {label}: ρ = {rho[m]:+.3f}\n")


def _figures(rows, rho, out):
    written = []
    fig, ax = new_figure(figsize=(7, 4.2))
    by_policy = defaultdict(list)
    for r in rows:
        by_policy[r["policy"]].append(r)
    for policy, rs in sorted(by_policy.items()):
        rs = sorted(rs, key=lambda r: budget_key(r["budget"]))
        ax.plot([budget_key(r["budget"]) for r in rs], [r["ppl"] for r in rs], label=policy,
                **policy_style(policy))
    full = rows[0]["ppl_full"]
    ax.axhline(full, color="black", lw=0.8, ls=":", label=f"full cache ({full:.3f})")
    ax.set(title="Live perplexity of the reference continuations", xlabel="budget (% of the prompt)",
           ylabel="perplexity (exp of mean token NLL)")
    ax.legend(fontsize=7, ncol=2)
    save(fig, out, "perplexity_vs_budget", written)
    fig, axes = new_figure(1, len(REPLAY_METRICS), figsize=(5 * len(REPLAY_METRICS), 4))
    for ax, (m, label, _) in zip(axes, REPLAY_METRICS):
        for policy, rs in sorted(by_policy.items()):
            if policy == "full":
                continue
            ax.scatter([r[m] for r in rs], [r["ppl_increase"] for r in rs], label=policy,
                       color=policy_style(policy)["color"], marker=policy_style(policy)["marker"])
        ax.set(title=f"Spearman ρ = {rho[m]:+.2f}", xlabel=label, ylabel="live perplexity increase")
    axes[0].legend(fontsize=7)
    save(fig, out, "replay_vs_live_perplexity", written)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--replay", nargs="+", required=True, help="BUDGET=replay summary CSV")
    ap.add_argument("--live", nargs="+", required=True, help="BUDGET=live evaluate summary CSV")
    ap.add_argument("--out", required=True, help="output directory")
    a = ap.parse_args(argv)
    replay = read_replay(parse_pairs(a.replay, "--replay"))
    live = read_live(parse_pairs(a.live, "--live"))
    dnll = dnll_intervals(parse_pairs(a.live, "--live"))
    rows = _joined_rows(replay, live, dnll)
    if not rows:
        sys.exit("replay_vs_live: no (policy, budget) is in both the replay and the live files")
    os.makedirs(a.out, exist_ok=True)
    _write_csv(rows, a.out)
    write_csv(by_image(parse_pairs(a.replay, "--replay"), parse_pairs(a.live, "--live")),
              os.path.join(a.out, "by_image.csv"))
    evicting = [r for r in rows if r["policy"] != "full"]
    inc = [r["ppl_increase"] for r in evicting]
    rho = {m: spearman([r[m] for r in evicting], inc) for m, _, _ in REPLAY_METRICS}
    _write_markdown(rows, evicting, rho, a.out)
    _figures(rows, rho, a.out)
    print(open(os.path.join(a.out, "replay_vs_live.md")).read())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
