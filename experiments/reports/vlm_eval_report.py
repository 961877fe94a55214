#!/usr/bin/env python3
"""Which policies keep the answer when image tokens are evicted, and which differences hold up?
Reads the runs of experiments/vlm_eval.sh, one directory per projector seed (the same held-out
images in each), and reports, per policy and budget at equal memory:

- accuracy (the greedy answer contains the class word: the primary metric) and exact match, each
  as the mean over seeds ± the SD over seeds and the 95% interval over seeds and images at once
  (Owen's crossed bootstrap; each seed's answers on an image averaged over the random floor's
  draws first);
- retention: of the images the full cache answers right, the share the policy still does;
- paired comparisons over seeds and images at once (kvsim.compare_seeds; over images alone with
  one seed) with the random floor, with `text_only` and with the best of each budget, Holm over
  each budget's family, p after Holm beside every claim, and the difference with 80% power at
  Holm's first step;
- rank stability across seeds (Kendall's W, the floors left out; over all policies and the top
  half), and replay's metrics beside (mass recall, output
  errors, image entries kept) with their rank correlation with the accuracy loss, pooled and
  within each budget;
- what the task gives for free: the first answer token (live compresses after the prefill) and
  the answers' length in tokens.

    vlm_eval_report.py --budgets 10 20 40 60 --seed 0=DIR0 1=DIR1 ... --out OUT
    vlm_eval_report.py --budgets 10 20 40 --seed ... --unit item [--order append] --out OUT
    vlm_eval_report.py --from-results RUN/results --out OUT          (the same report again)
    vlm_eval_report.py --from-results A/results B/results --out OUT  (their seeds, policies
                       and budgets joined; a cell both hold must be the same row)

(--unit item: the multi-image task's held-out items, experiments/vlm_multi_eval.sh; --order
append: the question fed after compression, every policy compressing the context once to the
same size, so memory is equal by construction and compared across policies, not to the budget.)

A seed directory holds, as vlm_eval.sh writes them: live_<B>.csv and replay_<B>.csv (kvsim live
evaluate and kvsim replay --summary at budget B% with --equal-memory), decisions_<B>.h5, the
same for the policies that size their caches themselves under <B> = self (optional),
control_noimage.csv, control_swapped.csv (control_shuffled.csv: optional), trace.h5 and
build.json. Or --from-results DIR: the tables a report keeps of its runs (OUT/results/: every
live and replay row per seed, budget, policy and image, the controls and the builds), so that a
report is regenerated from the repository without a model, the trace or the decision files.
Writes OUT/results/, OUT/vlm_eval.md, OUT/vlm_builds.md (the builds' own full-cache
measurement, with the controls), OUT/vlm_eval.csv (one row
per budget and policy), OUT/vlm_eval_by_seed.csv (one row per seed, budget and policy: what the
prediction card fits), OUT/vlm_comparisons.csv and, as PNG and PDF, OUT/vlm_accuracy_vs_memory,
OUT/vlm_accuracy_vs_budget, OUT/vlm_accuracy_vs_image_kept and OUT/vlm_replay_vs_accuracy.
Needs numpy, pandas, h5py, matplotlib and the kvsim module (its bootstrap and tests).
"""
import argparse
import json
import os
import sys

import numpy as np
import pandas as pd

from kvsim.report.csv_table import write_csv
from kvsim.report.figure_style import new_figure, policy_style, save, seed_group
from kvsim.report.prediction_card import at_chance_text, full_cache_reading
from kvsim.report.replay_vs_live import ranks, spearman

SELF = "self"  # the budget label of the runs of policies that size their caches themselves
CONTROLS = {"image": (("noimage", "no image tokens"), ("swapped", "another image's tokens")),
            "item": (("noimage", "no image tokens"),
                     ("swapped", "the asked box's image of another class"),
                     ("shuffled", "the images shuffled among the boxes"))}
# The eight-box task's counting form (build.json settings.task = "count"): its controls change
# the count by one (one box given another class's image) or keep it (the images shuffled).
COUNT_CONTROLS = (("noimage", "no image tokens"),
                  ("swapped", "one box changed so the count moves by one"),
                  ("shuffled", "the images shuffled among the boxes (the count stays)"))


def task_of(build):
    """The task a build.json was made for: "lookup" where its settings predate the setting."""
    return build.get("settings", {}).get("task", "lookup")


def controls_of(unit, build):
    """The control prompts (file stem, what it is) of a seed folder's build."""
    return COUNT_CONTROLS if unit == "item" and task_of(build) == "count" else CONTROLS[unit]


FLOORS = ("random", "random@window", "downsample")
# The floors every policy is tested against, left out of "best" and of the rank statistics.
RANDOM_FLOORS = ("random", "random@window")  # unprotected, and with a recent window
TESTED_FLOORS = RANDOM_FLOORS + ("text_only",)
REPLAY_METRICS = [("mean_mass_recall", "mass recall"),
                  ("mean_output_rel_error", "output error ‖o − ô‖/‖o‖"),
                  ("mean_output_value_error", "output error ‖o − ô‖/Σp‖v‖"),
                  ("image_kept", "image entries kept")]


# What each order of the runs was, for the report's first line.
ORDER_TEXT = {
    "compress": "every budgeted policy at equal memory (`--equal-memory`)",
    "tail1": "every budgeted policy at equal memory (`--equal-memory`), the prompt less its last "
             "token compressed and that token fed after compression (`--prompt-tail 1`)",
    "tailq": "every budgeted policy at equal memory (`--equal-memory`), the prompt less its "
             "question compressed and the question fed after compression (`--prompt-tail "
             "question`)",
    "append": "the question fed after compression (kvpress's order): every policy compresses the "
              "context once to the same ceil(budget × context) entries, then appends the question "
              "and the answer (equal memory by construction)",
}


def fail(message):
    sys.exit(f"vlm_eval_report: {message}")


def group_of(label):
    """random@seed3 -> random, random@window-seed3 -> random@window (a seeded policy's draws);
    other labels as they are."""
    return seed_group(label)


def is_draw(labels):
    """Which of `labels` (a Series) name one draw of a seeded policy."""
    return labels.map(group_of) != labels


def read(path):
    if not os.path.exists(path):
        fail(f"{path}: no such file (run experiments/vlm_eval.sh)")
    return pd.read_csv(path, keep_default_na=False, na_values=[""], dtype={"sample": str})


def live_rows(directory, seed, budget):
    t = read(os.path.join(directory, f"live_{budget}.csv"))
    t = t[t["sample"] != "all"]
    if "answer_contains" not in t or t["answer_contains"].isna().all():
        fail(f"{directory}/live_{budget}.csv: no answers scored (kvsim live evaluate without a "
             "vocabulary?)")
    return pd.DataFrame({
        "seed": seed, "budget": budget, "label": t["policy"], "policy": t["policy"].map(group_of),
        "sample": t["sample"], "contains": t["answer_contains"], "exact": t["answer_exact"],
        "full_contains": t["full_answer_contains"], "full_exact": t["full_answer_exact"],
        "dnll": t["ref_nll"] - t["ref_nll_full"], "kv_fraction": t["kv_fraction"],
        "mean_kl": t["mean_kl"],
        "held": t["peak_held_over_budget"], "first_divergence": t["first_divergence"],
        "ref_tokens": t["ref_tokens"], "reference": t["reference"]})


def replay_rows(directory, seed, budget):
    """Per policy (the floor's draws pooled by the summary's own seed-group row): the overall
    means and the peak held over the budget."""
    t = read(os.path.join(directory, f"replay_{budget}.csv"))
    t = t[(t["sample"] == "all") & ~is_draw(t["policy"])]
    out = t[["policy"] + [m for m, _ in REPLAY_METRICS if m in t]].copy()
    out["replay_held"] = t["peak_held_over_budget"]
    out["seed"], out["budget"] = seed, budget
    return out


def removed_by_head(group, sample):
    """Per (layer, KV head) of `sample` in one policy's group of a --dump-decisions file: the
    positions evicted or merged away by the end of decoding, unique and sorted."""
    if sample not in group["samples"]:
        return
    for layer in group["samples"][sample]["layers"].values():
        for head in layer["heads"].values():
            gone = [head[k][:, 1] for k in ("evicted", "merged") if k in head and head[k].shape[0]]
            yield np.unique(np.concatenate(gone)) if gone else np.zeros(0, dtype=np.int64)


def read_kept(path, modality, heads):
    """label -> share of the prompt's image and of its text entries (over layers and KV heads:
    `heads` = L·Hkv) neither evicted nor merged away by the end of decoding, from a
    --dump-decisions file; modality: sample -> (image positions, text positions)."""
    import h5py

    kept = {}
    with h5py.File(path, "r") as f:
        for label, g in f.items():
            removed, total = [0, 0], [0, 0]
            for sample, (image, text) in modality.items():
                total[0] += len(image) * heads
                total[1] += len(text) * heads
                for gone in removed_by_head(g, sample):
                    gone = set(gone.tolist())
                    removed[0] += len(gone & image)
                    removed[1] += len(gone & text)
            kept[label] = {"image_kept": 1 - removed[0] / max(total[0], 1),
                           "text_kept": 1 - removed[1] / max(total[1], 1)}
    return kept


def read_modality(trace):
    """sample -> (image positions, text positions) of the prompt; and L·Hkv."""
    import h5py

    with h5py.File(trace, "r") as f:
        heads = int(f.attrs["num_kv_heads"])
        out = {}
        for name, g in f["samples"].items():
            m = g["modality"][: int(g.attrs["prompt_len"])]
            out[name] = (set(np.flatnonzero(m != 0).tolist()), set(np.flatnonzero(m == 0).tolist()))
            layers = len(g["layers"])
    return out, layers * heads


def image_kept(directory, budget, modality, heads):
    """policy -> (image entries kept, text entries kept), the floor's draws averaged."""
    path = os.path.join(directory, f"decisions_{budget}.h5")
    if not os.path.exists(path):
        fail(f"{path}: no such file")
    by_policy = {}
    for label, kept in read_kept(path, modality, heads).items():
        by_policy.setdefault(group_of(label), []).append(kept)
    return {p: {k: float(np.mean([x[k] for x in v])) for k in ("image_kept", "text_kept")}
            for p, v in by_policy.items()}


def replay_by_image(directory, seed, budget):
    """(policy, sample) -> replay's output error and mass recall on that image: its layer rows
    pooled (weighted by their rows), the floor's draws averaged."""
    t = read(os.path.join(directory, f"replay_{budget}.csv"))
    t = t[t["sample"] != "all"].copy()
    t["policy"] = t["policy"].map(group_of)
    for m in ("mean_output_rel_error", "mean_mass_recall"):
        t[m] = t[m] * t["rows"]
    g = t.groupby(["policy", "sample"])[["mean_output_rel_error", "mean_mass_recall", "rows"]].sum()
    out = pd.DataFrame({"replay_output_rel_error": g["mean_output_rel_error"] / g["rows"],
                        "replay_mass_recall": g["mean_mass_recall"] / g["rows"]}).reset_index()
    out["seed"], out["budget"] = seed, budget
    return out


def load(seeds, budgets, unit="image"):
    live, replay, images, controls, builds = [], [], [], [], {}
    for seed, directory in seeds:
        modality, heads = read_modality(os.path.join(directory, "trace.h5"))
        own = [SELF] if os.path.exists(os.path.join(directory, f"live_{SELF}.csv")) else []
        for b in list(budgets) + own:
            live.append(live_rows(directory, seed, b))
            r = replay_rows(directory, seed, b)
            kept = image_kept(directory, b, modality, heads)
            for k in ("image_kept", "text_kept"):
                r[k] = r["policy"].map(lambda p: kept.get(p, {}).get(k, np.nan))
            replay.append(r)
            images.append(replay_by_image(directory, seed, b))
        with open(os.path.join(directory, "build.json"), encoding="utf-8") as f:
            builds[seed] = json.load(f)
        for c, name in controls_of(unit, builds[seed]):
            t = read(os.path.join(directory, f"control_{c}.csv"))
            t = t[t["sample"] != "all"]
            controls.append(pd.DataFrame({"seed": seed, "control": name, "sample": t["sample"],
                                          "contains": t["full_answer_contains"],
                                          "exact": t["full_answer_exact"]}))
    if len({task_of(b) for b in builds.values()}) > 1:
        fail("the seed directories hold builds of different tasks (lookup and count): report "
             "each task on its own")
    live = pd.concat(live, ignore_index=True)
    drawn = [set(g["sample"]) for _, g in live.groupby("seed")]
    if any(s != drawn[0] for s in drawn):
        fail("the seed directories hold different images: build them with the same test_seed")
    return (live, pd.concat(replay, ignore_index=True), pd.concat(images, ignore_index=True),
            pd.concat(controls, ignore_index=True)), builds


RESULTS = ("live", "replay", "replay_by_image", "controls")
# What identifies a row of each of them: no two folders joined may both hold one.
RESULT_KEYS = (("seed", "budget", "label", "sample"), ("seed", "budget", "policy"),
               ("seed", "budget", "policy", "sample"), ("seed", "control", "sample"))


def machine():
    """What produced a run, for the pages that quote it (kvsim.machine), with the versions of the
    libraries the report itself uses."""
    import matplotlib

    from kvsim.machine import describe_machine

    return dict(describe_machine(), pandas=pd.__version__, matplotlib=matplotlib.__version__)


def save_results(out, tables, builds, settings):
    """OUT/results/: the tables the report is made from (gzip-compressed CSV, every float as
    written by repr, so that they read back to the same values) and the builds and settings
    (with the machine that ran them)."""
    directory = os.path.join(out, "results")
    os.makedirs(directory, exist_ok=True)
    for name, table in zip(RESULTS, tables):
        table.to_csv(os.path.join(directory, f"{name}.csv.gz"), index=False,
                     compression={"method": "gzip", "mtime": 0})
    with open(os.path.join(directory, "builds.json"), "w", encoding="utf-8") as f:
        json.dump({"settings": settings, "builds": {str(k): v for k, v in builds.items()}}, f,
                  indent=1)
        f.write("\n")


def load_results(directory):
    """What save_results wrote: (tables in RESULTS order, builds, settings)."""
    tables = []
    for name in RESULTS:
        path = os.path.join(directory, f"{name}.csv.gz")
        if not os.path.exists(path):
            fail(f"{path}: no such file (a report's results/ folder holds {', '.join(RESULTS)})")
        tables.append(pd.read_csv(path, keep_default_na=False, na_values=[""],
                                  float_precision="round_trip",
                                  dtype={"sample": str, "budget": str, "label": str,
                                         "policy": str, "reference": str}))
    with open(os.path.join(directory, "builds.json"), encoding="utf-8") as f:
        saved = json.load(f)
    return tables, {int(k): v for k, v in saved["builds"].items()}, saved["settings"]


def joined(table, more, name, key, directory):
    """`table` and `more` (one of RESULTS) as one. A row both folders hold is kept once where the
    two are equal in every column (a cell run again beside new ones: the floors and the controls
    every run of the experiment repeats, which so shows it reproduced), and refused where they
    differ (two measurements of one cell: another machine's arithmetic, or another model)."""
    both = pd.concat([table, more], ignore_index=True).drop_duplicates()
    twice = both[both.duplicated(list(key), keep=False)]
    if not twice.empty:
        r = twice.iloc[0]
        rows = twice[(twice[list(key)] == r[list(key)]).all(axis=1)]
        differ = [c for c in rows.columns if c not in key and
                  rows[c].astype(str).nunique(dropna=False) > 1]
        fail(f"--from-results {directory}: its {name} results differ from an earlier folder's "
             "for one cell (" + ", ".join(f"{k} {r[k]}" for k in key) + f": {', '.join(differ)}"
             "); a cell measured twice must give the same row to be joined")
    return both


def _model_of(build):
    """What a build.json says of the trained model: all but the time its steps took (the
    machine's, not the model's: a build found again elsewhere takes another)."""
    return {k: v for k, v in build.items() if k != "seconds"}


def merge_results(loaded, directories):
    """Several results/ folders (load_results each) as one: the tables' rows joined, the builds
    and seeds together. Their unit and order must agree; their budgets are joined, and every
    policy must then have run on every seed at each budget it ran. A seed may be in two folders
    (other policies or budgets run on the same trained model, whose build must be the same); a
    result both hold (a row of one seed, budget, policy and item, or a control) must be the same
    row (joined). The machine of each folder is kept with its seeds ("machines") where they
    differ."""
    if len(loaded) == 1:
        return loaded[0]
    tables, builds, settings = list(loaded[0][0]), dict(loaded[0][1]), loaded[0][2]
    machines = [dict(settings.get("machine", {}), seeds=list(settings["seeds"]))]
    for (more_tables, more_builds, more), directory in zip(loaded[1:], directories[1:]):
        for key in ("unit", "order"):
            if more.get(key) != settings.get(key):
                fail(f"--from-results {directory}: its {key} {more.get(key)} differs from "
                     f"{directories[0]}'s {settings.get(key)}")
        for seed in set(more_builds) & set(builds):
            if _model_of(more_builds[seed]) != _model_of(builds[seed]):
                fail(f"--from-results {directory}: seed {seed}'s build differs from an earlier "
                     "folder's (another trained model)")
        tables = [joined(t, m, name, key, directory) for t, m, name, key in
                  zip(tables, more_tables, RESULTS, RESULT_KEYS)]
        builds.update({k: v for k, v in more_builds.items() if k not in builds})  # the first kept
        machines.append(dict(more.get("machine", {}), seeds=list(more["seeds"])))
        settings = dict(settings, seeds=sorted(set(settings["seeds"]) | set(more["seeds"])),
                        budgets=sorted(set(settings["budgets"]) | set(more["budgets"]), key=float))
    # A policy of fewer seeds than the others would be averaged over other models than its
    # neighbours in the tables: every policy joined runs on every seed at each budget.
    live = tables[0]
    ran = set(settings["budgets"]) | set(live["budget"])
    for b in sorted(ran, key=lambda b: (b == SELF, float(b) if b != SELF else 0)):
        for p, g in live[live["budget"] == b].groupby("policy"):
            missing = sorted(set(settings["seeds"]) - set(g["seed"]))
            if missing:
                fail(f"--from-results: budget {b}%: `{p}` has no results for seed(s) "
                     f"{', '.join(map(str, missing))}: every policy joined must run on every "
                     "seed at each budget")
    settings.pop("machine", None)
    if all({k: v for k, v in m.items() if k != "seeds"} ==
           {k: v for k, v in machines[0].items() if k != "seeds"} for m in machines):
        settings["machine"] = {k: v for k, v in machines[0].items() if k != "seeds"}
    else:
        settings["machines"] = machines
    return tables, builds, settings


def merge_identical(live):
    """Policies whose answers are the same on every image, seed and budget (at equal memory some
    presets become their policy) are reported as one row, their names joined."""
    key = live.sort_values(["seed", "budget", "sample"])
    signature = {p: tuple(g["contains"].fillna(-1)) + tuple(g["exact"].fillna(-1)) +
                 tuple(g["dnll"].round(9).fillna(-1))
                 for p, g in key[~is_draw(key["label"])].groupby("policy")}
    rename, dropped = alike_names(signature)
    return under_joined_names(live, rename, dropped), rename


def alike_names(signatures):
    """{policy: signature} -> (rename, dropped): the policies of one signature under one name,
    "a, b" (the policy before its presets), all but its first member dropped."""
    names = {}
    for p, sig in signatures.items():
        names.setdefault(sig, []).append(p)
    rename, dropped = {}, set()
    for group in names.values():
        if len(group) > 1:
            group = sorted(group, key=lambda n: (":" in n, n))
            rename.update({p: ", ".join(group) for p in group})
            dropped.update(group[1:])
    return rename, dropped


def under_joined_names(table, rename, dropped):
    """A table's rows of the policies alike_names kept, under their joined names."""
    out = table[~table["policy"].isin(dropped)].copy()
    out["policy"] = out["policy"].map(lambda p: rename.get(p, p))
    return out


def renamed(table, rename):
    """A replay table with the merged policies' rows under their joined name (averaged)."""
    t = table.copy()
    t["policy"] = t["policy"].map(lambda p: rename.get(p, p))
    keys = [c for c in ("seed", "budget", "policy", "sample") if c in t]
    return t.groupby(keys, as_index=False).mean(numeric_only=True)


def per_seed(live, value):
    """(seed, budget, policy) -> `value`'s mean over images (the draws averaged first)."""
    draws = live.groupby(["seed", "budget", "policy", "sample"], as_index=False)[value].mean()
    return draws.groupby(["seed", "budget", "policy"], as_index=False)[value].mean()


def interval_words(seeds, units):
    """What a cell's interval resamples, in words."""
    if seeds >= 2:
        return (f"crossed bootstrap over seeds and {units} at once, each cell averaged over the "
                "random floor's draws")
    return f"percentile bootstrap over {units}, each averaged over the random floor's draws"


def interval_table(live, value):
    """(budget, policy) -> n images, mean, 95% interval (over seeds and images at once, Owen's
    crossed bootstrap, with two seeds or more; over images with one), mean over seeds and SD over
    seeds."""
    import kvsim

    cells = per_cell(live, value)
    rows = []
    for (budget, policy), g in cells.groupby(["budget", "policy"], sort=True):
        grid = g.pivot(index="seed", columns="sample", values=value).dropna(axis=1)
        if grid.shape[0] >= 2:
            b = kvsim.crossed_bootstrap(grid.to_numpy())
            low, high = b["ci_low"], b["ci_high"]
        else:
            s = kvsim.summarize({"policy": g["policy"], "sample": g["sample"], value: g[value]},
                                value)
            low, high = float(s["ci_low"].iloc[0]), float(s["ci_high"].iloc[0])
        rows.append({"budget": budget, "policy": policy, "n": grid.shape[1],
                     value: float(grid.to_numpy().mean()), f"{value}_ci_low": low,
                     f"{value}_ci_high": high})
    out = pd.DataFrame(rows)
    seeds = per_seed(live, value).groupby(["budget", "policy"])[value]
    return out.merge(seeds.std(ddof=1).rename(f"{value}_seed_sd").reset_index(),
                     on=["budget", "policy"])


def retention(live):
    """(budget, policy) -> of the images the full cache answers right (per seed), the share the
    policy answers right too; the mean over seeds."""
    right = live[live["full_contains"] == 1]
    per = right.groupby(["seed", "budget", "policy"])["contains"].mean()
    return per.groupby(["budget", "policy"]).mean().rename("retention").reset_index()


def per_cell(live, value):
    """(seed, budget, policy, sample) -> `value` averaged over the random floor's draws."""
    return live.groupby(["seed", "budget", "policy", "sample"], as_index=False)[value].mean()


def test_family(cells, metric, reference, seeds):
    """Every policy of `cells` (one budget's rows) against `reference`, Holm over the family:
    over trained models and items at once (kvsim.compare_seeds) with two seeds or more, over
    items alone with one (a statement about that trained model only)."""
    import kvsim

    if seeds >= 2:
        return kvsim.compare_seeds(cells.drop(columns="budget"), metric, reference,
                                   higher_is_better=True)
    return kvsim.compare({"policy": cells["policy"], "sample": cells["sample"],
                          metric: cells[metric]}, metric, reference=reference)


def comparisons(live, budgets, metric="contains"):
    """Per budget, three families, each Holm-adjusted on its own: every policy against the random
    floor, against `text_only` (every image entry evicted after the prefill; the memory it holds
    is its own, stated beside) and against the budget's best policy by mean accuracy (floors
    left out). Paired over seeds and items (test_family)."""
    cells = per_cell(live, metric)
    seeds = cells["seed"].nunique()
    text = cells[cells["policy"] == "text_only"]
    out = []
    for budget in budgets:
        g = cells[cells["budget"] == budget]
        families = []
        for floor in RANDOM_FLOORS:
            if floor in set(g["policy"]):
                families.append((floor, g, floor))
        if not text.empty:
            families.append(("text_only", pd.concat([g, text.assign(budget=budget)]), "text_only"))
        means = g.groupby("policy")[metric].mean().drop(labels=list(TESTED_FLOORS),
                                                        errors="ignore")
        if not means.empty:
            families.append(("best", g, means.idxmax()))
        for against, rows, reference in families:
            c = test_family(rows, metric, reference, seeds)
            c.insert(0, "budget", budget)
            c.insert(1, "against", against)
            out.append(c)
    return pd.concat(out, ignore_index=True)


def kendall_w(matrix):
    """Kendall's coefficient of concordance of m raters (rows) ranking n items (columns), ties
    given their mean rank and corrected for (Kendall and Babington Smith 1939):
    W = 12 S / (m² (n³ − n) − m Σ T), S the sum of squared deviations of the items' rank sums from
    their mean, T = Σ (t³ − t) over each rater's groups of t tied items."""
    m, n = matrix.shape
    if m < 2 or n < 2:
        return float("nan")
    r = np.array([ranks(row) for row in matrix])
    totals = r.sum(axis=0)
    s = float(((totals - totals.mean()) ** 2).sum())
    ties = 0.0
    for row in matrix:
        _, counts = np.unique(row, return_counts=True)
        ties += float((counts ** 3 - counts).sum())
    denominator = m * m * (n ** 3 - n) - m * ties
    return s / denominator * 12 if denominator > 0 else float("nan")


def stability(live, budgets):
    """budget -> Kendall's W of the policies' accuracy ranks across seeds, the floors left out
    (TESTED_FLOORS: a floor last for every seed inflates the agreement), over every
    other budgeted policy and over the top half by mean accuracy (where a choice is made)."""
    acc = per_seed(live, "contains")
    acc = acc[~acc["policy"].isin(TESTED_FLOORS)]
    out = {}
    for b in budgets:
        pivot = acc[acc["budget"] == b].pivot(index="seed", columns="policy", values="contains")
        pivot = pivot.dropna(axis=1)
        top = pivot.mean().sort_values(ascending=False).index[:max(2, pivot.shape[1] // 2)]
        out[b] = (kendall_w(pivot.to_numpy()), kendall_w(pivot[top].to_numpy()), pivot.shape[1],
                  len(top))
    return out


def free_structure(live):
    """What the task gives away: the first answer token (first_divergence >= 1: the greedy
    answers agree on it) and the answers' length in tokens per class word."""
    policy_rows = live[live["policy"] != "full"]
    first = int((policy_rows["first_divergence"] >= 1).sum())
    lengths = (live.drop_duplicates(["seed", "sample"])
               .groupby("reference")["ref_tokens"].agg(["min", "max"]))
    return first, len(policy_rows), lengths


def fmt(x, spec=".3f"):
    return "–" if x is None or (isinstance(x, float) and np.isnan(x)) else format(x, spec)


def cell(row, value):
    """'0.558 ± 0.050 [0.47, 0.64]': mean over seeds ± SD over seeds, the interval over images."""
    sd = row[f"{value}_seed_sd"]
    spread = f" ± {fmt(sd, '.2f')}" if not np.isnan(sd) else ""
    return (f"{fmt(row[value])}{spread} [{fmt(row[f'{value}_ci_low'], '.2f')}, "
            f"{fmt(row[f'{value}_ci_high'], '.2f')}]")


def held_marks(table, question):
    """(budget, policy) -> whether the peak held is more than 1% off what equal memory holds: the
    budget (compress and the tail orders), or, with the question appended after compression, the
    budget's median over policies (every policy holds the same context rows plus the question and
    answer)."""
    budgeted = table[table["budget"] != SELF]
    marks = {}
    for b, g in budgeted.groupby("budget"):
        target = float(g["held"].median()) if question == "append" else 1.0
        for _, r in g.iterrows():
            marks[(b, r["policy"])] = abs(r["held"] / target - 1) > 0.01
    return marks


def how_tested(seeds, units):
    """What a report's tests resample, in words."""
    if seeds >= 2:
        return (f"paired over trained models and {units} at once: a crossed bootstrap that "
                f"resamples seeds and {units}, so a verdict is about the methods, not only these "
                "models")
    return (f"paired over {units} of one trained model: a verdict is about that model, not the "
            "methods")


def p_text(p):
    """A p-value to three decimals, '<0.001' below."""
    return "<0.001" if p < 0.001 else fmt(p, ".3f")


def with_p(row):
    """'`name` −0.007 (p 1.000)': a comparison's difference and its p after Holm."""
    return f"`{row['policy']}` {row['difference']:+.3f} (p {p_text(row['p_holm'])})"


def power_text(c):
    """The power statement of a family: the median over its comparisons of the difference with
    80% power at Holm's first step."""
    detect = c["detectable"].dropna()
    if detect.empty:
        return "no difference can be shown with these samples at Holm's level"
    return (f"differences below {detect.median():.3f} have under 80% power at Holm's first step "
            f"(α = 0.05 / {int(c['family_size'].max())}; median over the comparisons)")


def write_best(f, comps, budgets, how):
    f.write(f"\n**Which differences hold up.** Per budget, the best policy by mean accuracy (the "
            f"floors left out) and every other policy's difference from it with p after Holm over "
            f"the budget's comparisons ({how}):\n\n")
    for b in budgets:
        c = comps[(comps["budget"] == b) & (comps["against"] == "best")]
        if c.empty:
            continue
        c = c.sort_values("difference", ascending=False)
        tied = c[c["verdict"] == "no difference shown"]
        below = c[c["verdict"] != "no difference shown"]
        f.write(f"- {b}%: `{c['reference'].iloc[0]}` ({fmt(c['reference_mean'].iloc[0])}). "
                "Not shown to differ from it: " +
                (", ".join(with_p(r) for _, r in tied.iterrows()) if len(tied) else "none") +
                f". Shown to differ: {len(below)} of {len(c)}" +
                (f", the closest {with_p(below.iloc[0])}" if len(below) else "") +
                f". Power: {power_text(c)}.\n")


VERDICT_WORDS = {"better": "shown above", "no difference shown": "not shown to differ",
                 "worse": "shown below"}


def floor_cell(comps, b, p, against):
    r = comps[(comps["budget"] == b) & (comps["against"] == against) & (comps["policy"] == p)]
    if r.empty:
        return "–"
    r = r.iloc[0]
    mark = {"better": " ▲", "worse": " ▼"}.get(r["verdict"], "")
    return f"{r['difference']:+.3f}{mark} ({p_text(r['p_holm'])})"


def write_floors(f, comps, budgets, order, held_text):
    """Each policy's difference from `random` and from `text_only`, p after Holm beside."""
    against = [a for a in TESTED_FLOORS if (comps["against"] == a).any()]
    if not against:
        return
    c = comps[comps["against"].isin(against)]
    floor = (c["smallest_p"] * c["family_size"]).min()
    f.write("\n**Against the floors.** Each policy's accuracy minus the floor's at the same "
            "budget, ▲/▼ where Holm over the budget's family shows it better/worse, p after Holm "
            f"in brackets (the smallest p the resamples give is {fmt(c['smallest_p'].min(), '.4f')}"
            f", {fmt(floor, '.3f')} after Holm)." + (" " + held_text if held_text else "") +
            "\n\n| policy | " +
            " | ".join(f"{b}% − `{a}`" for b in budgets for a in against) + " |\n|---|" +
            "---|" * (len(budgets) * len(against)) + "\n")
    for p in order:
        if p in TESTED_FLOORS:
            continue
        f.write(f"| `{p}` | " + " | ".join(floor_cell(comps, b, p, a) for b in budgets
                                            for a in against) + " |\n")
    f.write("\n")
    for a in against:
        for b in budgets:
            c = comps[(comps["budget"] == b) & (comps["against"] == a) &
                      ~comps["policy"].isin(TESTED_FLOORS)]
            groups = [(v, sorted(c[c["verdict"] == v]["policy"]))
                      for v in ("better", "no difference shown", "worse")]
            f.write(f"- {b}% against `{a}`: " + "; ".join(
                f"{VERDICT_WORDS[v]} ({len(names)}): " +
                (", ".join(f"`{n}`" for n in names) if names else "none")
                for v, names in groups) + ".\n")


def write_tests(f, comps, w, budgets, rho_pooled, rho_within, how):
    """The report's tests and ranks: every policy's difference from each budget's best,
    Kendall's W across seeds and replay's metrics against the accuracy loss."""
    write_best(f, comps, budgets, how)
    floors_run = set(comps["policy"]) | set(comps["against"])
    f.write("\n**Rank stability across seeds** (Kendall's W of the policies' accuracy ranks, "
            "1 = every seed ranks them alike; the floors left out: " +
            ", ".join(f"`{x}`" for x in TESTED_FLOORS if x in floors_run) + "): " +
            ", ".join(f"{b}%: {fmt(w[b][0], '.2f')} over {w[b][2]} policies, "
                      f"{fmt(w[b][1], '.2f')} over the top {w[b][3]}" for b in budgets) + ".\n\n")
    f.write("**Replay's metrics against the live accuracy loss** (Spearman ρ over the "
            "policies; pooled over budgets, and within each budget):\n\n| replay metric | "
            "pooled | " + " | ".join(f"{b}%" for b in budgets) + " |\n|---|---|" +
            "---|" * len(budgets) + "\n")
    for m, label in REPLAY_METRICS:
        f.write(f"| {label} | {fmt(rho_pooled[m], '+.2f')} | " +
                " | ".join(fmt(rho_within[(m, b)], "+.2f") for b in budgets) + " |\n")
    f.write(f"| the budget alone | {fmt(rho_pooled['budget'], '+.2f')} | " +
            " | ".join("–" for _ in budgets) + " |\n")


def _write_header(f, builds, budgets, seeds, n_images, unit, question, reading, tested):
    """The run's description, the full cache's accuracy over seeds, and a chance warning."""
    units = f"{unit}s"
    seeds_word = "projector seeds" if unit == "image" else "training seeds"
    full = [b["full"]["accuracy"] for b in builds.values()]
    memory = ORDER_TEXT[question]
    f.write(f"{n_images} held-out {units}, {len(seeds)} {seeds_word} "
            f"({', '.join(map(str, seeds))}), budgets {', '.join(b + '%' for b in budgets)}, "
            f"{memory}. Primary metric: accuracy, the greedy answer contains "
            "the class word; exact match (nothing else) beside it. Cells: mean over seeds ± "
            f"SD over seeds [95% interval: {interval_words(len(seeds), units)}].\n\n")
    f.write(f"Full cache: accuracy {np.mean(full):.3f} ± {np.std(full, ddof=1) if len(full) > 1 else float('nan'):.3f} over seeds "
            f"({', '.join(f'{x:.3f}' for x in full)}).\n\n")
    if not tested:
        f.write(at_chance_text(reading, unit) + "\n")


def _write_references(f, controls, oracle, self_rows):
    """The references: control prompts, the replay-only oracle and text_only."""
    f.write("**References** (full cache, one value per prompt form):\n\n| reference | accuracy | exact |\n|---|---|---|\n")
    for name, g in controls.groupby("control", sort=False):
        per = g.groupby("seed")[["contains", "exact"]].mean()
        f.write(f"| {name} (control prompt) | {per['contains'].mean():.3f} ± {per['contains'].std(ddof=1):.3f} | "
                f"{per['exact'].mean():.3f} ± {per['exact'].std(ddof=1):.3f} |\n")
    if not oracle.empty:
        f.write("| `oracle` (replay only: the best set in hindsight, no live run): replay "
                "output error " + ", ".join(
                    f"{fmt(r['mean_output_rel_error'], '.3f')} at {r['budget']}%"
                    for _, r in oracle.iterrows()) + " | – | – |\n")
    for _, r in self_rows[self_rows["policy"] == "text_only"].iterrows():
        f.write(f"| `text_only` (every image entry evicted after the prefill; holds {r['kv_fraction']:.2f}) | "
                f"{cell(r, 'contains')} | {cell(r, 'exact')} |\n")


def _write_accuracy(f, table, budgeted, comps, order, budgets, draws, question, tested, how):
    """Accuracy at equal memory, marked against the random floor where tests were run."""
    marks = held_marks(table, question)
    f.write("\n**Accuracy at equal memory** (contains; `!` marks a cell whose peak held "
            "entries are more than 1% off " +
            ("the budget's median over policies" if question == "append" else "the budget") +
            "):\n\n| policy | " +
            " | ".join(f"{b}%" for b in budgets) + " |\n|---|" + "---|" * len(budgets) + "\n")
    vs_random = comps[comps["against"] == "random"].set_index(["budget", "policy"])
    for p in order:
        cells = []
        for b in budgets:
            r = budgeted[(budgeted["policy"] == p) & (budgeted["budget"] == b)]
            if r.empty:
                cells.append("–")
                continue
            r = r.iloc[0]
            mark = "!" if marks.get((b, p)) else ""
            verdict = ""
            if tested and (b, p) in vs_random.index:
                v = vs_random.loc[(b, p), "verdict"]
                verdict = {"better": " ▲", "worse": " ▼"}.get(v, "")
            cells.append(cell(r, "contains") + mark + verdict)
        name = f"`{p}`" + (f" ({draws[p]} draws)" if draws.get(p, 1) > 1 else "")
        f.write(f"| {name} | " + " | ".join(cells) + " |\n")
    f.write(f"\n▲ / ▼: better / worse than `random` at that budget ({how}; Holm over the "
            "budget's table, α = 0.05; the differences and p under **Against the floors**); "
            "no mark: no difference from the random floor shown.\n\n" if tested else "\n")


def _write_exact_and_retention(f, budgeted, order, budgets, unit):
    """Exact match, then retention and ΔNLL, per policy and budget."""
    f.write("**Exact match** (the answer is the class word and nothing else):\n\n| policy | " +
            " | ".join(f"{b}%" for b in budgets) + " |\n|---|" + "---|" * len(budgets) + "\n")
    for p in order:
        cells = []
        for b in budgets:
            r = budgeted[(budgeted["policy"] == p) & (budgeted["budget"] == b)]
            cells.append("–" if r.empty else cell(r.iloc[0], "exact"))
        f.write(f"| `{p}` | " + " | ".join(cells) + " |\n")
    f.write(f"\n**Retention** (of the {unit}s the full cache answers right, the share still "
            "right; mean over seeds) and the **ΔNLL** of the reference answer (nats per "
            "token; mean over seeds):\n\n| policy | " +
            " | ".join(f"retention {b}%" for b in budgets) + " | " +
            " | ".join(f"ΔNLL {b}%" for b in budgets) + " |\n|---|" +
            "---|" * (2 * len(budgets)) + "\n")
    for p in order:
        ret, dn = [], []
        for b in budgets:
            r = budgeted[(budgeted["policy"] == p) & (budgeted["budget"] == b)]
            ret.append("–" if r.empty else fmt(r.iloc[0]["retention"]))
            dn.append("–" if r.empty else fmt(r.iloc[0]["dnll"], "+.2f"))
        f.write(f"| `{p}` | " + " | ".join(ret) + " | " + " | ".join(dn) + " |\n")


def _write_self_sized(f, self_rows):
    """The policies that size their caches themselves, by the memory they held."""
    if not self_rows.empty:
        f.write("\n**Policies that size their caches themselves** (one run each; compare them "
                "by the memory they held, not with the budgeted table):\n\n| policy | held "
                "(peak, of the full cache) | accuracy | exact | retention |\n"
                "|---|---|---|---|---|\n")
    for _, r in self_rows.sort_values("kv_fraction").iterrows():
        f.write(f"| `{r['policy']}` | {r['kv_fraction']:.2f} | {cell(r, 'contains')} | "
                f"{cell(r, 'exact')} | {fmt(r['retention'])} |\n")


def _write_first_token(f, first, lengths, question, unit):
    """Where the first answer token comes from in this order, and how the answers are spelled."""
    count, total = first
    if question == "compress":
        f.write("\n**What the task gives for free.** Live compresses the cache after the "
                "prefill, so the first answer token is predicted from the full prompt: the "
                f"greedy answers agree on it in {count:,} of {total:,} policy runs on an "
                f"{unit}. ")
    elif question in ("tail1", "tailq"):
        fed = "prompt's last token" if question == "tail1" else "question"
        f.write(f"\n**The first answer token.** The {fed} is fed after compression, so the "
                "first answer token is predicted from the compressed cache: the greedy "
                f"answers agree with the full cache's on it in {count:,} of {total:,} policy "
                f"runs on an {unit}. ")
    else:
        f.write("\n**The first answer token.** The question is read after compression, so "
                "the first answer token is predicted from the compressed cache: the greedy "
                f"answers agree with the full cache's on it in {count:,} of {total:,} policy "
                f"runs on an {unit}. ")
    f.write("The class words are spelled in several tokens (the reference answer: the word, "
            "its period and the end token): " +
            ", ".join(f"{w.strip()} {int(r['max'])}" for w, r in lengths.iterrows()) + ".\n")


def write_report(path, table, comps, w, controls, builds, budgets, seeds, first, lengths,
                 rho_pooled, rho_within, n_images, draws, oracle, unit="image",
                 question="compress", reading=None):
    """reading: full_cache_reading's; a full cache at chance gets no tests, ranks or marks."""
    tested = reading is None or reading["above_chance"]
    how = how_tested(len(seeds), f"{unit}s")
    budgeted = table[table["budget"] != SELF]
    self_rows = table[table["budget"] == SELF]
    order = (budgeted.groupby("policy")["contains"].mean().sort_index().index.tolist())
    refs = [p for p in FLOORS if p in order]
    order = refs + [p for p in order if p not in refs]
    with open(path, "w", encoding="utf-8") as f:
        _write_header(f, builds, budgets, seeds, n_images, unit, question, reading, tested)
        _write_references(f, controls, oracle, self_rows)
        _write_accuracy(f, table, budgeted, comps, order, budgets, draws, question, tested, how)
        _write_exact_and_retention(f, budgeted, order, budgets, unit)
        _write_self_sized(f, self_rows)
        if tested:
            text_held = self_rows[self_rows["policy"] == "text_only"]["kv_fraction"]
            write_floors(f, comps, budgets, order,
                         f"`text_only` holds {text_held.iloc[0]:.2f} of the full cache, its own "
                         "memory, not the budget's." if len(text_held) else "")
            write_tests(f, comps, w, budgets, rho_pooled, rho_within, how)
        _write_first_token(f, first, lengths, question, unit)


# What each build measured with the full cache (its build.json): the prompt forms, in the order
# the report lists them, and the share of answers that name the class of the image in the asked
# place after another image took it (the control's own key).
BUILD_FORMS = (("full", "the image", "the images"),
               ("shared", None, "several questions on one context (each asked every box)"),
               ("no_image", "no image tokens", "no image tokens"),
               ("swapped", "another image's tokens (a fixed derangement)",
                "the asked box's image swapped for one of another class"),
               ("shuffled", None, "the images shuffled among the boxes"))
NAMES_THE_NEW_CLASS = ("names_the_swapped_in_class", "names_the_class_now_in_the_box",
                       "names_the_count_now")
# The counting form's labels where they differ from the lookup's (the same build.json keys).
COUNT_FORMS = {"swapped": dict(COUNT_CONTROLS)["swapped"],
               "shuffled": dict(COUNT_CONTROLS)["shuffled"],
               "shared": "several questions on one context (each class it holds asked)"}


def spread(values, listed=False):
    """mean ± SD over seeds (one seed: its value), with each seed's value when `listed`."""
    if len(values) == 1:
        return f"{values[0]:.3f}"
    text = f"{np.mean(values):.3f} ± {np.std(values, ddof=1):.3f}"
    return text + (f" ({', '.join(f'{v:.3f}' for v in values)})" if listed else "")


def builds_report(builds, unit="image"):
    """The builds' own full-cache measurement (build.json of each seed) as a table: per prompt
    form, the accuracy over seeds with each seed's value, the share of answers that name some
    class, and, where another image took the asked place, the share that name that image's
    class. Does the model read the image: what every budgeted result is measured against."""
    seeds = sorted(builds)
    first = builds[seeds[0]]
    items = first["test_images" if unit == "image" else "test_items"]
    word = "held-out images" if unit == "image" else "held-out items"
    seeds_word = "projector seed" if unit == "image" else "training seed"
    which = (f"{seeds_word} {seeds[0]}" if len(seeds) == 1 else
             f"{len(seeds)} {seeds_word}s: {', '.join(map(str, seeds))}; mean ± SD over seeds, "
             "each seed's accuracy in brackets")
    count = unit == "item" and task_of(first) == "count"
    rows = []
    for key, single, multi in BUILD_FORMS:
        label = single if unit == "image" else multi
        if count and key in COUNT_FORMS:
            label = COUNT_FORMS[key]
        if label is None or any(key not in builds[s] for s in seeds):
            continue
        measured = [builds[s][key] for s in seeds]
        named = next((k for k in NAMES_THE_NEW_CLASS if k in measured[0]), None)
        rows.append(f"| {label} | {spread([m['accuracy'] for m in measured], listed=True)} | "
                    f"{spread([m['answers_a_class_word'] for m in measured])} | "
                    f"{spread([m[named] for m in measured]) if named else '–'} |")
    columns = (("answers with some count word", "names the count the changed item holds") if count
               else ("answers with some class word",
                     "names the class of the image now in the asked place"))
    return (f"**Does it read the image?** Greedy answers with the full cache on the {items} {word}"
            f", as each build measured them ({which}):\n\n| prompt | accuracy | {columns[0]} | "
            f"{columns[1]} |\n|---|---|---|---|\n" + "\n".join(rows) + "\n")


def _accuracy_bars(ax, x, g, **style):
    """Accuracy at x with its 95% interval over images as error bars."""
    ax.errorbar(x, g["contains"], yerr=[g["contains"] - g["contains_ci_low"],
                                        g["contains_ci_high"] - g["contains"]],
                capsize=2, **style)


def _full_line(ax, full):
    ax.axhline(full, color="black", lw=0.8, ls=":", label=f"full cache ({full:.2f})")


def _accuracy_vs_memory(budgeted, self_rows, full, unit, out, written):
    """The headline: accuracy against the memory each policy actually held, with intervals."""
    fig, ax = new_figure(figsize=(10, 5.5))
    for p, g in budgeted.groupby("policy"):
        g = g.sort_values("kv_fraction")
        _accuracy_bars(ax, g["kv_fraction"], g, label=p + (" (floor)" if p in FLOORS else ""),
                       lw=2.2 if p in FLOORS else 1.0, ms=4, **policy_style(p))
    for _, r in self_rows.iterrows():
        style = policy_style(r["policy"])
        _accuracy_bars(ax, [r["kv_fraction"]], pd.DataFrame([r]),
                       label=f"{r['policy']} (sizes itself)", color=style["color"],
                       marker=style["marker"], ms=7, ls="none", mfc="none")
    _full_line(ax, full)
    ax.set(title="Answer accuracy against memory held (mean over seeds; bars: 95% interval over "
           f"{unit}s)", xlabel="peak KV memory held while decoding (share of the full cache)",
           ylabel="accuracy (answer contains the class word)")
    ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))
    save(fig, out, "vlm_accuracy_vs_memory", written)


def _accuracy_vs_budget(budgeted, full, unit, out, written):
    fig, ax = new_figure(figsize=(10, 5))
    for p, g in budgeted.groupby("policy"):
        g = g.sort_values("budget", key=lambda s: s.astype(float))
        _accuracy_bars(ax, g["budget"].astype(float), g, label=p,
                       lw=2.2 if p in FLOORS else 1.0, ms=4, **policy_style(p))
    _full_line(ax, full)
    ax.set(title=f"Answer accuracy by budget at equal memory (bars: 95% interval over {unit}s)",
           xlabel="budget (% of the prompt's entries per layer and KV head)",
           ylabel="accuracy (answer contains the class word)")
    ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))
    save(fig, out, "vlm_accuracy_vs_budget", written)


def _accuracy_vs_image_kept(budgeted, full, out, written):
    fig, ax = new_figure(figsize=(10, 5))
    for p, g in budgeted.groupby("policy"):
        style = policy_style(p)
        ax.scatter(g["image_kept"], g["contains"], label=p, color=style["color"],
                   marker=style["marker"])
        for _, r in g.iterrows():
            ax.annotate(f"{r['budget']}%", (r["image_kept"], r["contains"]), fontsize=5,
                        xytext=(2, 2), textcoords="offset points")
    _full_line(ax, full)
    ax.set(title="Which image entries stay matters more than how many (labels: budget)",
           xlabel="image entries still stored at the end (share, replay)",
           ylabel="accuracy (answer contains the class word)")
    ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))
    save(fig, out, "vlm_accuracy_vs_image_kept", written)


def _replay_vs_accuracy(budgeted, budgets, out, written):
    fig, axes = new_figure(1, len(budgets), figsize=(4 * len(budgets), 3.8), squeeze=False)
    for ax, b in zip(axes[0], budgets):
        g = budgeted[budgeted["budget"] == b]
        for _, r in g.iterrows():
            style = policy_style(r["policy"])
            ax.scatter(r["mean_output_rel_error"], r["accuracy_loss"], color=style["color"],
                       marker=style["marker"], label=r["policy"])
        rho = spearman(g["mean_output_rel_error"].tolist(), g["accuracy_loss"].tolist())
        ax.set(title=f"{b}%: Spearman ρ = {rho:+.2f}", xlabel="replay output error ‖o − ô‖/‖o‖",
               ylabel="live accuracy loss (full − policy)")
    axes[0][0].legend(fontsize=5, ncol=2)
    save(fig, out, "vlm_replay_vs_accuracy", written)


def figures(table, live, budgets, out, unit="image"):
    written = []
    budgeted = table[table["budget"] != SELF]
    self_rows = table[table["budget"] == SELF]
    full = float(live.groupby("seed")["full_contains"].mean().mean())
    _accuracy_vs_memory(budgeted, self_rows, full, unit, out, written)
    _accuracy_vs_budget(budgeted, full, unit, out, written)
    _accuracy_vs_image_kept(budgeted, full, out, written)
    _replay_vs_accuracy(budgeted, budgets, out, written)
    return written


def inputs(a):
    """The report's tables, builds and settings: from the runs (--seed, --budgets), or as a
    report kept them (--from-results)."""
    if a.from_results:
        return merge_results([load_results(d) for d in a.from_results], a.from_results)
    if not a.budgets or not a.seed:
        fail("give --budgets and --seed SEED=DIRECTORY ..., or --from-results DIR")
    seeds = []
    for item in a.seed:
        seed, sep, directory = item.partition("=")
        if not sep or not os.path.isdir(directory):
            fail(f"--seed {item}: expected SEED=DIRECTORY of a vlm_eval.sh run")
        seeds.append((int(seed), directory))
    budgets = [b.rstrip("%") for b in a.budgets]
    tables, builds = load(seeds, budgets, a.unit)
    return tables, builds, {"budgets": budgets, "seeds": [s for s, _ in seeds], "unit": a.unit,
                            "order": a.order, "machine": machine()}


def _parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budgets", nargs="+", help="the budgets, in percent")
    ap.add_argument("--seed", nargs="+", help="SEED=DIRECTORY of each seed's run")
    ap.add_argument("--from-results", metavar="DIR", nargs="+",
                    help="a report's results/ folder instead of the runs (budgets, unit and "
                         "order as saved there); several: joined (their seeds and budgets "
                         "united, the same unit and order; a cell two folders hold is kept once "
                         "where their rows are equal and refused where not)")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--unit", choices=("image", "item"), default="image",
                    help="what a sample is: a single-image prompt, or a multi-image task's item")
    ap.add_argument("--order", choices=tuple(ORDER_TEXT), default="compress",
                    help="how the prompt met the compression: compress (all of it), tail1 and "
                         "tailq (all but its last token or its question, fed after: "
                         "--prompt-tail), append (the question appended, kvpress's order)")
    ap.add_argument("--no-figures", action="store_true",
                    help="the tables and the report only (a report that another reads, as "
                         "vlm_factorial.py reads each order's)")
    ap.add_argument("--chance", type=float, default=0.1,
                    help="the accuracy of a guess (0.1: one of the ten class words; 0.2 for "
                         "the counting form, one of five counts); a full cache not above it gets "
                         "no tests, ranks or marks")
    return ap.parse_args(argv)


def _policy_table(live, replay):
    """Per (budget, policy): accuracy and exact match with their intervals, retention, ΔNLL,
    memory held (mean, and the seed furthest off its budget), the loss against the full cache,
    and replay's means."""
    table = interval_table(live, "contains").merge(interval_table(live, "exact"),
                                                   on=["budget", "policy", "n"])
    table = table.merge(retention(live), on=["budget", "policy"], how="left")
    extra = live.groupby(["budget", "policy"]).agg(
        dnll=("dnll", "mean"), kv_fraction=("kv_fraction", "mean"), held=("held", "max"),
        full=("full_contains", "mean")).reset_index()
    worst = live.assign(off=(live["held"] - 1).abs()).sort_values("off").groupby(
        ["budget", "policy"]).tail(1)[["budget", "policy", "held"]]
    table = table.merge(extra.drop(columns="held"), on=["budget", "policy"]).merge(
        worst, on=["budget", "policy"], how="left")
    table["accuracy_loss"] = table["full"] - table["contains"]
    rep = replay.groupby(["budget", "policy"]).mean(numeric_only=True).reset_index()
    return table.merge(rep.drop(columns="seed"), on=["budget", "policy"], how="left"), rep


def _replay_correlations(table, budgets):
    """Spearman ρ of each replay metric with the accuracy loss: pooled over budgets (the budget
    alone beside them), and within each budget."""
    budgeted = table[table["budget"] != SELF]
    points = pd.concat([budgeted, table[table["budget"] == SELF]])
    rho_pooled = {m: spearman(points[m].tolist(), points["accuracy_loss"].tolist())
                  for m, _ in REPLAY_METRICS}
    rho_pooled["budget"] = spearman((-budgeted["budget"].astype(float)).tolist(),
                                    budgeted["accuracy_loss"].tolist())
    rho_within = {(m, b): spearman(budgeted[budgeted["budget"] == b][m].tolist(),
                                   budgeted[budgeted["budget"] == b]["accuracy_loss"].tolist())
                  for m, _ in REPLAY_METRICS for b in budgets}
    return rho_pooled, rho_within


def _write_tables(out, table, comps, live, replay, replay_images):
    """The report's CSV tables: per policy, per seed, the comparisons, and per image."""
    os.makedirs(out, exist_ok=True)
    write_csv(table, os.path.join(out, "vlm_eval.csv"))
    by_seed = per_seed(live, "contains").merge(per_seed(live, "exact"), on=["seed", "budget", "policy"])
    by_seed = by_seed.merge(per_seed(live.assign(full=live["full_contains"]), "full"),
                            on=["seed", "budget", "policy"])
    by_seed = by_seed.merge(replay.drop(columns=["replay_held"]), on=["seed", "budget", "policy"],
                            how="left")
    write_csv(by_seed, os.path.join(out, "vlm_eval_by_seed.csv"))
    write_csv(comps, os.path.join(out, "vlm_comparisons.csv"))
    by_image = live.groupby(["seed", "budget", "policy", "sample"], as_index=False)[
        ["contains", "exact", "full_contains", "dnll", "kv_fraction", "mean_kl"]].mean()
    by_image = by_image.merge(replay_images, on=["seed", "budget", "policy", "sample"], how="left")
    write_csv(by_image, os.path.join(out, "vlm_eval_by_image.csv"))


def main(argv):
    a = _parse(argv)
    tables, builds, settings = inputs(a)
    budgets, seeds = settings["budgets"], settings["seeds"]
    a.unit, a.order = settings["unit"], settings["order"]
    kept = os.path.join(a.out, "results")
    if not (a.from_results and len(a.from_results) == 1 and os.path.exists(kept) and
            os.path.samefile(a.from_results[0], kept)):
        save_results(a.out, tables, builds, settings)
    live, replay, replay_images, controls = tables
    live, rename = merge_identical(live)
    replay, replay_images = renamed(replay, rename), renamed(replay_images, rename)
    table, rep = _policy_table(live, replay)
    comps = comparisons(live, budgets)
    w = stability(live, budgets)
    first = free_structure(live)
    rho_pooled, rho_within = _replay_correlations(table, budgets)
    _write_tables(a.out, table, comps, live, replay, replay_images)
    write_report(os.path.join(a.out, "vlm_eval.md"), table, comps, w, controls, builds, budgets, seeds, (first[0], first[1]), first[2], rho_pooled,
                 rho_within, live["sample"].nunique(),
                 live.groupby("policy")["label"].nunique().to_dict(),
                 rep[rep["policy"] == "oracle"].sort_values("budget", key=lambda b: b.astype(float)),
                 a.unit, a.order, full_cache_reading(live, a.chance))
    with open(os.path.join(a.out, "vlm_builds.md"), "w", encoding="utf-8") as f:
        f.write(builds_report(builds, a.unit))
    if not a.no_figures:
        figures(table, live, budgets, a.out, a.unit)
    print(open(os.path.join(a.out, "vlm_eval.md"), encoding="utf-8").read())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
