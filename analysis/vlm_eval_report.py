#!/usr/bin/env python3
"""Which policies keep the answer when image tokens are evicted? Joins, per (policy, budget), the
answer accuracy and reference NLL of `kvsim live evaluate --summary` on the assembled VLM with
replay's metrics on the captured trace (`kvsim replay --summary`: mass recall, output errors) and
the share of image and of text entries each policy still stored at the end of decoding (from
`--dump-decisions`), then reports the rank correlation of each replay metric with the live
accuracy loss and the ΔNLL.

    vlm_eval_report.py --trace T.h5 --replay B=R.csv ... --live B=L.csv ... \
        --decisions B=D.h5 ... [--control NAME=C.csv ...] [--build build.json] --out DIR

Accuracy: the share of samples whose greedy answer contains the reference class word
(`answer_contains`; `answer_exact` as well). Accuracy loss: the full cache's accuracy minus the
policy's. ΔNLL: Σ (ref_nll − ref_nll_full)·ref_tokens / Σ ref_tokens, nats per token. A policy
that sizes its cache itself (no budget: fastv, vtw, avl, st3) gives the same run at every budget
and enters the correlations once. Writes DIR/vlm_eval.csv, DIR/vlm_eval.md and, as PNG and PDF,
DIR/vlm_accuracy_vs_budget, DIR/vlm_accuracy_vs_memory, DIR/vlm_accuracy_vs_image_kept and
DIR/vlm_replay_vs_accuracy. Needs numpy, h5py and matplotlib.
"""
import argparse
import csv
import json
import os
import sys
from collections import defaultdict

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from figures import new_figure, policy_style, save  # noqa: E402
from replay_vs_live import budget_key, parse_pairs, spearman  # noqa: E402

REPLAY_METRICS = [("mean_mass_recall", "replay mass recall"),
                  ("mean_output_rel_error", "replay output error ‖o − ô‖/‖o‖"),
                  ("mean_output_value_error", "replay output error ‖o − ô‖/Σp‖v‖"),
                  ("image_kept", "image entries kept (replay)"),
                  ("text_kept", "text entries kept (replay)")]
LIVE_TARGETS = [("accuracy_loss", "live accuracy loss"), ("delta_nll", "live ΔNLL")]


def fail(message):
    sys.exit(f"vlm_eval_report: {message}")


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def number(x):
    return float(x) if x not in ("", None) else float("nan")


def read_replay(pairs):
    """(policy, budget) -> the summary's overall row."""
    out = {}
    for budget, path in pairs:
        for r in read_csv(path):
            if r["sample"] == "all" and r["layer"] == "all":
                row = {m: number(r[m]) for m in ["mean_cache_size", "mean_mass_recall",
                                                 "mean_output_rel_error",
                                                 "mean_output_value_error"]}
                row["has_budget"] = bool(r.get("budget_entries"))
                out[(r["policy"], budget)] = row
    return out


def read_live(pairs):
    """(policy, budget) -> accuracy, ΔNLL, agreement with the full cache and memory held."""
    groups = defaultdict(list)
    for budget, path in pairs:
        rows = read_csv(path)
        if rows and "answer_contains" not in rows[0]:
            fail(f"{path}: no answer_contains column (kvsim live evaluate without a vocabulary?)")
        for r in rows:
            if r["sample"] != "all":
                groups[(r["policy"], budget)].append(r)
    out = {}
    for key, rows in groups.items():
        n = np.array([number(r["ref_tokens"]) for r in rows])
        dnll = np.array([number(r["ref_nll"]) - number(r["ref_nll_full"]) for r in rows])
        out[key] = {
            "accuracy": np.mean([number(r["answer_contains"]) for r in rows]),
            "exact": np.mean([number(r["answer_exact"]) for r in rows]),
            "accuracy_full": np.mean([number(r["full_answer_contains"]) for r in rows]),
            "delta_nll": float((dnll * n).sum() / n.sum()),
            "token_match": np.mean([number(r["token_match"]) for r in rows]),
            "kv_fraction": np.mean([number(r["kv_fraction"]) for r in rows]),
            "samples": len(rows)}
        out[key]["accuracy_loss"] = out[key]["accuracy_full"] - out[key]["accuracy"]
    return out


def read_modality(trace):
    """sample -> (image positions, text positions) of the prompt; and L·Hkv."""
    import h5py

    with h5py.File(trace, "r") as f:
        layers = len(f["samples"][next(iter(f["samples"]))]["layers"])
        kv_heads = int(f.attrs["num_kv_heads"])
        out = {}
        for name, g in f["samples"].items():
            m = g["modality"][: int(g.attrs["prompt_len"])]
            out[name] = (set(np.flatnonzero(m != 0).tolist()), set(np.flatnonzero(m == 0).tolist()))
    return out, layers * kv_heads


def read_kept(pairs, modality, heads):
    """(policy, budget) -> share of the prompt's image and text entries (over layers and KV heads)
    neither evicted nor merged away by the end of decoding."""
    import h5py

    out = {}
    for budget, path in pairs:
        with h5py.File(path, "r") as f:
            for label, g in f.items():
                removed = [0, 0]
                total = [0, 0]
                for sample, (image, text) in modality.items():
                    total[0] += len(image) * heads
                    total[1] += len(text) * heads
                    if sample not in g["samples"]:
                        continue
                    for layer in g["samples"][sample]["layers"].values():
                        for head in layer["heads"].values():
                            gone = set()
                            for key in ("evicted", "merged"):
                                if key in head and head[key].shape[0]:
                                    gone |= set(head[key][:, 1].tolist())
                            removed[0] += len(gone & image)
                            removed[1] += len(gone & text)
                out[(label, budget)] = {"image_kept": 1 - removed[0] / max(total[0], 1),
                                        "text_kept": 1 - removed[1] / max(total[1], 1)}
    return out


def once(rows):
    """The rows with a policy that has no budget (the same run at every budget) kept once."""
    seen, out = set(), []
    for r in rows:
        if not r["has_budget"] and r["policy"] in seen:
            continue
        seen.add(r["policy"])
        out.append(r)
    return out


def correlations(rows):
    """Spearman ρ of each replay metric with each live target over the evicting configurations,
    a budget-less policy counted once."""
    points = [r for r in once(rows) if r["policy"] != "full"]
    rho = {(m, t): spearman([p[m] for p in points], [p[t] for p in points])
           for m, _ in REPLAY_METRICS for t, _ in LIVE_TARGETS}
    return rho, len(points)


def write_table(rows, rho, count, controls, build, path):
    with open(path, "w") as f:
        if build:
            f.write(f"Full cache, greedy: accuracy {build['full']['accuracy']:.3f} on "
                    f"{build['test_images']} held-out images (the build's own measurement).\n\n")
        for name, acc in controls.items():
            f.write(f"- control `{name}` (full cache, kvsim live): accuracy {acc:.3f}\n")
        f.write("\n| policy | budget | held (of full) | accuracy | exact | loss | ΔNLL | "
                "token match | recall | out_rel_err | image kept | text kept |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
        for r in once(rows):
            f.write(f"| {r['policy']} | {r['budget'] if r['has_budget'] else '-'} | "
                    f"{r['kv_fraction']:.3f} | {r['accuracy']:.3f} | {r['exact']:.3f} | "
                    f"{r['accuracy_loss']:+.3f} | {r['delta_nll']:+.3f} | {r['token_match']:.3f} | "
                    f"{r['mean_mass_recall']:.4f} | {r['mean_output_rel_error']:.4f} | "
                    f"{r['image_kept']:.3f} | {r['text_kept']:.3f} |\n")
        f.write(f"\nSpearman ρ over {count} configurations (every policy but `full`; a policy "
                "without a budget once):\n\n| replay metric | " +
                " | ".join(label for _, label in LIVE_TARGETS) + " |\n|---|" +
                "---|" * len(LIVE_TARGETS) + "\n")
        for m, label in REPLAY_METRICS:
            f.write(f"| {label} | " + " | ".join(f"{rho[(m, t)]:+.3f}" for t, _ in LIVE_TARGETS)
                    + " |\n")


def outside_legend(ax):
    """Some twenty policies: the legend goes right of the panel, clear of the points."""
    ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))


def figures(rows, rho, controls, out):
    written = []
    by_policy = defaultdict(list)
    for r in rows:
        by_policy[r["policy"]].append(r)
    full = rows[0]["accuracy_full"]

    def reference_lines(ax):
        ax.axhline(full, color="black", lw=0.8, ls=":", label=f"full cache ({full:.2f})")
        ax.axhline(0.1, color="grey", lw=0.8, ls="--", label="chance (10 classes)")

    fig, ax = new_figure(figsize=(10, 5))
    for policy, rs in sorted(by_policy.items()):
        if policy == "full":
            continue
        rs = sorted(rs, key=lambda r: budget_key(r["budget"]))
        ax.plot([budget_key(r["budget"]) for r in rs], [r["accuracy"] for r in rs], label=policy,
                **policy_style(policy))
    reference_lines(ax)
    ax.set(title="Answer accuracy of the assembled VLM (held-out Fashion-MNIST)",
           xlabel="budget (% of the prompt)", ylabel="accuracy (answer contains the class)")
    outside_legend(ax)
    save(fig, out, "vlm_accuracy_vs_budget", written)
    for stem, x, xlabel in (("vlm_accuracy_vs_memory", "kv_fraction",
                             "KV memory held while decoding (peak, share of the full cache)"),
                            ("vlm_accuracy_vs_image_kept", "image_kept",
                             "image entries still stored at the end (replay)")):
        fig, ax = new_figure(figsize=(10, 5))
        for policy, rs in sorted(by_policy.items()):
            style = policy_style(policy)
            ax.scatter([r[x] for r in rs], [r["accuracy"] for r in rs], label=policy,
                       color=style["color"], marker=style["marker"])
        reference_lines(ax)
        ax.set(title="Which policies keep the class when image tokens are evicted"
               if x == "image_kept" else "Answer accuracy against memory held",
               xlabel=xlabel, ylabel="accuracy (answer contains the class)")
        outside_legend(ax)
        save(fig, out, stem, written)
    fig, axes = new_figure(1, 3, figsize=(15, 4.2))
    for ax, m in zip(axes, ("mean_mass_recall", "mean_output_rel_error", "image_kept")):
        for policy, rs in sorted(by_policy.items()):
            if policy == "full":
                continue
            style = policy_style(policy)
            ax.scatter([r[m] for r in rs], [r["accuracy_loss"] for r in rs], label=policy,
                       color=style["color"], marker=style["marker"])
        label = dict(REPLAY_METRICS)[m]
        ax.set(title=f"Spearman ρ = {rho[(m, 'accuracy_loss')]:+.2f}", xlabel=label,
               ylabel="live accuracy loss")
    axes[0].legend(fontsize=6, ncol=2)
    save(fig, out, "vlm_replay_vs_accuracy", written)
    return written


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", required=True, help="the captured kvtrace file")
    ap.add_argument("--replay", nargs="+", required=True, help="BUDGET=replay summary CSV")
    ap.add_argument("--live", nargs="+", required=True, help="BUDGET=live evaluate summary CSV")
    ap.add_argument("--decisions", nargs="+", required=True, help="BUDGET=--dump-decisions file")
    ap.add_argument("--control", action="append", default=[],
                    help="NAME=live evaluate summary of a control prompt file")
    ap.add_argument("--build", help="the VLM's build.json")
    ap.add_argument("--out", required=True, help="output directory")
    a = ap.parse_args(argv)
    if not os.path.exists(a.trace):
        fail(f"{a.trace}: no such file")
    replay = read_replay(parse_pairs(a.replay, "--replay"))
    live = read_live(parse_pairs(a.live, "--live"))
    modality, heads = read_modality(a.trace)
    kept = read_kept(parse_pairs(a.decisions, "--decisions"), modality, heads)
    rows = []
    for key in sorted(set(replay) & set(live), key=lambda k: (k[0] != "full", k[0],
                                                              budget_key(k[1]))):
        rows.append({"policy": key[0], "budget": key[1], **replay[key], **live[key],
                     **kept.get(key, {"image_kept": 1.0, "text_kept": 1.0})})
    if not rows:
        fail("no (policy, budget) is in both the replay and the live files")
    controls = {}
    for item in a.control:
        name, _, path = item.partition("=")
        if not os.path.exists(path):
            fail(f"--control {item}: no such file")
        controls[name] = float(np.mean([number(r["full_answer_contains"]) for r in read_csv(path)
                                        if r["sample"] != "all"]))
    build = None
    if a.build:
        with open(a.build, encoding="utf-8") as f:
            build = json.load(f)
    os.makedirs(a.out, exist_ok=True)
    columns = ["policy", "budget", "has_budget", "kv_fraction", "mean_cache_size", "accuracy",
               "exact", "accuracy_full", "accuracy_loss", "delta_nll", "token_match",
               "mean_mass_recall", "mean_output_rel_error", "mean_output_value_error",
               "image_kept", "text_kept", "samples"]
    with open(os.path.join(a.out, "vlm_eval.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, columns, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    rho, count = correlations(rows)
    write_table(rows, rho, count, controls, build, os.path.join(a.out, "vlm_eval.md"))
    figures(rows, rho, controls, a.out)
    print(open(os.path.join(a.out, "vlm_eval.md")).read())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
