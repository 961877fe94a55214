#!/usr/bin/env python3
"""Table and figures of a `kvsim sweep` results file.

    sweep_report.py RESULTS.csv --out DIR

Writes DIR/table.csv and DIR/table.md (one row per configuration: mean mass recall, the two mean
output errors, mean cache size, KV memory per decode step summed over layers and heads, averaged
over the samples and traces), DIR/table_by_trace.csv/.md when the sweep has several traces (the
same per trace and configuration, first column `trace`), DIR/<policy>_<key>.png/.pdf (each swept
parameter against recall and error, averaged over the policy's other axes) and DIR/pareto.png/.pdf
(KV memory against recall and error, one point per configuration, with each policy's Pareto
front). Needs Debian's python3-matplotlib.
"""
import argparse
import csv
import os
import sys
from collections import defaultdict

import numpy as np

try:
    from .figures import new_figure, policy_colour, save  # inside the kvsim package
except ImportError:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from figures import new_figure, policy_colour, save


def parse_label(label):
    """'h2o[budget=10%,recent=50%]' -> ('h2o', {'budget': '10%', 'recent': '50%'})."""
    if "[" not in label:
        return label, {}
    name, rest = label.split("[", 1)
    return name, dict(kv.split("=", 1) for kv in rest.rstrip("]").split(","))


def axis_value(text):
    try:
        return float(text.rstrip("%"))
    except ValueError:
        return text


def read_results(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def intervals(rs, column):
    """n samples (trace, sample) and the 95% percentile-bootstrap interval of the column's mean
    over them (kvsim.summarize: docs/outputs.md); NaN bounds without the kvsim module."""
    samples = [(r["trace"], r["sample"]) for r in rs if r[column]]
    n = len(set(samples))
    try:
        import kvsim
    except ImportError:
        return n, float("nan"), float("nan")
    s = kvsim.summarize({"policy": ["c"] * len(samples),
                         "sample": [f"{t}/{x}" for t, x in samples],
                         column: [float(r[column]) for r in rs if r[column]]}, column)
    return n, float(s["ci_low"].iloc[0]), float(s["ci_high"].iloc[0])


def summarise(results, by_trace=False):
    """One row per configuration (per trace and configuration with by_trace) of a results file's
    rows, averaged over the rest: layers, KV heads, samples (and traces); with the number of
    samples and 95% intervals over them of the recall and the output error."""
    rows = defaultdict(list)
    for r in results:
        rows[(r["trace"] if by_trace else "", r["label"])].append(r)
    table = []
    for (trace, label), rs in rows.items():
        per_sample = defaultdict(float)
        for r in rs:
            per_sample[(r["trace"], r["sample"])] += float(r["mean_kv_bytes"] or 0)
        row = {"trace": trace} if by_trace else {}
        row.update({
            "label": label,
            "policy": rs[0]["policy"],
            "params": rs[0]["params"],
            "mean_mass_recall": np.mean([float(r["mean_mass_recall"]) for r in rs]),
            "mean_output_rel_error": mean_of(rs, "mean_output_rel_error"),
            "mean_output_value_error": mean_of(rs, "mean_output_value_error"),
            "mean_cache_size": np.mean([float(r["mean_cache_size"]) for r in rs]),
            "kv_mib_per_step": np.mean(list(per_sample.values())) / 2**20,
        })
        row["samples"], row["recall_ci_low"], row["recall_ci_high"] = intervals(
            rs, "mean_mass_recall")
        _, row["error_ci_low"], row["error_ci_high"] = intervals(rs, "mean_output_rel_error")
        table.append(row)
    return table


def mean_of(rows, column):
    """Mean of a column that is empty where the trace has no values (NaN if it always is)."""
    values = [float(r[column]) for r in rows if r[column]]
    return np.mean(values) if values else float("nan")


def write_tables(table, out, name="table"):
    cols = list(table[0].keys())
    with open(os.path.join(out, f"{name}.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for row in table:
            w.writerow(row)
    trace_col = "trace" in table[0]
    with open(os.path.join(out, f"{name}.md"), "w") as f:
        f.write(("| trace " if trace_col else "") +
                "| configuration | n | recall [95%] | output error [95%] | output error / value "
                "norm | mean cache | KV MiB/step |\n" + ("|---" if trace_col else "") +
                "|---|---|---|---|---|---|---|\n")
        for r in table:
            f.write((f"| {os.path.basename(r['trace'])} " if trace_col else "") +
                    f"| `{r['label']}` | {r['samples']} | {r['mean_mass_recall']:.4f} "
                    f"[{r['recall_ci_low']:.4f}, {r['recall_ci_high']:.4f}] | "
                    f"{r['mean_output_rel_error']:.4f} [{r['error_ci_low']:.4f}, "
                    f"{r['error_ci_high']:.4f}] | "
                    f"{r['mean_output_value_error']:.4f} | {r['mean_cache_size']:.1f} | "
                    f"{r['kv_mib_per_step']:.2f} |\n")
        f.write("\nn: samples (trace, sample); [95%]: percentile bootstrap over them (nan: one "
                "sample, or no kvsim module to compute it); means over layers, KV heads and "
                "samples.\n")


def axis_figures(table, out, written):
    by_policy = defaultdict(list)
    for r in table:
        name, axes = parse_label(r["label"])
        by_policy[name].append((axes, r))
    for name, entries in by_policy.items():
        keys = sorted({k for axes, _ in entries for k in axes})
        for key in keys:
            groups, raw = defaultdict(list), {}
            for axes, r in entries:
                if key in axes:
                    groups[axis_value(axes[key])].append(r)
                    raw[axis_value(axes[key])] = axes[key]  # as written, e.g. "20%"
            if len(groups) < 2:
                continue
            xs = sorted(groups, key=lambda v: (isinstance(v, str), v))
            fig, (a1, a2) = new_figure(1, 2, figsize=(10, 3.6))
            labels = [str(x) for x in xs]
            pos = np.arange(len(xs)) if any(isinstance(x, str) for x in xs) else np.array(xs, dtype=float)
            xlabel = key
            if key == "budget":
                # A budget is drawn where it landed: the entries each configuration really held
                # (prefill-only policies grow while decoding; some size their caches themselves).
                held = [np.mean([r["mean_cache_size"] for r in groups[x]]) for x in xs]
                order = np.argsort(held, kind="stable")
                xs = [xs[i] for i in order]
                labels = [raw[x] for x in xs]
                pos = np.array([held[i] for i in order])
                xlabel = "KV entries held per head while decoding (mean, measured)"
            a1.plot(pos, [np.mean([r["mean_mass_recall"] for r in groups[x]]) for x in xs], marker="o",
                    color=policy_colour(name))
            a2.plot(pos, [np.nanmean([r["mean_output_rel_error"] for r in groups[x]]) for x in xs],
                    marker="o", color=policy_colour(name))
            for ax, ylabel in ((a1, "mean mass recall"), (a2, "mean relative output error")):
                ax.set(xlabel=xlabel, ylabel=ylabel, title=f"{name}: {ylabel} vs {key}")
                if key == "budget":
                    for x, label, y in zip(pos, labels, ax.lines[0].get_ydata()):
                        ax.annotate(label, (x, y), fontsize=7, textcoords="offset points",
                                    xytext=(3, 3))
                elif any(isinstance(x, str) for x in xs):
                    ax.set_xticks(pos, labels)
            save(fig, out, f"{name}_{key}", written)


def held_figure(table, out, written):
    """Every policy swept over budgets as one curve, recall and output error against the KV
    entries it held while decoding (so policies that grow while decoding sit where they landed,
    not at their nominal budget)."""
    curves = defaultdict(list)
    for r in table:
        name, axes = parse_label(r["label"])
        if "budget" in axes:
            curves[name].append(r)
    curves = {k: sorted(v, key=lambda r: r["mean_cache_size"]) for k, v in curves.items()
              if len(v) >= 2}
    if not curves:
        return
    fig, (a1, a2) = new_figure(1, 2, figsize=(11, 4))
    for name, rs in sorted(curves.items()):
        x = [r["mean_cache_size"] for r in rs]
        a1.plot(x, [r["mean_mass_recall"] for r in rs], marker="o", ms=3, label=name,
                color=policy_colour(name))
        a2.plot(x, [r["mean_output_rel_error"] for r in rs], marker="o", ms=3,
                color=policy_colour(name))
    held = "KV entries held per head while decoding (mean, measured)"
    a1.set(title="Mass recall vs memory held", xlabel=held, ylabel="mean mass recall")
    a2.set(title="Output error vs memory held", xlabel=held, ylabel="mean relative output error")
    a1.legend(fontsize=7, ncol=2)
    save(fig, out, "held_vs_error", written)


def pareto_figure(table, out, written):
    fig, (a1, a2) = new_figure(1, 2, figsize=(11, 4))
    by_policy = defaultdict(list)
    for r in table:
        by_policy[r["policy"]].append(r)
    for policy, rs in sorted(by_policy.items()):
        rs = sorted(rs, key=lambda r: r["kv_mib_per_step"])
        x = [r["kv_mib_per_step"] for r in rs]
        a1.scatter(x, [r["mean_mass_recall"] for r in rs], color=policy_colour(policy), label=policy, s=18)
        a2.scatter(x, [r["mean_output_rel_error"] for r in rs], color=policy_colour(policy), s=18)
        best, front = -1.0, []
        for r in rs:  # Pareto front: more recall for more memory only
            if r["mean_mass_recall"] > best:
                best = r["mean_mass_recall"]
                front.append(r)
        a1.plot([r["kv_mib_per_step"] for r in front], [r["mean_mass_recall"] for r in front],
                color=policy_colour(policy), lw=1)
    a1.set(title="KV memory vs mass recall", xlabel="KV cache per decode step (MiB, all layers)",
           ylabel="mean mass recall")
    a2.set(title="KV memory vs output error", xlabel="KV cache per decode step (MiB, all layers)",
           ylabel="mean relative output error")
    a1.legend(fontsize=7, ncol=2)
    save(fig, out, "pareto", written)


def figures(results, out):
    """The figures of a sweep's rows (dicts as read from results.csv) into `out`: a directory,
    or a dict that receives them by name (kvsim.plot). Returns the paths written."""
    table = summarise(results)
    written = []
    axis_figures(table, out, written)
    held_figure(table, out, written)
    pareto_figure(table, out, written)
    return written


def report(results_path, out):
    """Writes the tables and figures of one sweep results file into `out`; returns the paths
    written (none when the file has no rows)."""
    results = read_results(results_path)
    table = summarise(results)
    if not table:
        return []
    os.makedirs(out, exist_ok=True)
    write_tables(table, out)
    written = [os.path.join(out, "table.csv"), os.path.join(out, "table.md")]
    per_trace = summarise(results, by_trace=True)
    if len({r["trace"] for r in per_trace}) > 1:
        write_tables(per_trace, out, "table_by_trace")
        written += [os.path.join(out, f"table_by_trace.{ext}") for ext in ("csv", "md")]
    axis_figures(table, out, written)
    held_figure(table, out, written)
    pareto_figure(table, out, written)
    return written


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", help="a kvsim sweep results.csv")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    written = report(args.results, args.out)
    if not written:
        print(f"sweep_report: no rows in {args.results}", file=sys.stderr)
        return 1
    for w in written:
        print(w)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
