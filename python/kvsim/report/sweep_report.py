#!/usr/bin/env python3
"""Table and figures of a `kvsim sweep` results file.

    sweep_report.py RESULTS.csv --out DIR

Writes DIR/table.csv and DIR/table.md (one row per configuration: mean mass recall, the two mean
output errors, mean cache size, KV memory per decode step summed over layers and heads, averaged
over the samples and traces), DIR/table_by_trace.csv/.md when the sweep has several traces (the
same per trace and configuration, first column `trace`), DIR/<policy>_<key>.png/.pdf (each swept
parameter against recall and error, one line per setting of the policy's other axes, up to six;
beyond, one line averaged over them, which the title says, as it says when seeds are pooled),
DIR/held_vs_error.png/.pdf (every policy swept over budgets against the entries it held, the
budgets labelled) and DIR/pareto.png/.pdf (KV memory against recall and error, one point per
configuration, with each policy's Pareto front). Needs Debian's python3-matplotlib.
"""
import argparse
import csv
import os
import re
import sys
from collections import defaultdict

import numpy as np

from .figure_style import (draw_intervals, label_points, memory_axes, new_figure, policy_colour,
                           policy_style, readable_legend, save)


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
    from .. import summarize
    try:
        s = summarize({"policy": ["c"] * len(samples), "sample": [f"{t}/{x}" for t, x in samples],
                       column: [float(r[column]) for r in rs if r[column]]}, column)
    except ImportError:  # the C++ module is not built here (e.g. a sanitizer build): no intervals
        return n, float("nan"), float("nan")
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
        row["_rows"] = rs  # for the intervals of points that pool configurations (not written)
        table.append(row)
    return table


def point_intervals(table_rows):
    """The 95% intervals over samples of recall and output error at a figure's point made of one
    or more configurations (seeds pooled, or axes not drawn averaged over): each sample's value
    the mean of the configurations' rows there, as a single configuration's own interval."""
    if len(table_rows) == 1:
        r = table_rows[0]
        return (r["recall_ci_low"], r["recall_ci_high"]), (r["error_ci_low"], r["error_ci_high"])
    rs = [x for r in table_rows for x in r["_rows"]]
    return (intervals(rs, "mean_mass_recall")[1:], intervals(rs, "mean_output_rel_error")[1:])


def draw_point_intervals(a_recall, a_error, xs, rows, colour):
    """Vertical 95% interval bars at each point of a line, on the recall and the error axes."""
    cis = [point_intervals(rs) for rs in rows]
    draw_intervals(a_recall, xs, [c[0][0] for c in cis], [c[0][1] for c in cis], colour)
    draw_intervals(a_error, xs, [c[1][0] for c in cis], [c[1][1] for c in cis], colour)


def intervals_note(table):
    """What a figure's bars are, for its title."""
    finite = any(np.isfinite(r["recall_ci_low"]) for r in table)
    return "bars: 95% intervals over samples" if finite else "one sample: no intervals"


def mean_of(rows, column):
    """Mean of a column that is empty where the trace has no values (NaN if it always is)."""
    values = [float(r[column]) for r in rows if r[column]]
    return np.mean(values) if values else float("nan")


def write_tables(table, out, name="table"):
    cols = [c for c in table[0] if not c.startswith("_")]
    with open(os.path.join(out, f"{name}.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
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


# Without the kvsim module (a script run outside the package): what a percentage of each size
# parameter is a percentage of, and which parameters count KV entries.
PERCENT_OF = {"budget": "the prompt length", "recent": "the budget"}
ENTRY_COUNTS = {"budget", "recent", "window", "sinks", "rc_size", "hold"}
# One line per setting of the axes not plotted up to this many settings; an average beyond.
MOST_LINES = 6
# The memory axis: each point where its budget landed, labelled with the budget given.
HELD = "KV entries held per head (mean while decoding; labels: budgets)"


def parameter_specs():
    """{policy: {parameter: spec}} from kvsim.policies(), or {} without the kvsim module."""
    try:
        from .. import policies
    except ImportError:
        return {}
    return {p["name"]: {q["name"]: q for q in p["params"]} for p in policies()}


def axis_label(policy, key, raw_values, specs):
    """The axis's name with its unit: "% of the budget" for percentages (what the parameter's
    documentation says they are of), "entries" for counts of KV entries."""
    spec = specs.get(policy, {}).get(key)
    if all(str(v).endswith("%") for v in raw_values):
        base = PERCENT_OF.get(key)
        if spec:
            m = re.search(r"percentage of (the [a-z ]+?)(?: \(|[,;:]|$)", spec["doc"])
            base = m.group(1) if m else base
        return f"{key} (% of {base})" if base else f"{key} (%)"
    counts = spec["type"].startswith("count") if spec else key in ENTRY_COUNTS
    return f"{key} (entries)" if counts else key


def setting_text(rest):
    return ", ".join(f"{k}={v}" for k, v in rest)


def lines_of(entries, key):
    """The configurations of one policy that set `key`, as lines: {setting of the other axes
    (seed left out, its runs pooled): {value of key: [rows]}}; more than MOST_LINES settings are
    pooled into one line (setting None). Returns the lines, the axes pooled and whether seeds
    were."""
    lines, others, seeded = defaultdict(lambda: defaultdict(list)), set(), False
    for axes, r in entries:
        if key not in axes:
            continue
        seeded |= "seed" in axes
        rest = tuple(sorted((k, v) for k, v in axes.items() if k not in (key, "seed")))
        others.update(k for k, _ in rest)
        lines[rest][axes[key]].append(r)
    pooled = []
    if len(lines) > MOST_LINES:
        merged = defaultdict(list)
        for by_value in lines.values():
            for value, rs in by_value.items():
                merged[value] += rs
        lines, pooled = {None: merged}, sorted(others)
    return lines, pooled, seeded


def hidden_axes_text(pooled, seeded):
    """What a figure averages over that it does not show, for its title."""
    parts = ([f"averaged over {', '.join(pooled)}"] if pooled else []) + (
        ["seeds pooled"] if seeded else [])
    return f" ({'; '.join(parts)})" if parts else ""


def axis_figures(table, out, written):
    """Per policy and swept parameter: recall and output error against the parameter, one line per
    setting of the policy's other axes (a budget drawn where it landed: the entries held)."""
    specs = parameter_specs()
    by_policy = defaultdict(list)
    for r in table:
        name, axes = parse_label(r["label"])
        by_policy[name].append((axes, r))
    for name, entries in by_policy.items():
        keys = sorted({k for axes, _ in entries for k in axes} - {"seed"})
        for key in keys:
            lines, pooled, seeded = lines_of(entries, key)
            if max(len(by_value) for by_value in lines.values()) < 2:
                continue
            raw_values = {v for by_value in lines.values() for v in by_value}
            numeric = not any(isinstance(axis_value(v), str) for v in raw_values)
            categories = sorted(raw_values, key=lambda v: (isinstance(axis_value(v), str),
                                                          axis_value(v)))
            fig, (a1, a2) = new_figure(1, 2, figsize=(10, 3.6))
            for rest, by_value in sorted(lines.items(), key=lambda kv: setting_text(kv[0] or ())):
                values = sorted(by_value, key=lambda v: (isinstance(axis_value(v), str),
                                                         axis_value(v)))
                rows = [by_value[v] for v in values]
                if key == "budget":  # where each budget landed: the entries it held
                    xs = [np.mean([r["mean_cache_size"] for r in rs]) for rs in rows]
                elif numeric:
                    xs = [axis_value(v) for v in values]
                else:
                    xs = [categories.index(v) for v in values]
                order = np.argsort(xs, kind="stable")
                xs = [xs[i] for i in order]
                values = [values[i] for i in order]
                rows = [rows[i] for i in order]
                label = setting_text(rest) if rest else name
                style = policy_style(name + (f" ({label})" if rest else ""))
                recall = [np.mean([r["mean_mass_recall"] for r in rs]) for rs in rows]
                error = [np.nanmean([r["mean_output_rel_error"] for r in rs]) for rs in rows]
                a1.plot(xs, recall, label=label, ms=4, **style)
                a2.plot(xs, error, label=label, ms=4, **style)
                draw_point_intervals(a1, a2, xs, rows, style["color"])
                if key == "budget":
                    label_points(a1, xs, recall, values)
                    label_points(a2, xs, error, values)
            xlabel = (HELD if key == "budget" else axis_label(name, key, raw_values, specs))
            hidden = hidden_axes_text(pooled, seeded)
            note = intervals_note(table)
            for ax, ylabel in ((a1, "mean mass recall"), (a2, "mean relative output error")):
                ax.set(xlabel=xlabel, ylabel=ylabel)
                ax.set_title(f"{name}: {ylabel} vs {key}{hidden}\n{note}", fontsize=9)
                if not numeric and key != "budget":
                    ax.set_xticks(range(len(categories)), categories)
            if len(lines) > 1:
                readable_legend(fig, a2, len(lines))
            save(fig, out, f"{name}_{key}", written)


def held_figure(table, out, written):
    """Every policy swept over budgets, recall and output error against the KV entries it held
    while decoding (so policies that grow while decoding sit where they landed, not at their
    nominal budget): one curve per setting of the policy's other axes, each point labelled with
    its budget."""
    curves, pooled_any, seeded_any = {}, [], False
    by_policy = defaultdict(list)
    for r in table:
        name, axes = parse_label(r["label"])
        by_policy[name].append((axes, r))
    for name, entries in by_policy.items():
        lines, pooled, seeded = lines_of(entries, "budget")
        pooled_any += [f"{name}'s {k}" for k in pooled]
        seeded_any |= seeded
        for rest, by_budget in lines.items():
            if len(by_budget) >= 2:
                curves[(name, rest or ())] = by_budget
    if not curves:
        return
    several = defaultdict(int)
    for name, _ in curves:
        several[name] += 1
    fig, (a1, a2) = new_figure(1, 2, figsize=(11, 4))
    for (name, rest), by_budget in sorted(curves.items(), key=lambda kv: (kv[0][0],
                                                                          setting_text(kv[0][1]))):
        points = sorted(((np.mean([r["mean_cache_size"] for r in rs]),
                          np.mean([r["mean_mass_recall"] for r in rs]),
                          np.nanmean([r["mean_output_rel_error"] for r in rs]), budget), rs)
                        for budget, rs in by_budget.items())
        xs, recall, error, budgets = zip(*(p for p, _ in points))
        label = name + (f" ({setting_text(rest)})" if several[name] > 1 and rest else "")
        a1.plot(xs, recall, label=label, ms=4, **policy_style(label))
        a2.plot(xs, error, label=label, ms=4, **policy_style(label))
        draw_point_intervals(a1, a2, xs, [rs for _, rs in points], policy_style(label)["color"])
        label_points(a1, xs, recall, budgets)
        label_points(a2, xs, error, budgets)
    hidden = hidden_axes_text(pooled_any, seeded_any)
    pooled = hidden.strip(" ()")
    memory_axes(a1, a2, HELD, pooled + ("; " if pooled else "") + intervals_note(table))
    readable_legend(fig, a2, len(curves))
    save(fig, out, "held_vs_error", written)


def pareto_figure(table, out, written):
    fig, (a1, a2) = new_figure(1, 2, figsize=(11, 4))
    by_policy = defaultdict(list)
    for r in table:
        by_policy[r["policy"]].append(r)
    for policy, rs in sorted(by_policy.items()):
        rs = sorted(rs, key=lambda r: r["kv_mib_per_step"])
        x = [r["kv_mib_per_step"] for r in rs]
        marker = policy_style(policy)["marker"]
        a1.scatter(x, [r["mean_mass_recall"] for r in rs], color=policy_colour(policy),
                   marker=marker, label=policy, s=18)
        a2.scatter(x, [r["mean_output_rel_error"] for r in rs], color=policy_colour(policy),
                   marker=marker, s=18)
        draw_point_intervals(a1, a2, x, [[r] for r in rs], policy_colour(policy))
        best, front = -1.0, []
        for r in rs:  # Pareto front: more recall for more memory only
            if r["mean_mass_recall"] > best:
                best = r["mean_mass_recall"]
                front.append(r)
        a1.plot([r["kv_mib_per_step"] for r in front], [r["mean_mass_recall"] for r in front],
                color=policy_colour(policy), lw=1)
    note = intervals_note(table)
    a1.set(xlabel="KV cache per decode step (MiB, all layers)", ylabel="mean mass recall")
    a2.set(xlabel="KV cache per decode step (MiB, all layers)", ylabel="mean relative output error")
    a1.set_title(f"KV memory vs mass recall\n{note}", fontsize=9)
    a2.set_title(f"KV memory vs output error\n{note}", fontsize=9)
    readable_legend(fig, a2, len(by_policy))
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
