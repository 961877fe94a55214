#!/usr/bin/env python3
"""One change at a time: what the order of the question does, taken apart. Reads the reports
(vlm_eval_report.py's OUT) of three orders of experiments/vlm_multi_eval.sh that share one
reading, every budgeted policy at equal memory (`--equal-memory`: budgets rounded up, decode =
cap, StreamingLLM and TOVA compressing after every step, H2O cumulative; a share of the whole
prompt, so each order holds the same entries at every step, the question's and the answer's
included), and differ in one thing each:

  compress  the whole prompt compressed; the first answer token is computed from the full prompt
  tail1     the prompt less its last token compressed, that token fed after compression: no
            answer token is free; the scorers still see the question, less its last token
  tailq     the prompt less its question compressed, the question fed after compression: the
            scorers see none of it (and its entries join the cache after the compression)

and writes, per budget and policy run in all three (`text_only` at its own size; the floors
`random`, `random@window` and `downsample` like any policy), the accuracy in each order and
three paired effects:

  free first token          compress − tail1
  scorer sees the question  tail1 − tailq
  question after compression  tailq − compress (the whole step: the two above, negated, summed)

each over the same seeds and items (each cell's random draws averaged), its 95% interval and p
from the crossed bootstrap over seeds and items at once (kvsim.compare_seeds), Holm over the
budget's policies for each effect. Policies whose answers are the same on every seed, budget and
item in all three orders (presets that become their policy at equal memory) are one row, their
names joined as the reports join them: one comparison in Holm's family, one policy in the counts.

    vlm_factorial.py --compress DIR --tail1 DIR --tailq DIR --out OUT

Writes OUT/vlm_factorial.md and OUT/vlm_factorial.csv (one row per budget, policy and effect).
"""
import argparse
import json
import os
import sys

import pandas as pd

from kvsim.report.csv_table import write_csv

# siblings: experiments/reports/ is the script's folder
from vlm_eval_report import fmt, p_text
from vlm_orders import members, merge_identical, order_effects, read

ORDERS = ("compress", "tail1", "tailq")
# (name, formula, the order without the feature, the order with it): effect = with − without.
EFFECTS = (("free first token", "compress − tail1", "tail1", "compress"),
           ("scorer sees the question", "tail1 − tailq", "tailq", "tail1"),
           ("question after compression", "tailq − compress", "compress", "tailq"))
VERDICT = {"better": "▲", "worse": "▼"}
# A report's unit -> its task and what one of its samples is called.
TASK = {"item": ("eight-box task", "items"), "image": ("single-image task", "images")}


def fail(message):
    sys.exit(f"vlm_factorial: {message}")


def task_of(directories):
    """The task the three reports share, from the settings each saved (results/builds.json):
    each must be the order its option names, and all of one unit."""
    units = set()
    for order, directory in directories.items():
        path = os.path.join(directory, "results", "builds.json")
        if not os.path.exists(path):
            fail(f"--{order} {directory}: no results/builds.json (vlm_eval_report.py's OUT)")
        with open(path, encoding="utf-8") as f:
            settings = json.load(f)["settings"]
        if settings.get("order") != order:
            fail(f"--{order} {directory}: its report is of the {settings.get('order')} order")
        units.add(settings.get("unit"))
    if len(units) != 1:
        fail("the three reports are of different tasks (units " + ", ".join(sorted(
            str(u) for u in units)) + ")")
    return TASK.get(units.pop(), ("task", "samples"))


def sample_words(by_image, samples):
    """What each effect is paired over, e.g. "training seeds 0, 3 and 4, 320 items each":
    the three orders must hold the same seeds and the same samples of each seed."""
    keys = {o: set(zip(t["seed"], t["sample"])) for o, t in by_image.items()}
    for order in ORDERS[1:]:
        if keys[order] != keys[ORDERS[0]]:
            fail(f"the {order} report holds other seeds or {samples} than the {ORDERS[0]} one "
                 f"({len(keys[order])} against {len(keys[ORDERS[0]])} seed-{samples[:-1]} pairs)")
    per_seed = pd.Series([seed for seed, _ in keys[ORDERS[0]]]).value_counts()
    seeds = [str(s) for s in sorted(per_seed.index)]
    named = seeds[0] if len(seeds) == 1 else ", ".join(seeds[:-1]) + " and " + seeds[-1]
    counts = sorted(set(per_seed))
    each = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"
    # The single-image task trains a projector per seed; the eight-box task the whole model.
    kind = "projector" if samples == "images" else "training"
    return (f"{kind} seed{'s' if len(seeds) > 1 else ''} {named}, {each} {samples}"
            f"{' each' if len(seeds) > 1 else ''}")


def effects(by_image):
    """One row per budget, policy and effect: the paired difference, its interval and p after
    Holm over the budget's policies (order_effects)."""
    out = []
    for name, formula, without, with_ in EFFECTS:
        e = order_effects(by_image[without], by_image[with_])
        e.insert(0, "effect", name)
        e.insert(1, "formula", formula)
        out.append(e)
    return pd.concat(out, ignore_index=True)


def accuracies(tables):
    """(budget, policy) -> {order: (accuracy, ci_low, ci_high, held)} from the reports' tables."""
    out = {}
    for order, t in tables.items():
        for _, r in t.iterrows():
            out.setdefault((r["budget"], r["policy"]), {})[order] = (
                r["contains"], r["contains_ci_low"], r["contains_ci_high"], r["kv_fraction"])
    return out


def effect_cell(r):
    return (f"{fmt(r['mean'], '+.3f')} [{fmt(r['ci_low'], '+.2f')}, {fmt(r['ci_high'], '+.2f')}]"
            f"{' ' + VERDICT[r['verdict']] if r['verdict'] in VERDICT else ''} "
            f"({p_text(r['p_holm'])})")


def reading(result, budgets):
    """The lists read as counts, one clause per effect: of the budgeted policies at each budget,
    how many are shown above 0 and below 0; the policies of a direction that holds four or fewer
    at all budgets together are named (with the budgets where they are)."""
    shares = [b for b in budgets if b != "self"]
    if not shares:
        return ""
    clauses = []
    for name, *_ in EFFECTS:
        parts = []
        for verdict, words in (("better", "above 0"), ("worse", "below 0")):
            found = {b: sorted(result[(result["budget"] == b) & (result["effect"] == name) &
                                      (result["verdict"] == verdict)]["policy"]) for b in shares}
            counts = [len(found[b]) for b in shares]
            text = f"{words} for {count_words(counts)}"
            named = sum(counts)
            if 0 < named <= 4:
                by_policy = {}
                for b in shares:
                    for p in found[b]:
                        by_policy.setdefault(p, []).append(f"{b}%")
                text += " (" + "; ".join(f"`{p}` at {' and '.join(at)}"
                                         for p, at in sorted(by_policy.items())) + ")"
            parts.append(text)
        clauses.append(f"*{name}* shown " + ", ".join(parts))
    total = [len(set(result[result["budget"] == b]["policy"])) for b in shares]
    return (f"**Read from the lists** (of {count_words(total)} budgeted policies at "
            f"{', '.join(b + '%' for b in shares)}): " + "; ".join(clauses) + ".")


def count_words(counts):
    """[15, 15, 13] -> "15, 15 and 13"; all zero -> "none"."""
    if not any(counts):
        return "none"
    words = [str(c) for c in counts]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def write(path, result, acc, budgets, task, sample, samples="items"):
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"**One change at a time** ({task}, {sample}; three orders with one reading, every "
                "budgeted policy at equal memory: a share of the whole prompt, the question's "
                "and the answer's entries held within it, decode = cap). Accuracy: mean over "
                f"seeds [95% interval over seeds and {samples}]. Effects, paired over the same "
                f"seeds and {samples}: *free first token* = compress − tail1 (the scorers see "
                "the question in both), *scorer sees the question* = tail1 − tailq (no free "
                "token in either; in tailq the question's entries also join after compression), "
                "*question after compression* = tailq − compress; each with its 95% interval "
                f"over seeds and {samples} (crossed bootstrap), ▲/▼ where Holm over the budget's "
                "policies shows it above/below 0, p after Holm in brackets. Held: peak KV memory "
                "while decoding, share of the full cache, mean over the budget's policies.\n\n"
                "| budget | policy | compress | tail1 | tailq | free first token | scorer sees "
                "the question | question after compression |\n|---|---|---|---|---|---|---|---|\n")
        for b in budgets:
            g = result[result["budget"] == b]
            held = [pd.Series([acc[(b, p)][o][3] for p in g["policy"].unique()]).mean()
                    for o in ORDERS]
            f.write(f"| {b if b == 'self' else b + '%'} | held | " +
                    " | ".join(fmt(h) for h in held) + " | | | |\n")
            for p in sorted(g["policy"].unique()):
                cells = [f"{fmt(a[0])} [{fmt(a[1], '.2f')}, {fmt(a[2], '.2f')}]"
                         for a in (acc[(b, p)][o] for o in ORDERS)]
                rows = g[g["policy"] == p].set_index("effect")
                f.write(f"| {b if b == 'self' else b + '%'} | `{p}` | " + " | ".join(cells) +
                        " | " + " | ".join(effect_cell(rows.loc[name]) for name, *_ in EFFECTS) +
                        " |\n")
        f.write("\n")
        for name, formula, *_ in EFFECTS:
            for b in budgets:
                g = result[(result["budget"] == b) & (result["effect"] == name)]
                groups = [(words, sorted(g[g["verdict"] == v]["policy"]))
                          for v, words in (("better", "shown above 0"),
                                           ("no difference shown", "not shown to differ from 0"),
                                           ("worse", "shown below 0"))]
                f.write(f"- {name} ({formula}), {b if b == 'self' else b + '%'}: " + "; ".join(
                    f"{words} ({len(names)}): " +
                    (", ".join(f"`{n}`" for n in names) if names else "none")
                    for words, names in groups) + ".\n")
        read = reading(result, budgets)
        if read:
            f.write("\n" + read + "\n")


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for order in ORDERS:
        ap.add_argument(f"--{order}", required=True, help=f"vlm_eval_report.py's OUT, {order}")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    task, samples = task_of({o: getattr(a, o) for o in ORDERS})
    tables = {o: members(read(os.path.join(getattr(a, o), "vlm_eval.csv"))) for o in ORDERS}
    by_image = {o: members(read(os.path.join(getattr(a, o), "vlm_eval_by_image.csv")))
                for o in ORDERS}
    sample = sample_words(by_image, samples)
    common = set.intersection(*(set(t["policy"]) for t in by_image.values()))
    by_image, tables, common, _ = merge_identical(by_image, tables, common)
    result = effects(by_image)
    result = result[result["policy"].isin(common)]
    budgets = sorted(set(result["budget"]), key=lambda b: (b == "self", float(b)
                                                            if b != "self" else 0))
    os.makedirs(a.out, exist_ok=True)
    write_csv(result, os.path.join(a.out, "vlm_factorial.csv"))
    write(os.path.join(a.out, "vlm_factorial.md"), result, accuracies(tables), budgets, task,
          sample, samples)
    print(open(os.path.join(a.out, "vlm_factorial.md"), encoding="utf-8").read())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
