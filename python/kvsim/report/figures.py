#!/usr/bin/env python3
"""Regenerates the papers' figures from kvsim's result files (never from stdout).

    python3 -m kvsim.report.figures RESULTS [RESULTS ...] --out DIR   (what `kvsim figures` runs)

RESULTS are files or directories holding them:
  * `kvsim stats` files (HDF5, attribute kind = kvsim-stats): sparsity by layer (HAE Fig. 3),
    cumulative-attention variance (HAE Fig. 2), PPCI across layers and steps (A-VL Fig. 4-5),
    layer-similarity heatmap (ST3 Fig. 3), entropy by layer (MEDA Fig. 2), key geometry (nearest-key
    cosine, key/value similarity correlation), head modality preference
    (MadaKV Fig. 2b), attention share vs generated length (ST3 Fig. 4b, A-VL Fig. 1), per
    sample; with several samples, also the layer profiles' mean and 95% interval over samples
    (TAG_across_samples);
  * `kvsim replay --out` CSVs (with their .policies.csv): mass recall and hit rate by layer per
    policy (a policy's runs over seeds as one line with their range shaded; the policies that
    size their caches themselves in a panel of their own), and a budget-vs-error curve for every
    policy replayed at two budgets or more;
  * `kvsim replay --summary` CSVs: recall and output error per policy with their 95% intervals at
    the budget, and output error against the memory each policy held (NAME_at_equal_memory);
  * `kvsim sweep` results.csv files: the sweep report of sweep_report.py (table, one figure per
    swept parameter, Pareto plots of KV memory against recall and error), in a sub-directory.
Every figure is written as PNG and PDF. Needs Debian's python3-matplotlib, -numpy and -h5py.
"""
import argparse
import csv
import glob
import os
import sys
import warnings
from collections import defaultdict

import matplotlib
import numpy as np

# Metrics that do not apply (no image tokens, no decode steps) are NaN in the result files; their
# means are NaN too, which the plots leave blank.
warnings.filterwarnings("ignore", message="Mean of empty slice")
warnings.filterwarnings("ignore", message="All-NaN slice encountered")

from . import sweep_report
from .figure_style import (draw_intervals, label_points, layer_axis, memory_axes,  # noqa: F401
                           new_figure, policy_colour, policy_style, readable_legend, save,
                           seed_group)


def find_inputs(paths):
    stats, replays, sweeps, live_steps, live_summaries, summaries = [], [], [], [], [], []
    for p in paths:
        files = sorted(glob.glob(os.path.join(p, "*"))) if os.path.isdir(p) else [p]
        for f in files:
            if f.endswith(".policies.csv") or f.endswith(".partial"):
                continue
            if f.endswith(".csv"):
                with open(f, newline="") as fh:
                    header = fh.readline()
                if header.startswith("policy,sample,layer,kv_head,step"):
                    replays.append(f)
                elif header.startswith("policy,sample,layer,rows,mean_cache_size"):
                    summaries.append(f)
                elif header.startswith("trace,trace_hash,sample,label"):
                    sweeps.append(f)
                elif header.startswith("policy,sample,step,position,kl,top1_agree"):
                    live_steps.append(f)
                elif header.startswith(("policy,sample,budget,prompt_len,gen_len,mean_kl",
                                        "policy,sample,prompt_len,gen_len,mean_kl")):
                    live_summaries.append(f)
            elif f.endswith(".h5"):
                import h5py
                try:
                    with h5py.File(f, "r") as h:
                        if h.attrs.get("kind") == "kvsim-stats":
                            stats.append(f)
                except OSError:
                    pass
    return stats, replays, sweeps, live_steps, live_summaries, summaries


def mean_and_interval(values, resamples=2000, seed=0):
    """values [samples, ...]: the mean over samples and its 95% percentile bootstrap interval
    (resampling samples, seeded, as the result tables' intervals: docs/outputs.md); NaN bounds
    with one sample."""
    values = np.asarray(values, dtype=float)
    mean = np.nanmean(values, axis=0)
    if values.shape[0] < 2:
        return mean, np.full_like(mean, np.nan), np.full_like(mean, np.nan)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, values.shape[0], size=(resamples, values.shape[0]))
    means = np.nanmean(values[draws], axis=1)
    return mean, np.nanpercentile(means, 2.5, axis=0), np.nanpercentile(means, 97.5, axis=0)


def ratio_interval(num, den, resamples=2000, seed=0):
    """The 95% percentile bootstrap interval of Σ num / Σ den over samples (each sample its sum
    and its count of rows, so the statistic is the pooled mean the replay tables print: the
    method of analysis/bootstrap.hpp, numpy's seeded stream in place of SplitMix64); NaN with
    fewer than two samples."""
    num, den = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    if len(num) < 2:
        return np.nan, np.nan
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(num), size=(resamples, len(num)))
    ratios = num[draws].sum(axis=1) / den[draws].sum(axis=1)
    return np.percentile(ratios, 2.5), np.percentile(ratios, 97.5)


def stats_across_samples_figure(f, tag):
    """The layer profiles of every sample of a stats file as their mean with a 95% interval over
    samples: ε-sparsity by key modality, entropy and cross-modal entropy, PPCI against layer 0,
    and the variance of cumulative attention."""
    groups = list(f["samples"].values())
    ppci_p = [float(x) for x in str(f.attrs["ppci"]).split(",")]
    fig, axes = new_figure(2, 2, figsize=(11, 7))

    def band(ax, values, label, marker="o", scale=1.0):
        mean, lo, hi = mean_and_interval(values)
        line = ax.plot(np.arange(len(mean)), scale * mean, marker=marker, ms=3, label=label)[0]
        ax.fill_between(np.arange(len(mean)), scale * lo, scale * hi, alpha=0.2,
                        color=line.get_color(), linewidth=0)

    sparsity = np.array([np.nanmean(g["sparsity_causal"][()], axis=1) for g in groups])
    for k, label in enumerate(["all keys", "text keys", "vision keys"]):
        band(axes[0][0], sparsity[:, :, k], label, scale=100)
    axes[0][0].set(title=f"ε-sparsity by layer (ε = {f.attrs['epsilon']:g})",
                   ylabel="entries ≤ ε (%)")
    band(axes[0][1], [g["entropy"][()] for g in groups], "attention entropy")
    band(axes[0][1], [g["cross_modal_entropy"][()] for g in groups],
         "cross-modal entropy $E_{CM}$", marker="s")
    axes[0][1].set(title="Attention entropy by layer", ylabel="entropy (nats)")
    for i, p in enumerate(ppci_p):
        band(axes[1][0], [g["ppci_layers"][i] for g in groups], f"{p:.0%} PPCI", scale=100)
    axes[1][0].set(title="PPCI of image tokens vs layer 0", ylabel="PPCI (%)", ylim=(0, 105))
    variance = np.array([np.nanmean(g["cumulative_variance"][()], axis=1) for g in groups])
    band(axes[1][1], variance[:, :, 0], "text tokens")
    band(axes[1][1], variance[:, :, 1], "vision tokens", marker="s")
    axes[1][1].set(title="Variance of cumulative attention", ylabel="variance of column sums",
                   yscale="log")
    for ax in axes.flat:
        ax.set_xlabel("layer")
        ax.legend(fontsize=8)
    fig.suptitle(f"{tag}: mean over {len(groups)} samples, shaded: 95% interval (bootstrap over "
                 "samples)", fontsize=9)
    return fig


def _sparsity_figure(f, g, layers, save_as):
    fig, ax = new_figure(figsize=(6, 3.5))
    sp = np.nanmean(g["sparsity_causal"][()], axis=1)
    for k, label in enumerate(["all keys", "text keys", "vision keys"]):
        ax.plot(layers, 100 * sp[:, k], marker="o", ms=3, label=label)
    ax.set(title=f"ε-sparsity by layer (ε = {f.attrs['epsilon']:g})", xlabel="layer",
           ylabel="entries ≤ ε (%)")
    ax.legend()
    save_as(fig, "sparsity")


def _variance_figure(g, layers, save_as):
    fig, ax = new_figure(figsize=(6, 3.5))
    var = np.nanmean(g["cumulative_variance"][()], axis=1)
    ax.semilogy(layers, var[:, 0], marker="o", ms=3, label="text tokens")
    ax.semilogy(layers, var[:, 1], marker="s", ms=3, label="vision tokens")
    ax.set(title="Variance of cumulative attention", xlabel="layer",
           ylabel="variance of column sums")
    ax.legend()
    save_as(fig, "cumulative_variance")


def _ppci_figure(g, layers, ppci_p, save_as):
    L = len(layers)
    fig, (a1, a2) = new_figure(1, 2, figsize=(10, 3.5))
    for i, p in enumerate(ppci_p):
        a1.plot(layers, 100 * g["ppci_layers"][i], marker="o", ms=3, label=f"{p:.0%} PPCI")
    a1.set(title="PPCI of image tokens vs layer 0", xlabel="layer", ylabel="PPCI (%)",
           ylim=(0, 105))
    a1.legend()
    steps = g["ppci_steps"][()]
    i50 = len(ppci_p) - 1
    for l in sorted(set([0, L // 4, L // 2, 3 * L // 4, L - 1])):
        a2.plot(100 * steps[i50, l], label=f"layer {l}")
    a2.set(title=f"{ppci_p[i50]:.0%} PPCI vs decode step 0", xlabel="decode step",
           ylabel="PPCI (%)", ylim=(0, 105))
    a2.legend(fontsize=8)
    save_as(fig, "ppci")


def _layer_similarity_figure(g, save_as):
    fig, ax = new_figure(figsize=(5, 4.2))
    im = ax.imshow(g["layer_cosine"][()], vmin=0, vmax=1, cmap="viridis", origin="lower")
    ax.set(title="Cosine similarity of attention between layers", xlabel="layer",
           ylabel="layer")
    fig.colorbar(im, ax=ax, label="cosine similarity")
    save_as(fig, "layer_similarity")


def _entropy_figure(g, layers, save_as):
    fig, ax = new_figure(figsize=(6, 3.5))
    ax.plot(layers, g["entropy"][()], marker="o", ms=3, label="attention entropy")
    ax.plot(layers, g["cross_modal_entropy"][()], marker="s", ms=3,
            label="cross-modal entropy $E_{CM}$")
    ax.set(title="Attention entropy by layer", xlabel="layer", ylabel="entropy (nats)")
    ax.legend()
    save_as(fig, "entropy")


def _key_similarity_figure(f, g, layers, save_as):
    fig, (a1, a2) = new_figure(1, 2, figsize=(10, 3.5))
    kq = [float(x) for x in str(f.attrs["key_quantiles"]).split(",")]
    near = g["key_nearest_cosine"][()]
    mid = int(np.argmin([abs(q - 0.5) for q in kq]))
    for m, (label, colour) in enumerate([("text keys", "C0"), ("vision keys", "C1")]):
        a1.plot(layers, near[:, m, mid], marker="o", ms=3, color=colour,
                label=f"{label}, q = {kq[mid]:g}")
        a1.fill_between(layers, near[:, m, 0], near[:, m, -1], color=colour, alpha=0.2)
    a1.set(title="Cosine of each key to its nearest other key", xlabel="layer",
           ylabel="cosine", ylim=(-0.05, 1.05))
    a1.legend(fontsize=8)
    corr = g["key_value_correlation"][()]
    a2.plot(layers, corr[:, 0], marker="o", ms=3, label="text pairs")
    a2.plot(layers, corr[:, 1], marker="s", ms=3, label="vision pairs")
    a2.set(title="Key- vs value-similarity correlation", xlabel="layer",
           ylabel="Pearson r", ylim=(-1.05, 1.05))
    a2.legend(fontsize=8)
    save_as(fig, "key_similarity")


def _head_preference_figure(g, save_as):
    fig, ax = new_figure(figsize=(7, 4))
    im = ax.imshow(100 * g["modality_share"][:, :, 1].T, vmin=0, vmax=100,
                   cmap="coolwarm", origin="lower", aspect="auto")
    ax.set(title="Per-head modality preference", xlabel="layer", ylabel="head")
    fig.colorbar(im, ax=ax, label="attention on vision tokens (%)")
    save_as(fig, "head_preference")


def _segment_share_figure(g, save_as):
    seg = g["segment_share"][()]
    if seg.shape[1] == 0:
        return
    fig, ax = new_figure(figsize=(6, 3.5))
    mean = np.nanmean(seg, axis=0)
    for k, label in enumerate(["system", "image", "user instruction", "generated"]):
        ax.plot(100 * mean[:, k], label=label)
    ax.set(title="Attention share vs generated length (mean over layers)",
           xlabel="generated tokens", ylabel="attention mass (%)", ylim=(0, 100))
    ax.legend()
    save_as(fig, "vision_share")


def stats_figures(path, out, written):
    import h5py
    tag = os.path.splitext(os.path.basename(path))[0]
    with h5py.File(path, "r") as f:
        ppci_p = [float(x) for x in str(f.attrs["ppci"]).split(",")]
        if len(f["samples"]) > 1:
            save(stats_across_samples_figure(f, tag), out, f"{tag}_across_samples", written)
        for name, g in f["samples"].items():
            layers = np.arange(g["entropy"].shape[0])

            def save_as(fig, what, name=name):
                save(fig, out, f"{tag}_{name}_{what}", written, context=f"{tag}, sample {name}")

            _sparsity_figure(f, g, layers, save_as)
            _variance_figure(g, layers, save_as)
            _ppci_figure(g, layers, ppci_p, save_as)
            _layer_similarity_figure(g, save_as)
            _entropy_figure(g, layers, save_as)
            if "key_nearest_cosine" in g:
                _key_similarity_figure(f, g, layers, save_as)
            _head_preference_figure(g, save_as)
            _segment_share_figure(g, save_as)


class ReplayMeans:
    """One replay CSV reduced while it is read (the per-step file of one demo sample is ~90 MB):
    per label, sums by layer of the plotted columns, and overall and per-sample sums of what the
    budget figure needs (its points and their intervals over samples)."""

    COLUMNS = ("policy", "sample", "layer", "mass_recall", "hit_rate_top10", "cache_size",
               "output_rel_error")

    def __init__(self, path=None, rows=None, params=None):
        """From a replay CSV at `path` (and its .policies.csv), or from `rows`: tuples of
        COLUMNS, empty strings or NaN where a value is missing, with `params` as
        {label: (policy, {key: value})}."""
        self.by_layer = defaultdict(lambda: defaultdict(lambda: [0.0, 0]))  # (label, col) -> layer
        self.total = defaultdict(lambda: [0.0, 0, 0.0, 0, 0.0, 0])  # cache, n, err, n_err, recall
        # label -> sample -> [recall, n, err, n_err]: the table's per-sample sums
        self.by_sample = defaultdict(lambda: defaultdict(lambda: [0.0, 0, 0.0, 0]))
        self.has_hits = False
        self.params = dict(params or {})
        if path is not None:
            with open(path, newline="") as f:
                reader = csv.reader(f)
                col = {name: i for i, name in enumerate(next(reader))}
                index = [col[c] for c in self.COLUMNS]
                for r in reader:
                    self.add(*(r[i] for i in index))
            self.params.update(read_policies_sidecar(path))
        for r in rows or ():
            self.add(*r)
        self.labels = list(self.total)

    def add(self, label, sample, layer, recall, hit, cache, error):
        missing = ("", None)
        layer, recall = int(layer), float(recall)
        acc = self.by_layer[(label, "mass_recall")][layer]
        acc[0] += recall; acc[1] += 1
        if hit not in missing and hit == hit:  # not NaN
            self.has_hits = True
            acc = self.by_layer[(label, "hit_rate_top10")][layer]
            acc[0] += float(hit); acc[1] += 1
        t = self.total[label]
        t[0] += float(cache); t[1] += 1; t[4] += recall
        s = self.by_sample[label][str(sample)]
        s[0] += recall; s[1] += 1
        if error not in missing and error == error:
            t[2] += float(error); t[3] += 1
            s[2] += float(error); s[3] += 1

    def by_layer_of(self, label, column):
        per = self.by_layer[(label, column)]
        layers = sorted(per)
        return layers, [per[l][0] / per[l][1] for l in layers]


def read_policies_sidecar(path):
    """{label: (policy, {key: value})} from the .policies.csv beside a replay CSV, if any."""
    side = path[:-4] + ".policies.csv" if path.endswith(".csv") else path + ".policies.csv"
    out = {}
    if os.path.exists(side):
        with open(side, newline="") as f:
            for r in csv.DictReader(f):
                out[r["label"]] = (r["policy"], dict(
                    kv.split("=", 1) for kv in r["params"].split(",") if "=" in kv))
    return out


def seed_groups(labels):
    """{shown label: member labels}, in order of first appearance: the runs of one policy over
    seeds (NAME@seedK) as one, shown as "NAME (K seeds)"; every other label as itself."""
    groups = {}
    for label in labels:
        base, _, tag = label.partition("@")
        groups.setdefault(base if tag.startswith("seed") else label, []).append(label)
    return {(f"{k} ({len(v)} seeds)" if len(v) > 1 else v[0]): v for k, v in groups.items()}


def sizes_itself(m, label):
    """Whether a replayed label has no budget (its .policies.csv lists none) and is not the full
    cache: a policy that sizes its cache itself, drawn apart from the budgeted ones."""
    policy, params = m.params.get(label, (label, {"budget": "?"}))
    return "budget" not in params and policy != "full"


def recall_by_layer_figure(m, where):
    """Mean mass recall (and hit rate, when the replay had --diagnostics) by layer, per label: a
    policy's runs over seeds as one line, their range shaded; the policies that size their caches
    themselves in a panel of their own, never under the budget's title."""
    columns = [("mass_recall", "mass recall", "recall by layer")]
    if m.has_hits:
        columns.append(("hit_rate_top10", "hit rate of the top 10% keys", "hit rate by layer"))
    groups = seed_groups(m.labels)
    panels = [(where, {k: v for k, v in groups.items() if not sizes_itself(m, v[0])})]
    apart = {k: v for k, v in groups.items() if sizes_itself(m, v[0])}
    if apart:
        panels.append(("sizing their caches themselves (no budget)", apart))
    fig, axes = new_figure(len(columns), len(panels),
                           figsize=(6.5 * len(panels), 4.2 * len(columns)), squeeze=False)
    for row, (column, ylabel, title) in enumerate(columns):
        for ax, (panel_title, shown) in zip(axes[row], panels):
            for name, members in shown.items():
                layers, _ = m.by_layer_of(members[0], column)
                runs = np.array([m.by_layer_of(label, column)[1] for label in members])
                shown_as = name + ("; shaded: their range" if len(members) > 1 else "")
                ax.plot(layers, runs.mean(axis=0), ms=3, label=shown_as, **policy_style(name))
                if len(members) > 1:
                    ax.fill_between(layers, runs.min(axis=0), runs.max(axis=0), alpha=0.2,
                                    color=policy_style(name)["color"], linewidth=0)
            ax.set(title=f"{panel_title}: mean {title}", xlabel="layer", ylabel=ylabel,
                   ylim=(0, 1.02))
            layer_axis(ax)
    readable_legend(fig, axes[0][-1], len(groups))
    return fig


def summary_figure(path):
    """A `replay --summary` file's overall rows: per policy, mean recall and output error with
    their 95% intervals over samples (the table's own), the runs over seeds as their pooled row;
    the budgeted policies at their budget in table order (no order is drawn that the intervals do
    not show), and every policy against the memory it held, those sizing themselves hollow."""
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["sample"] == "all" and r["layer"] == "all"]
    groups = {r["policy"] for r in rows if int(r["seeds"] or 1) > 1}
    rows = [r for r in rows if r["policy"].partition("@")[0] not in groups or
            r["policy"] in groups]  # a seed group's pooled row, not its runs
    budgeted = [r for r in rows if r["budget_entries"]]
    fig, axes = new_figure(1, 3, figsize=(15, max(3.6, 1.2 + 0.3 * len(rows))))

    def shown(r):
        return r["policy"] + (f" ({r['seeds']} seeds)" if r["policy"] in groups else "")

    def number(r, column):
        return float(r[column]) if r.get(column) else np.nan

    for ax, (metric, interval, label) in zip(axes[:2], (
            ("mean_mass_recall", "mass_recall", "mass recall"),
            ("mean_output_rel_error", "output_rel_error", "output error ‖o − ô‖/‖o‖"))):
        for i, r in enumerate(budgeted):
            name = shown(r)
            x = number(r, metric)
            lo, hi = number(r, f"{interval}_ci_low"), number(r, f"{interval}_ci_high")
            ax.errorbar([x], [i], xerr=[[x - lo], [hi - x]], fmt=policy_style(name)["marker"],
                        color=policy_style(name)["color"], capsize=3, label=name)
        ax.set_yticks(range(len(budgeted)), [shown(r) for r in budgeted], fontsize=8)
        ax.invert_yaxis()
        entries = sorted({r["budget_entries"] for r in budgeted}, key=float)
        ax.set_title(f"{label.split(' ‖')[0]} at the budget ({', '.join(entries)} entries)",
                     fontsize=9)
        ax.set_xlabel(label)
    ax = axes[2]
    for r in rows:
        name = shown(r)
        style = policy_style(name)
        x, y = number(r, "mean_cache_size"), number(r, "mean_output_rel_error")
        lo, hi = number(r, "output_rel_error_ci_low"), number(r, "output_rel_error_ci_high")
        hollow = not r["budget_entries"] and r["policy"] != "full"
        ax.errorbar([x], [y], yerr=[[y - lo], [hi - y]], fmt=style["marker"], color=style["color"],
                    mfc="none" if hollow else style["color"], capsize=3)
        ax.annotate(r["policy"], (x, y), fontsize=7, textcoords="offset points", xytext=(3, 3))
    ax.set_title("output error against the memory held", fontsize=9)
    ax.set(xlabel="KV entries held per head (mean while decoding)",
           ylabel="output error ‖o − ô‖/‖o‖")
    fig.suptitle(f"{os.path.basename(path)}: means over samples with their 95% intervals; "
                 "hollow: sizes its cache itself", fontsize=9)
    return fig


def replay_figures(paths, out, written, means=None):
    """Per replay (a CSV path, or a (tag, ReplayMeans) pair in `means`): recall by layer; over all
    of them, error and recall against the entries held for every policy replayed at two budgets
    or more, each point with its 95% interval over samples."""
    # (curve, budget as given) -> the sums of every file that replayed it: one point per budget
    # swept, placed at the entries it actually held; and per sample (file, sample) the sums its
    # interval resamples (a seeded policy's runs on one sample are one sample, as in the tables).
    points = defaultdict(lambda: [0.0, 0, 0.0, 0, 0.0, 0])
    samples = defaultdict(lambda: defaultdict(lambda: np.zeros(4)))
    names = defaultdict(set)  # curve -> the labels it was given
    seeded = False
    sources = [(os.path.splitext(os.path.basename(p))[0], None, p) for p in paths]
    sources += [(tag, m, None) for tag, m in means or ()]
    for tag, m, path in sources:
        m = m or ReplayMeans(path)
        budgets = sorted({p.get("budget", "") for _, p in m.params.values()} - {""})
        where = f"{tag}" + (f", budget {', '.join(budgets)}" if budgets else "")
        save(recall_by_layer_figure(m, where), out, f"{tag}_recall_by_layer", written)
        for label in m.labels:
            policy, p = m.params.get(label, (label, {}))
            if "budget" not in p:
                continue
            # A curve joins configurations that differ in their budget alone (hae and hae:table1
            # at one budget each are two points of two curves, not one line).
            # A random floor's seeds pool into one curve (the title says so).
            rest = tuple(sorted((k, v) for k, v in p.items()
                                if k not in ("budget", "compression_ratio", "seed")))
            seeded |= "seed" in p
            point = ((policy, rest), p["budget"])
            names[(policy, rest)].add(label.split("@")[0].split("[")[0])
            for i, x in enumerate(m.total[label]):
                points[point][i] += x
            for sample, sums in m.by_sample[label].items():
                samples[point][(tag, sample)] += sums
    # curve -> [(mean entries held, mean error, mean recall, budget as given, error interval,
    #            recall interval)]
    curves = defaultdict(list)
    for (key, budget), t in points.items():
        per = np.array(list(samples[(key, budget)].values()))
        recall_ci = ratio_interval(per[:, 0], per[:, 1])
        with_error = per[per[:, 3] > 0]
        error_ci = ratio_interval(with_error[:, 2], with_error[:, 3])
        curves[key].append((t[0] / t[1], t[2] / t[3] if t[3] else np.nan, t[4] / t[1], budget,
                            error_ci, recall_ci))
    curves = {key: pts for key, pts in curves.items() if len(pts) >= 2}
    multi = {}
    for key, pts in curves.items():
        name = min(names[key]) if len(names[key]) == 1 else key[0]
        # Several curves of one policy: each named by the parameters that tell them apart.
        siblings = [dict(k[1]) for k in curves if k[0] == key[0]]
        differ = sorted({k for s in siblings for k in s
                         if len({str(t.get(k)) for t in siblings}) > 1})
        if differ:
            name += " (" + ", ".join(f"{k}={dict(key[1]).get(k, '-')}" for k in differ) + ")"
        multi[name] = sorted(pts, key=lambda p: p[:4])
    if multi:
        budget_curves_figure(multi, seeded, out, written)


def budget_curves_figure(curves, seeded, out, written):
    """Output error and mass recall against the entries held, one curve per policy (name ->
    points of replay_figures), each point with its 95% interval over samples."""
    fig, (a1, a2) = new_figure(1, 2, figsize=(11, 4))
    samples_known = False
    for policy, pts in sorted(curves.items()):
        xs, errors, recalls, budgets, error_ci, recall_ci = zip(*pts)
        style = policy_style(policy)
        for ax, ys, ci in ((a1, errors, error_ci), (a2, recalls, recall_ci)):
            ax.plot(xs, ys, label=policy, **style)
            draw_intervals(ax, xs, [c[0] for c in ci], [c[1] for c in ci], style["color"])
            label_points(ax, xs, ys, budgets)
            samples_known |= any(np.isfinite(c[0]) for c in ci)
    held = "KV entries held per head (mean while decoding)"
    bars = "bars: 95% intervals over samples" if samples_known else "one sample: no intervals"
    notes = f"labels: budgets; {bars}" + ("; seeds pooled" if seeded else "")
    memory_axes(a2, a1, held, notes)
    readable_legend(fig, a2, len(curves))
    save(fig, out, "budget_vs_error", written)


def read_rows(paths):
    """The per-sample rows of result CSVs: overall rows (sample = all) are left out."""
    rows = []
    for path in paths:
        with open(path, newline="") as f:
            rows += [r for r in csv.DictReader(f) if r.get("sample") != "all"]
    return rows


def budget_number(text):
    """'20%' -> 20.0, '64' -> 64.0; None when empty or not a number."""
    try:
        return float(text.rstrip("%"))
    except (AttributeError, ValueError):
        return None


def accuracy_figure(rows, out, written):
    """Answer accuracy (the answer contains the reference, `answer_contains`) per policy against
    its budget and against the KV memory it held (`kv_fraction`), one point per (policy, budget)
    over the summaries given (several `live evaluate --summary` files: one per budget; a seeded
    policy's draws pooled); drawn when the summaries carry answer scores."""
    scored = [r for r in rows if r.get("answer_contains") not in (None, "")]
    if not scored:
        return
    groups = defaultdict(lambda: defaultdict(list))
    for r in scored:  # the draws of a seeded policy (random@seed0, ...) are one policy
        g = groups[(seed_group(r["policy"]), r.get("budget", ""))]
        for k in ("answer_contains", "full_answer_contains", "kv_fraction"):
            g[k].append(float(r[k]))
    by_policy = defaultdict(list)
    for (policy, budget), g in groups.items():
        by_policy[policy].append((budget_number(budget), np.mean(g["kv_fraction"]),
                                  np.mean(g["answer_contains"])))
    full = np.mean([np.mean(g["full_answer_contains"]) for g in groups.values()])
    fig, axes = new_figure(1, 2, figsize=(13, 4.6))
    for policy, points in sorted(by_policy.items()):
        style = policy_style(policy)
        points.sort(key=lambda p: (p[0] is None, p[0] or 0, p[1]))
        with_budget = [p for p in points if p[0] is not None]
        if with_budget:
            axes[0].plot([p[0] for p in with_budget], [p[2] for p in with_budget], label=policy,
                         **style)
        axes[1].plot([p[1] for p in points], [p[2] for p in points], label=policy, **style)
    for ax, xlabel in zip(axes, ("budget (the policy's own: % of the prompt, or entries)",
                                 "peak KV memory held / full cache")):
        ax.axhline(full, color="black", lw=0.8, ls=":", label=f"full cache ({full:.2f})")
        ax.set(xlabel=xlabel, ylabel="accuracy (answer contains the reference)",
               ylim=(-0.02, 1.02))
    axes[0].set_title("Live answer accuracy against budget")
    axes[1].set_title("Live answer accuracy against memory held")
    axes[1].legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))
    save(fig, out, "live_accuracy", written)


def _live_kl_figure(steps, out, written):
    by_step = defaultdict(lambda: defaultdict(list))
    for r in read_rows(steps):
        by_step[r["policy"]][int(r["step"])].append(float(r["kl"]))
    fig, ax = new_figure(figsize=(6, 4))
    for label, per in sorted(by_step.items()):
        xs = sorted(per)
        ax.plot(xs, [np.mean(per[x]) for x in xs], ms=3, label=label, **policy_style(label))
    ax.set(title="Live: KL(full || policy) per decode step", xlabel="decode step",
           ylabel="mean KL (nats), teacher-forced")
    ax.legend(fontsize=7, ncol=2)
    save(fig, out, "live_kl_by_step", written)


def _live_summary_figure(acc, labels, out, written):
    fig, axes = new_figure(1, 3, figsize=(15, 3.8))
    for ax, (key, title) in zip(axes, [("top1_agreement", "top-1 agreement (teacher-forced)"),
                                        ("answer_overlap", "greedy answer overlap (LCS)"),
                                        ("kv_fraction", "peak KV memory / full cache")]):
        means = [np.mean(acc[l][key]) for l in labels]
        spread = [np.std(acc[l][key]) for l in labels]  # over samples
        bars = ax.bar(range(len(labels)), means, yerr=spread, capsize=3,
                      color=[policy_colour(l) for l in labels])
        ax.bar_label(bars, labels=[f"{v:.2f}" for v in means], fontsize=6, padding=2)
        ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right", fontsize=7)
        ax.set(title=f"{title}\n(mean over samples; bars: ± one standard deviation)",
               ylim=(0, 1.15))
    save(fig, out, "live_summary", written)


def _live_perplexity_figure(summaries, out, written):
    """Reference perplexity (prompt files with reference_ids): over the samples, exp of the mean
    token NLL, per policy, the full cache's as a line."""
    ppl = defaultdict(lambda: [0.0, 0.0, 0])
    for r in read_rows(summaries):
        if r.get("ref_nll") and r.get("ref_tokens") and int(r["ref_tokens"]) > 0:
            t = ppl[r["policy"]]
            t[0] += float(r["ref_nll"]) * int(r["ref_tokens"])
            t[1] += float(r["ref_nll_full"]) * int(r["ref_tokens"])
            t[2] += int(r["ref_tokens"])
    if not ppl:
        return
    names = sorted(ppl)
    values = [np.exp(ppl[l][0] / ppl[l][2]) for l in names]
    full = np.exp(sum(t[1] for t in ppl.values()) / sum(t[2] for t in ppl.values()))
    fig, ax = new_figure(figsize=(max(5, 0.6 * len(names) + 2), 3.8))
    bars = ax.bar(range(len(names)), values, color=[policy_colour(l) for l in names])
    ax.bar_label(bars, labels=[f"{v:.2f}" for v in values], fontsize=6, padding=2)
    ax.axhline(full, color="black", lw=0.8, ls=":", label=f"full cache ({full:.2f})")
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=7)
    ax.set(title="Live: perplexity of the reference continuations\n(exp of the mean token NLL "
           "over samples)", ylabel="perplexity")
    ax.legend(fontsize=7, loc="lower right")
    save(fig, out, "live_perplexity", written)


def _replay_vs_live_figure(replays, acc, labels, out, written):
    recall = defaultdict(list)
    for r in read_rows(replays):
        recall[r["policy"]].append(float(r["mass_recall"]))
    common = [l for l in labels if l in recall]
    if not common:
        return
    fig, ax = new_figure(figsize=(5, 4))
    for l in common:
        ax.scatter(np.mean(recall[l]), np.mean(acc[l]["top1_agreement"]), label=l,
                   color=policy_colour(l))
    ax.set(title="Replay vs live", xlabel="replay: mean attention mass recall",
           ylabel="live: top-1 agreement", xlim=(0, 1.02), ylim=(0, 1.02))
    ax.legend(fontsize=7)
    save(fig, out, "replay_vs_live", written)


def live_figures(steps, summaries, replays, out, written):
    """`kvsim live evaluate` results: KL per decode step, agreement and memory per policy, and,
    with replay results of the same policies, replay's mass recall against live top-1 agreement."""
    if steps:
        _live_kl_figure(steps, out, written)
    if not summaries:
        return
    acc = defaultdict(lambda: defaultdict(list))
    for r in read_rows(summaries):
        for k in ("top1_agreement", "answer_overlap", "kv_fraction", "mean_kl"):
            acc[r["policy"]][k].append(float(r[k]))
    labels = sorted(acc)
    _live_summary_figure(acc, labels, out, written)
    _live_perplexity_figure(summaries, out, written)
    accuracy_figure(read_rows(summaries), out, written)
    if replays:
        _replay_vs_live_figure(replays, acc, labels, out, written)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", nargs="+", help="result files or directories")
    ap.add_argument("--out", required=True, help="output directory for PNG and PDF files")
    args = ap.parse_args(argv)
    missing = [p for p in args.results if not os.path.exists(p)]
    if missing:
        print("figures: no such file or directory: " + ", ".join(missing), file=sys.stderr)
        return 1
    matplotlib.use("Agg")
    os.makedirs(args.out, exist_ok=True)
    stats, replays, sweeps, live_steps, live_summaries, summaries = find_inputs(args.results)
    if not (stats or replays or sweeps or live_steps or live_summaries or summaries):
        print("figures: no kvsim result files (stats .h5, replay --out or --summary, sweep or "
              "live .csv) in " + ", ".join(args.results), file=sys.stderr)
        return 1
    written = []
    for path in summaries:
        stem = os.path.splitext(os.path.basename(path))[0]
        save(summary_figure(path), args.out, f"{stem}_at_equal_memory", written)
    for s in stats:
        stats_figures(s, args.out, written)
    if replays:
        replay_figures(replays, args.out, written)
    if live_steps or live_summaries:
        live_figures(live_steps, live_summaries, replays, args.out, written)
    for sw in sweeps:  # sweep results: the recipe report (table, per-parameter figures, Pareto)
        sub = os.path.join(args.out, os.path.basename(os.path.dirname(os.path.abspath(sw))) or "sweep")
        sweep_written = sweep_report.report(sw, sub)
        if not sweep_written:
            print(f"kvsim figures: {sw} has no rows; no sweep figures drawn from it", file=sys.stderr)
        written += sweep_written
    for w in written:
        print(w)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
