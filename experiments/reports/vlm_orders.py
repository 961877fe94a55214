#!/usr/bin/env python3
"""Does the order matter, and do rankings survive longer prompts? Reads the two reports of
experiments/vlm_multi_eval.sh (vlm_eval_report.py's outputs for the question compressed with the
prompt, and appended after compression), its several-questions runs, and optionally the
single-image task's report (experiments/vlm_eval.sh), and writes:

- per budget and policy run in both orders: the accuracy in each, and the paired effect of
  appending the question after compression (append − compress, paired over the same seeds and
  held-out items, resampled together by the crossed bootstrap, each cell averaged over the random
  floor's draws; Holm over each budget's policies); the verdicts against the random floor in each
  order; policies that answer alike in both orders (every seed, budget and item) are one row and
  one comparison, "a, b";
- the policies' rank correlation between the orders and, at the budgets both tasks ran, between
  the single-image task and the eight-box task (compress order: the same protocol), the floors
  left out;
- which image stays: the asked image's entries kept against the other images', per order (the
  counting form: the images of the asked class, those counted, against the others);
- several questions on one compressed context: each policy's accuracy over the contexts' questions
  with a 95% interval over contexts (the questions of one context are not independent), and the
  share of contexts whose every question is answered right.

    vlm_orders.py --compress DIR --append DIR --shared DIR --shared-budget 20 [--single DIR]
                  [--coverage FILE] --out OUT

--coverage reads the asked-image coverage from a kept vlm_orders_coverage.csv(.gz) instead of
the runs' traces and dumped decisions (experiments/results/vlm_multi keeps it, and the
several-questions runs as shared/seedK/live_B.csv.gz, so that the report is regenerated without
the runs).

Writes OUT/vlm_orders.md, OUT/vlm_orders.csv (one row per budget and policy),
OUT/vlm_orders_coverage.csv (per order, budget and policy: the asked image's entries kept, the
other images', and how often a layer's KV head keeps none of the asked image, from replay's
dumped decisions; the counting form: the counted images' in the asked image's columns) and, as
PNG and PDF, OUT/vlm_orders (accuracy in each order, with intervals).
"""
import argparse
import glob
import json
import os
import re
import sys

import numpy as np
import pandas as pd

from kvsim.report.csv_table import write_csv
from kvsim.report.figure_style import new_figure, policy_style, save
from kvsim.report.replay_vs_live import spearman
from vlm_eval_report import (TESTED_FLOORS, alike_names, fmt, group_of,  # a sibling
                             removed_by_head, task_of, under_joined_names)

# The task the report is of (the builds' setting, vlm_eval_report.task_of) names what an answer
# depends on: the lookup's wording is the one docs/real_model.md quotes.
WORDING = {
    "lookup": {"task": "eight-box task", "answer": "the class word",
               "questions": "asked about each of its boxes",
               "coverage": "**Which image stays** (replay's decisions on the captured traces, "
                           "every seed's items): the share of the asked image's entries kept, of "
                           "the other images' entries, and the share of (item, layer, KV head) "
                           "that keep none of the asked image (merged entries count as gone), "
                           "compress / append:\n\n| budget | policy | asked image kept | other "
                           "images kept | asked image dropped |\n"},
    "count": {"task": "eight-box counting task", "answer": "the count word",
              "questions": "asked how many boxes hold each class it holds",
              "coverage": "**Which images stay** (replay's decisions on the captured traces, "
                          "every seed's items): the share of the counted images' entries kept "
                          "(the boxes holding the asked class), of the other images' entries, "
                          "and the share of (item, layer, KV head) that keep none of the counted "
                          "images' entries (merged entries count as gone), compress / append:"
                          "\n\n| budget | policy | counted images kept | other images kept | "
                          "counted images all dropped |\n"}}
# A shared context's sample is the context's name and what its question asks (multi._asked).
QUESTION_SUFFIX = r"_(?:box\d+|count_[a-z]+)$"


def fail(message):
    sys.exit(f"vlm_orders: {message}")


def read(path):
    if not os.path.exists(path):
        fail(f"{path}: no such file (run experiments/vlm_multi_eval.sh)")
    return pd.read_csv(path, keep_default_na=False, na_values=[""], dtype={"sample": str,
                                                                            "budget": str})


def members(table):
    """Rows of policies a report joined ("a, b": identical answers everywhere) repeated under
    each member's own name."""
    rows = []
    for _, r in table.iterrows():
        for name in str(r["policy"]).split(", "):
            rows.append(dict(r, policy=name))
    return pd.DataFrame(rows)


def alike_everywhere(by_image, policies):
    """(rename, dropped) of the `policies` that answer alike in every order given (contains,
    exact and ΔNLL of every seed, budget and item): one name "a, b" (the policy before its
    presets, as vlm_eval_report.merge_identical names them), all but the first member dropped."""
    signatures = {}
    for p in sorted(policies):
        signature = []
        for t in by_image.values():
            g = t[t["policy"] == p].sort_values(["seed", "budget", "sample"])
            signature.append(tuple(map(tuple, g[["seed", "budget", "sample"]].astype(str).values)))
            signature.append(tuple(g[["contains", "exact", "dnll"]].fillna(-1).values.ravel()))
        signatures[p] = tuple(signature)
    return alike_names(signatures)


def merge_identical(by_image, tables, policies):
    """by_image and tables ({order: table}) with each group of `policies` alike in every order
    as one policy (alike_everywhere), the policies' names after it (one comparison each), and
    the function that puts any other table under those names."""
    rename, dropped = alike_everywhere(by_image, policies)

    def join(table):
        return under_joined_names(table, rename, dropped)

    return ({o: join(t) for o, t in by_image.items()}, {o: join(t) for o, t in tables.items()},
            {rename.get(p, p) for p in policies if p not in dropped}, join)


def order_effects(before, after):
    """Per budget: after − before (accuracy) per seed and item for each policy run in both
    orders (each cell's draws already averaged in the reports' by-image tables), tested against
    no difference over seeds and items at once (kvsim.compare_seeds: the crossed bootstrap), Holm
    over the budget's policies."""
    import kvsim

    key = ["seed", "budget", "policy", "sample"]
    both = before[key + ["contains"]].merge(after[key + ["contains"]], on=key,
                                            suffixes=("_before", "_after"))
    both["difference"] = both["contains_after"] - both["contains_before"]
    out = []
    for budget, g in both.groupby("budget"):
        zero = g.drop_duplicates(["seed", "sample"]).assign(policy="no difference",
                                                            difference=0.0)
        table = pd.concat([g, zero])[["seed", "policy", "sample", "difference"]]
        r = kvsim.compare_seeds(table, "difference", "no difference", higher_is_better=True)
        r.insert(0, "budget", budget)
        out.append(r)
    return pd.concat(out, ignore_index=True)


def random_verdicts(directory):
    t = read(os.path.join(directory, "vlm_comparisons.csv"))
    t = members(t[t["against"] == "random"])
    return {(r["budget"], r["policy"]): r["verdict"] for _, r in t.iterrows()}


def shared_accuracy(directory, budget):
    """policy -> (contexts, questions, accuracy, 95% interval over contexts, share of contexts
    with every question right), each (context, question) averaged over seeds and draws."""
    import kvsim

    frames = []
    paths = glob.glob(os.path.join(directory, "seed*", f"live_{budget}.csv"))
    paths += glob.glob(os.path.join(directory, "seed*", f"live_{budget}.csv.gz"))  # kept results
    for path in sorted(paths):
        run_name = path[:-3] if path.endswith(".gz") else path
        t = read(path)
        t = t[t["sample"] != "all"]
        frames.append(pd.DataFrame({"policy": t["policy"].map(group_of),
                                    "run": run_name + " " + t["policy"],
                                    "sample": t["sample"], "contains": t["answer_contains"],
                                    "full": t["full_answer_contains"]}))
    if not frames:
        fail(f"{directory}: no seed*/live_{budget}.csv (run experiments/vlm_multi_eval.sh)")
    t = pd.concat(frames, ignore_index=True)
    t["context"] = t["sample"].str.replace(QUESTION_SUFFIX, "", regex=True)
    item = t.groupby(["policy", "context", "sample"], as_index=False)[["contains", "full"]].mean()
    full = item.drop_duplicates("sample").assign(policy="full", contains=lambda x: x["full"])
    item = pd.concat([item, full], ignore_index=True)
    context = item.groupby(["policy", "context"], as_index=False)["contains"].mean()
    s = kvsim.summarize(context.rename(columns={"context": "sample"}), "contains")
    # Every question of a context right in one run (a seed, a draw), then the mean over runs.
    runs = pd.concat([t, t.drop_duplicates(["run", "sample"]).assign(
        policy="full", run=lambda x: x["run"] + " full", contains=lambda x: x["full"])])
    every = (runs.groupby(["policy", "run", "context"])["contains"].min().eq(1)
             .groupby("policy").mean())
    questions = item.groupby("policy")["sample"].nunique()
    s["all_right"] = s["policy"].map(every)
    s["questions"] = s["policy"].map(questions)
    return s, len(frames)


def asked_boxes(task):
    """The boxes (from 0) an item's answer depends on, from its prompt's task text
    (multi.MultiTask.describe): the asked box ("..., box 3"), or the boxes holding the asked
    class ("..., count bag in boxes 2, 5, 7"); None for another text."""
    lookup = re.search(r", box (\d+)$", task)
    if lookup:
        return [int(lookup.group(1)) - 1]
    count = re.search(r", count [a-z]+ in boxes (\d+(?:, \d+)*)$", task)
    return [int(b) - 1 for b in count.group(1).split(", ")] if count else None


def _asked_kept_one(job):
    """One seed's run of one order: {(budget, label): [asked kept, asked, other kept, other,
    (item, layer, KV head) keeping none of the asked image, (item, layer, KV head)]}; the asked
    image is every box the answer depends on (asked_boxes)."""
    import h5py

    seed_dir, budgets = job
    path = os.path.join(seed_dir, "trace.h5")
    with h5py.File(path, "r") as f:
        layout = {}
        for name, g in f["samples"].items():
            boxes = asked_boxes(str(g.attrs.get("task", "")))
            if boxes is None:
                raise ValueError(f"{path}: sample {name}: task {str(g.attrs.get('task', ''))!r} "
                                 "names no asked box (\"..., box K\", or \"..., count C in boxes "
                                 "K, ...\": a counting build made before its prompts named the "
                                 "boxes; build it again)")
            media = g["media_id"][: int(g.attrs["prompt_len"])]
            asked = np.isin(media, boxes)
            layout[name] = (asked, (media >= 0) & ~asked)
    sums = {}
    for b in budgets:
        path = os.path.join(seed_dir, f"decisions_{b}.h5")
        if not os.path.exists(path):
            continue
        with h5py.File(path, "r") as f:
            for label, g in f.items():
                acc = sums.setdefault((b, group_of(label)), np.zeros(6))
                for sample, (asked, other) in layout.items():
                    for gone in removed_by_head(g, sample):
                        gone = gone[gone < len(asked)]  # the prompt's positions
                        lost = int(asked[gone].sum())
                        acc += [asked.sum() - lost, asked.sum(), other.sum() - other[gone].sum(),
                                other.sum(), lost == asked.sum(), 1]
    return sums


def asked_image_kept(directories, budgets, processes=2):
    """{(order directory, budget, policy): (share of the asked image's entries kept, share of
    the other images' entries kept, share of (item, layer, KV head) keeping none of the asked
    image)} over every seed's items, from the decisions replay dumped (the random floor's draws
    pooled; merged entries count as gone); the asked box is the sample's task ("..., box k")."""
    from multiprocessing import Pool

    jobs = [(d, s) for d in directories for s in sorted(glob.glob(os.path.join(d, "seed*")))]
    with Pool(processes) as pool:
        try:
            parts = pool.map(_asked_kept_one, [(s, budgets) for _, s in jobs])
        except ValueError as e:
            fail(str(e))
    sums = {}
    for (d, _), part in zip(jobs, parts):
        for (b, p), v in part.items():
            sums[(d, b, p)] = sums.get((d, b, p), 0) + v
    return {k: (v[0] / max(v[1], 1), v[2] / max(v[3], 1), v[4] / max(v[5], 1))
            for k, v in sums.items()}


def report_task(directory):
    """The task ("lookup" or "count") of a vlm_eval_report.py OUT, from its results/builds.json."""
    path = os.path.join(directory, "results", "builds.json")
    try:
        with open(path, encoding="utf-8") as f:
            builds = json.load(f)["builds"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        fail(f"{path}: cannot read the report's builds ({e}); run vlm_eval_report.py again")
    tasks = {task_of(b) for b in builds.values()}
    if len(tasks) != 1:
        fail(f"{path}: builds of {len(tasks)} tasks ({', '.join(sorted(tasks))}): one task a "
             "report")
    return tasks.pop()


def ranking_agreement(left, right, budgets):
    """budget -> (Spearman ρ of the policies' accuracy, policies compared), the floors left out
    (`random` and `text_only`: how a floor fares is a property of the order, not a rank)."""
    out = {}
    for b in budgets:
        l_ = left[left["budget"] == b].set_index("policy")["contains"]
        r_ = right[right["budget"] == b].set_index("policy")["contains"]
        common = sorted(set(l_.index) & set(r_.index) - set(TESTED_FLOORS))
        out[b] = (spearman([l_[p] for p in common], [r_[p] for p in common]), len(common))
    return out


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--compress", required=True, help="vlm_eval_report.py's OUT, compress order")
    ap.add_argument("--append", required=True, help="vlm_eval_report.py's OUT, append order")
    ap.add_argument("--shared", required=True, help="the several-questions runs (seed*/)")
    ap.add_argument("--shared-budget", required=True, help="their budget, in percent")
    ap.add_argument("--single", help="the single-image task's report (vlm_eval.sh's OUT)")
    ap.add_argument("--coverage", help="a kept vlm_orders_coverage.csv(.gz), instead of the runs' "
                                       "traces and decisions")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    task = report_task(a.compress)
    if report_task(a.append) != task:
        fail(f"{a.compress} reports the {task} task, {a.append} the {report_task(a.append)} "
             "task: the orders compared must be of one task")
    tables = {o: members(read(os.path.join(getattr(a, o), "vlm_eval.csv")))
              for o in ("compress", "append")}
    by_image = {o: members(read(os.path.join(getattr(a, o), "vlm_eval_by_image.csv")))
                for o in ("compress", "append")}
    verdicts = {o: random_verdicts(getattr(a, o)) for o in ("compress", "append")}
    budgets = sorted(set(tables["append"]["budget"]) - {"self"}, key=float)
    # Policies alike in both orders are one row and one comparison (the reports join only
    # those alike within their order).
    in_both = set(by_image["compress"]["policy"]) & set(by_image["append"]["policy"])
    own_names = tables  # the single-image task compares each policy under its own name
    by_image, tables, _, join = merge_identical(by_image, tables, in_both)
    effects = order_effects(by_image["compress"], by_image["append"])
    rows = []
    for _, e in effects.iterrows():
        b, p = e["budget"], e["policy"]
        acc = {o: tables[o][(tables[o]["budget"] == b) & (tables[o]["policy"] == p)].iloc[0]
               for o in ("compress", "append")}
        rows.append({"budget": b, "policy": p, "n": e["n"],
                     **{f"accuracy_{o}": acc[o]["contains"] for o in acc},
                     **{f"accuracy_{o}_ci_low": acc[o]["contains_ci_low"] for o in acc},
                     **{f"accuracy_{o}_ci_high": acc[o]["contains_ci_high"] for o in acc},
                     **{f"vs_random_{o}": verdicts[o].get((b, p.split(", ")[0]), "")
                        for o in acc},
                     **{f"held_{o}": acc[o]["kv_fraction"] for o in acc},
                     "append_minus_compress": e["mean"], "ci_low": e["ci_low"],
                     "ci_high": e["ci_high"], "p_holm": e["p_holm"], "verdict": e["verdict"]})
    result = pd.DataFrame(rows)
    os.makedirs(a.out, exist_ok=True)
    write_csv(result, os.path.join(a.out, "vlm_orders.csv"))
    orders = ranking_agreement(tables["compress"], tables["append"], budgets)
    single = None
    if a.single:
        single_table = members(read(os.path.join(a.single, "vlm_eval.csv")))
        common = sorted(set(single_table["budget"]) & set(tables["compress"]["budget"]) - {"self"},
                        key=float)
        single = (ranking_agreement(single_table, own_names["compress"], common),
                  random_verdicts(a.single), common)
    shared, shared_seeds = shared_accuracy(a.shared, a.shared_budget)
    if a.coverage:
        coverage = read(a.coverage)
    else:
        kept = asked_image_kept([a.compress, a.append], budgets)
        coverage = pd.DataFrame([{"order": "compress" if d == a.compress else "append",
                                  "budget": b, "policy": p, "asked_image_kept": v[0],
                                  "other_images_kept": v[1], "asked_image_dropped": v[2]}
                                 for (d, b, p), v in kept.items()])
    # Every digit: the report regenerated from this file (--coverage) prints the same table
    # (kept under each policy's own name; printed under the joined names).
    write_csv(coverage, os.path.join(a.out, "vlm_orders_coverage.csv"), float_format="%.17g")
    write(os.path.join(a.out, "vlm_orders.md"), result, budgets, orders, single, verdicts,
          shared, shared_seeds, a.shared_budget, join(coverage),
          WORDING[task])
    figure(result, budgets, a.out, WORDING[task])
    print(open(os.path.join(a.out, "vlm_orders.md"), encoding="utf-8").read())
    return 0


def _write_orders(f, result, budgets, orders, words):
    """Each policy's accuracy in both orders, the append − compress effect, rank agreement."""
    arrow = {"better": " ▲", "worse": " ▼"}
    f.write(f"**The question before or after compression** ({words['task']}; accuracy, mean over "
            "seeds [95% interval over seeds and items]; ▲/▼ against `random` in that order; "
            "the effect of appending the question after compression, append − compress, "
            "paired over the same seeds and items, 95% interval over both (crossed "
            "bootstrap), Holm over each budget's policies). The budget is a "
            "share of the whole prompt when the question is compressed with it, of the "
            "context when it is appended; appended, the question and the answer are held "
            "uncompressed besides, so at one budget the append order holds more (held: peak "
            "KV memory while decoding, share of the full cache, mean over items):\n\n"
            "| budget | policy | compress | append | append − compress | shown |\n"
            "|---|---|---|---|---|---|\n")
    for b in budgets:
        g = result[result["budget"] == b]
        f.write(f"| {b}% | held | {fmt(g['held_compress'].mean())} | "
                f"{fmt(g['held_append'].mean())} | | |\n")
        for _, r in g.sort_values("policy").iterrows():
            cells = []
            for o in ("compress", "append"):
                cells.append(f"{fmt(r[f'accuracy_{o}'])} [{fmt(r[f'accuracy_{o}_ci_low'], '.2f')}, "
                             f"{fmt(r[f'accuracy_{o}_ci_high'], '.2f')}]"
                             f"{arrow.get(r[f'vs_random_{o}'], '')}")
            f.write(f"| {b}% | `{r['policy']}` | {cells[0]} | {cells[1]} | "
                    f"{fmt(r['append_minus_compress'], '+.3f')} [{fmt(r['ci_low'], '+.2f')}, "
                    f"{fmt(r['ci_high'], '+.2f')}] | {r['verdict']} |\n")
    f.write("\nRank agreement of the policies' accuracy between the two orders (Spearman ρ "
            "over the policies run in both, the floors left out): " + ", ".join(
                f"{b}%: {fmt(rho, '+.2f')} ({n} policies)" for b, (rho, n) in orders.items())
            + ".\n\n")


def _write_single(f, single, verdicts, words):
    """Short single-image prompts against the eight-box task: rank agreement and verdicts."""
    agreement, single_verdicts, common = single
    f.write(f"**Short single-image prompts against the {words['task']}** (both with the "
            "question compressed with the prompt, every policy at equal memory). Rank "
            "agreement of the policies' accuracy (Spearman ρ, the floors left out): " + ", ".join(
                f"{b}%: {fmt(rho, '+.2f')} ({n} policies)"
                for b, (rho, n) in agreement.items()) + ". Against `random` (▲ better, "
            "▼ worse, · no difference shown):\n\n| policy | " +
            " | ".join(f"single {b}% | eight-box {b}%" for b in common) + " |\n|---|" +
            "---|" * (2 * len(common)) + "\n")
    mark = {"better": "▲", "worse": "▼"}
    policies = sorted(set(p for (_, p) in verdicts["compress"]) |
                      set(p for (_, p) in single_verdicts))
    for p in policies:
        cells = []
        for b in common:
            for v in (single_verdicts, verdicts["compress"]):
                cells.append(mark.get(v.get((b, p)), "·") if (b, p) in v else "–")
        f.write(f"| `{p}` | " + " | ".join(cells) + " |\n")
    f.write("\n")


def _write_coverage(f, coverage, words):
    """Which image stays: the asked image's entries kept against the others', per order."""
    f.write(words["coverage"] + "|---|---|---|---|---|\n")
    for (b, p), g in coverage.groupby(["budget", "policy"]):
        cells = []
        for column in ("asked_image_kept", "other_images_kept", "asked_image_dropped"):
            by = g.set_index("order")[column]
            cells.append(" / ".join(fmt(by[o]) if o in by else "–"
                                    for o in ("compress", "append")))
        f.write(f"| {b}% | `{p}` | " + " | ".join(cells) + " |\n")
    f.write("\n")


def _write_shared(f, shared, shared_seeds, shared_budget, words):
    """Several questions on one compressed context: accuracy over questions and contexts."""
    f.write(f"**Several questions on one compressed context** ({shared_budget}%, the question "
            "appended after compression; each context compressed once and "
            f"{words['questions']}; seeds: {shared_seeds}). Accuracy over the questions with a 95% "
            "interval over contexts, and the share of contexts whose every question is "
            "answered right:\n\n| policy | contexts | questions | accuracy | every question "
            "right |\n|---|---|---|---|---|\n")
    names = sorted(shared["policy"], key=lambda p: (p != "full", p))  # full, then by name
    for _, r in shared.set_index("policy", drop=False).loc[names].iterrows():
        f.write(f"| `{r['policy']}` | {int(r['n'])} | {int(r['questions'])} | "
                f"{fmt(r['mean'])} [{fmt(r['ci_low'], '.2f')}, {fmt(r['ci_high'], '.2f')}] | "
                f"{fmt(r['all_right'])} |\n")
    f.write(f"\nRows in name order; the intervals over the {int(shared['n'].max())} contexts "
            "say which differences they can show.\n")


def write(path, result, budgets, orders, single, verdicts, shared, shared_seeds, shared_budget,
          coverage, words):
    with open(path, "w", encoding="utf-8") as f:
        _write_orders(f, result, budgets, orders, words)
        if single is not None:
            _write_single(f, single, verdicts, words)
        _write_coverage(f, coverage, words)
        _write_shared(f, shared, shared_seeds, shared_budget, words)


def figure(result, budgets, out, words):
    fig, axes = new_figure(1, len(budgets), figsize=(4.2 * len(budgets), 4), squeeze=False)
    for ax, b in zip(axes[0], budgets):
        g = result[result["budget"] == b].sort_values("policy")
        for i, (_, r) in enumerate(g.iterrows()):
            style = policy_style(r["policy"])
            for dx, o, fill in ((-0.15, "compress", style["color"]), (0.15, "append", "white")):
                y = r[f"accuracy_{o}"]
                ax.errorbar(i + dx, y, yerr=[[y - r[f"accuracy_{o}_ci_low"]],
                                             [r[f"accuracy_{o}_ci_high"] - y]],
                            marker=style["marker"], color=style["color"], mfc=fill, capsize=2,
                            ls="none", label=o if i == 0 else None)
        ax.set_xticks(range(len(g)))
        ax.set_xticklabels(g["policy"], rotation=60, ha="right", fontsize=7)
        ax.set(title=f"budget {b}% of the prompt (compress) / context (append)",
               ylabel=f"accuracy (answer contains {words['answer']})", ylim=(0, 1))
        ax.legend(fontsize=7, title="question", title_fontsize=7)
    save(fig, out, "vlm_orders", [])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
