#!/usr/bin/env python3
"""A prediction card: how well does replay predict what eviction does to a real model, tested out
of sample? From one row per (seed, budget, policy, image) with a live outcome and replay's
metrics on the same image (experiments/vlm_eval.sh writes vlm_eval_by_image.csv;
experiments/stories_eval.sh writes by_image.csv), the card gives:

- the rank correlation (Spearman, Kendall) of a replay metric with the live loss within each
  budget, with 95% intervals that resample both the images and the policy families (two-level
  percentile bootstrap; policy means equal to 12 decimals count as ties, so accuracies equal as
  fractions tie whatever order their seeds were summed in), and pooled over budgets beside what
  the budget alone and the memory held alone give;
- a monotone map from the replay metric to the live outcome (isotonic regression, pool adjacent
  violators, one point per configuration = seed, budget and policy), and its mean absolute error
  out of sample: with each policy family (a mechanism: family_of) left out of the fit, each
  budget, each seed, and on the samples (images, stories) not in the fit (two halves, each
  predicted from a fit on the other); beside the same for a map from the memory held alone (the
  budget-only guess), and the skill 1 − MAE / MAE(memory) with a 95% interval over the groups
  left out;
- per budget, the top-1 regret (the live outcome of replay's pick minus the live best) and the
  top-3 overlap;
- the chain replay metric → teacher-forced KL (mean_kl) → live loss, so that it is plain where
  prediction is lost, and the points missed most.

    prediction_card.py --by-image FILE.csv --outcome contains --name "assembled VLM" --out DIR
        [--metric replay_output_rel_error] [--targets 0.05,0.8,0.02]

`--outcome contains` (the answer is right: higher is better; the loss is the full cache's minus
the policy's) or `dnll` (the reference's ΔNLL: higher is worse, the loss itself). Writes
DIR/card.md, DIR/card.json (the map's knots, fitted on every point, and the 95% range of its
family-left-out residuals: what `kvsim replay --card` reads) and DIR/card.png / .pdf.

With `--chance P` (the accuracy of a guess, e.g. 0.1 for one of ten classes) and the `contains`
outcome, a full cache whose accuracy is not above P (its 95% interval over samples reaches P)
means the model does not read the images: the card then says that no prediction can be tested
and prints no correlations, errors or targets (card.json: "at_chance").
"""
import argparse
import json
import os
import sys

import numpy as np
import pandas as pd

from .figure_style import new_figure, policy_style, save
from .replay_vs_live import spearman

RESAMPLES = 1000
TIE_DECIMALS = 12  # rank statistics: means equal to this many decimals tie


def full_cache_reading(rows, chance):
    """The full cache's accuracy (`full_contains`, each sample's averaged over seeds), its 95%
    interval over samples (kvsim's percentile bootstrap) and whether it is above `chance`: at or
    below it the model does not read the images, and no policy's accuracy can show what it kept.
    A dict: accuracy, ci_low, ci_high, n, chance, above_chance."""
    from .. import summarize

    full = rows.groupby(["seed", "sample"], as_index=False)["full_contains"].first()
    per = full.groupby("sample", as_index=False)["full_contains"].mean()
    s = summarize({"policy": ["full"] * len(per), "sample": per["sample"],
                   "full_contains": per["full_contains"]}, "full_contains").iloc[0]
    low = float(s["ci_low"]) if len(per) > 1 else float(s["mean"])
    return {"accuracy": float(s["mean"]), "ci_low": low, "ci_high": float(s["ci_high"]),
            "n": int(s["n"]), "chance": chance, "above_chance": low > chance}


def at_chance_text(reading, unit):
    """The sentence a report prints in place of its tests when the full cache is at chance."""
    return (f"**No comparison can be made.** The full cache answers {reading['accuracy']:.3f} "
            f"(95% interval {reading['ci_low']:.3f} to {reading['ci_high']:.3f} over "
            f"{reading['n']} {unit}s), not above chance ({reading['chance']:.3f}): the model does "
            "not read the images, so no policy's accuracy can show what it kept. No tests, ranks "
            "or targets are given.\n")


def fail(message):
    sys.exit(f"prediction_card: {message}")


# Policies that select by one mechanism, whatever they are called: PyramidKV and AdaKV are
# SnapKV's observation-window vote with a per-layer or head-adaptive budget (they answer alike at
# most budgets), so a fit that leaves SnapKV out must leave them out too, or a twin stays in it.
MECHANISM = {"pyramidkv": "snapkv", "adakv": "snapkv"}


def family_of(policy):
    """The policy family left out of a fit together: a preset goes with its policy
    (snapkv:kvpress and lookm:released with snapkv and lookm), a seed run with its policy
    (h2o@seed1), and the policies of one mechanism together (MECHANISM: pyramidkv and adakv with
    snapkv); a merged row ('a, b': identical answers) is the family of its members, joined when
    they differ."""
    members = {m.split(":")[0].split("@")[0] for m in policy.split(", ")}
    return ", ".join(sorted({MECHANISM.get(m, m) for m in members}))


def isotonic(x, y, increasing=True):
    """Pool adjacent violators: the monotone step function closest to y in least squares, at the
    sorted distinct x (ties averaged first). Returns (knots_x, knots_y)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    order = np.argsort(x, kind="stable")
    xs, ys = x[order], y[order]
    ux, start = np.unique(xs, return_index=True)
    sums = np.add.reduceat(ys, start)
    counts = np.diff(np.append(start, len(xs))).astype(float)
    sign = 1.0 if increasing else -1.0
    blocks = []  # [sum, count, first index]
    for i in range(len(ux)):
        blocks.append([sign * sums[i], counts[i], i])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, c, _ = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
    fitted = np.empty(len(ux))
    for j, (s, c, first) in enumerate(blocks):
        last = blocks[j + 1][2] if j + 1 < len(blocks) else len(ux)
        fitted[first:last] = sign * s / c
    return ux, fitted


def predict(knots, x):
    """The map between knots linearly, constant beyond the ends."""
    kx, ky = knots
    return np.interp(np.asarray(x, float), kx, ky)


def kendall(x, y):
    """Kendall's τ-b: over the pairs i < j, (concordant − discordant) / √((n₀ − tx)(n₀ − ty))
    written as √((c + d + tx)(c + d + ty)), tx (ty) the pairs tied in x only (y only); pairs tied
    in both count nowhere."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    n = len(x)
    if n < 3:
        return float("nan")
    upper = np.triu_indices(n, 1)
    a = np.sign(x[:, None] - x[None, :])[upper]
    b = np.sign(y[:, None] - y[None, :])[upper]
    concordant = int(((a != 0) & (a == b)).sum())
    discordant = int(((a != 0) & (b != 0) & (a != b)).sum())
    tx = int(((a == 0) & (b != 0)).sum())
    ty = int(((a != 0) & (b == 0)).sum())
    denominator = np.sqrt((concordant + discordant + tx) * (concordant + discordant + ty))
    return (concordant - discordant) / denominator if denominator else float("nan")


def configurations(rows, metric, outcome, images=None):
    """One point per (seed, budget, policy): means over the images (all, or `images`)."""
    if images is not None:
        rows = rows[rows["sample"].isin(images)]
    cols = {metric: "x", outcome: "y", "kv_fraction": "memory", "full": "full"}
    if "mean_kl" in rows:
        cols["mean_kl"] = "kl"
    g = rows.groupby(["seed", "budget", "policy"], as_index=False)[list(cols)].mean()
    g = g.rename(columns=cols)
    g["family"] = g["policy"].map(family_of)
    return g


def loss_of(points, higher_is_better):
    return points["full"] - points["y"] if higher_is_better else points["y"]


def left_out_error(points, key, feature, increasing):
    """Mean absolute error of the outcome predicted for each group of `key` by the map fitted on
    every other point; the residuals (predicted − measured) per point."""
    residual = pd.Series(np.nan, index=points.index)
    for _, held in points.groupby(key):
        rest = points.drop(held.index)
        if rest.empty:
            continue
        knots = isotonic(rest[feature], rest["y"], increasing)
        residual[held.index] = predict(knots, held[feature]) - held["y"]
    return float(residual.abs().mean()), residual


def skill_interval(groups, residual, base_residual, rng, resamples):
    """95% percentile interval of the skill 1 − Σ|residual| / Σ|base residual| when the groups
    left out (policy families, budgets or seeds) are drawn with replacement: the skill's
    uncertainty over which families (budgets, seeds) there happened to be."""
    names = groups.unique()
    err = residual.abs().groupby(groups).sum().reindex(names).to_numpy()
    base = base_residual.abs().groupby(groups).sum().reindex(names).to_numpy()
    drawn = rng.choice(len(names), (resamples, len(names)))
    denominator = base[drawn].sum(axis=1)
    kept = denominator > 0
    if not kept.any():
        return [float("nan"), float("nan")]
    skills = 1 - err[drawn].sum(axis=1)[kept] / denominator[kept]
    return [float(np.percentile(skills, 2.5)), float(np.percentile(skills, 97.5))]


def split_halves(samples):
    """The images in two fixed halves: alternate in sorted order."""
    ordered = sorted(samples)
    return set(ordered[0::2]), set(ordered[1::2])


def out_of_image_error(rows, metric, outcome, feature, increasing):
    """Fit on one half of the images, predict the other half's configuration outcomes, both
    ways: the mean absolute error."""
    a, b = split_halves(rows["sample"].unique())
    errors = []
    for fit, test in ((a, b), (b, a)):
        pa = configurations(rows, metric, outcome, fit)
        pb = configurations(rows, metric, outcome, test)
        merged = pa.merge(pb, on=["seed", "budget", "policy"], suffixes=("_fit", "_test"))
        knots = isotonic(merged[f"{feature}_fit"], merged["y_fit"], increasing)
        errors.append(np.abs(predict(knots, merged[f"{feature}_test"]) - merged["y_test"]))
    return float(np.mean(np.concatenate(errors)))


class _PolicyCube:
    """One budget's rows as arrays [policy, seed, image] of the metric, the outcome and the full
    cache's outcome, with the number of rows in each cell (0 where a policy has no row): a
    resample's per-configuration means are sums weighted by how often each image was drawn."""

    def __init__(self, rows, metric, outcome, images):
        self.policies = np.array(sorted(rows["policy"].unique()))
        seeds = np.array(sorted(rows["seed"].unique()))
        shape = (len(self.policies), len(seeds), len(images))
        cell = (np.searchsorted(self.policies, rows["policy"].to_numpy()),
                np.searchsorted(seeds, rows["seed"].to_numpy()),
                pd.Index(images).get_indexer(rows["sample"]))
        self.rows = np.zeros(shape)
        np.add.at(self.rows, cell, 1.0)
        self.sums, self.counts = [], []  # per column: the sum and the number of values (not NaN)
        for column in (metric, outcome, "full"):
            values = rows[column].to_numpy(float)
            total, count = np.zeros(shape), np.zeros(shape)
            np.add.at(total, cell, np.nan_to_num(values))
            np.add.at(count, cell, (~np.isnan(values)).astype(float))
            self.sums.append(total)
            self.counts.append(count)

    def means(self, picked, weights):
        """x, y and full per picked policy (indices into self.policies; repeats count again), as
        pandas' means of the resampled rows give them: each seed's mean over the images drawn
        (`weights`: how often each was drawn; NaN values skipped), then the mean over the seeds
        with a value; policies with no row drawn are dropped."""
        keep = (self.rows[picked] * weights).sum(axis=-1).sum(axis=1) > 0
        out = []
        for total, count in zip(self.sums, self.counts):
            n = (count[picked] * weights).sum(axis=-1)
            with np.errstate(invalid="ignore", divide="ignore"):
                per_seed = np.where(n > 0, (total[picked] * weights).sum(axis=-1) / n, 0.0)
                seeds = (n > 0).sum(axis=1)
                out.append((per_seed.sum(axis=1) / np.where(seeds > 0, seeds, np.nan))[keep])
        return out


def rank_stats(x, y, full, higher_is_better):
    """Spearman and Kendall of the metric with the loss over the policies. Means equal as
    rationals (accuracies k/n summed over seeds in another order) can differ in the last bit:
    both sides are compared at TIE_DECIMALS decimals, so they tie whatever the order of summing."""
    x = np.round(np.asarray(x, float), TIE_DECIMALS)
    loss = np.round(loss_of({"full": np.asarray(full, float), "y": np.asarray(y, float)},
                            higher_is_better), TIE_DECIMALS)
    return spearman(list(x), list(loss)), kendall(x, loss)


def rank_interval(rows, metric, outcome, budget, higher_is_better, rng, resamples):
    """Within one budget: Spearman and Kendall of the metric with the loss over the policies
    (seeds averaged), and 95% intervals resampling images and policy families together (a family
    drawn twice counts twice)."""
    rows = rows[rows["budget"] == budget]

    p = configurations(rows, metric, outcome).groupby("policy", as_index=False).mean(
        numeric_only=True)
    rho, tau = rank_stats(p["x"].to_numpy(), p["y"].to_numpy(), p["full"].to_numpy(),
                          higher_is_better)
    images = rows["sample"].unique()
    families = rows["policy"].map(family_of).unique()
    cube = _PolicyCube(rows, metric, outcome, images)
    cube_families = np.array([family_of(q) for q in cube.policies])
    members = {f: np.flatnonzero(cube_families == f) for f in families}
    draws = []
    for _ in range(resamples):
        # Drawn as rng.choice(images, n) draws them (the same stream), by index.
        pick_images = rng.choice(len(images), len(images))
        pick_families = rng.choice(families, len(families))
        weights = np.bincount(pick_images, minlength=len(images)).astype(float)
        picked = np.concatenate([members[f] for f in pick_families])
        draws.append(rank_stats(*cube.means(picked, weights), higher_is_better))
    d = np.array(draws, dtype=float)
    with np.errstate(all="ignore"):
        lo = np.nanpercentile(d, 2.5, axis=0)
        hi = np.nanpercentile(d, 97.5, axis=0)
    return rho, (lo[0], hi[0]), tau, (lo[1], hi[1])


def top_choices(points, higher_is_better):
    """Per budget: replay's pick (the smallest metric) and its live regret, and the top-3
    overlap, on the policies' outcomes averaged over seeds."""
    out = {}
    budgeted = points[points["budget"] != "self"]
    for budget, g in budgeted.groupby("budget"):
        p = g.groupby("policy").mean(numeric_only=True)
        good = p["y"] if higher_is_better else -p["y"]
        pick = p["x"].idxmin()
        best = good.idxmax()
        top_replay = set(p["x"].nsmallest(3).index)
        top_live = set(good.nlargest(3).index)
        out[budget] = {"pick": pick, "best": best,
                       "regret": float(abs(good[best] - good[pick])),
                       "top3_overlap": len(top_replay & top_live) / 3}
    return out


def _left_out_errors(points, rows, metric, outcome, increasing, rng, resamples):
    """The map's errors on what its fit left out (a policy family, a budget, a seed, the samples),
    against the memory held alone; and the family-left-out residuals."""
    errors = {}
    residuals = None
    for key, label in (("family", "policy family"), ("budget", "budget"), ("seed", "seed")):
        if points[key].nunique() < 2:
            continue
        mae, res = left_out_error(points, key, "x", increasing)
        base, base_res = left_out_error(points, key, "memory", not increasing)
        errors[label] = {"mae": mae, "mae_memory_only": base,
                         "skill": 1 - mae / base if base else float("nan"),
                         "skill_ci": skill_interval(points[key], res, base_res, rng, resamples)}
        if key == "family":
            residuals = res
    mae = out_of_image_error(rows, metric, outcome, "x", increasing)
    base = out_of_image_error(rows, metric, outcome, "memory", not increasing)
    errors["samples not in the fit"] = {"mae": mae, "mae_memory_only": base,
                                       "skill": 1 - mae / base if base else float("nan")}
    return errors, residuals


def _kl_chain(card, points, budgeted):
    """metric → KL → loss: where the chain from replay to the live outcome holds or breaks."""
    card["chain"] = {"metric_vs_kl": spearman(points["x"].tolist(), points["kl"].tolist()),
                     "kl_vs_loss": spearman(points["kl"].tolist(), points["loss"].tolist()),
                     "metric_vs_loss": card["pooled"]["spearman"]}
    card["chain_within_budget"] = {
        b: {"metric_vs_kl": spearman(g["x"].tolist(), g["kl"].tolist()),
            "kl_vs_loss": spearman(g["kl"].tolist(), g["loss"].tolist())}
        for b, g in budgeted.groupby("budget")}


def _fitted_map(card, points, residuals, increasing):
    """The isotonic map, its family-left-out residuals' 95% range, and the points missed most."""
    knots = isotonic(points["x"], points["y"], increasing)
    card["map"] = {"knots_x": knots[0].tolist(), "knots_y": knots[1].tolist()}
    if residuals is not None and residuals.notna().any():
        r = residuals.dropna()
        card["map"]["residual_95"] = [float(np.percentile(r, 2.5)), float(np.percentile(r, 97.5))]
        worst = r.abs().sort_values(ascending=False).head(5).index
        card["missed_most"] = [{"seed": int(points.loc[i, "seed"]),
                                "budget": points.loc[i, "budget"],
                                "policy": points.loc[i, "policy"],
                                "measured": float(points.loc[i, "y"]),
                                "predicted": float(points.loc[i, "y"] + r[i])} for i in worst]


def make_card(rows, metric, outcome, name, targets, seed=0, resamples=RESAMPLES):
    higher = outcome == "contains"
    increasing = not higher  # the outcome rises with the error when it is a loss (ΔNLL)
    rng = np.random.default_rng(seed)
    points = configurations(rows, metric, outcome)
    points["loss"] = loss_of(points, higher)
    budgets = sorted(points.loc[points["budget"] != "self", "budget"].unique(), key=float)
    card = {"model": name, "metric": metric, "outcome": outcome,
            "configurations": int(len(points)), "images": int(rows["sample"].nunique()),
            "seeds": int(points["seed"].nunique())}
    card["within_budget"] = {}
    for b in budgets:
        rho, rci, tau, tci = rank_interval(rows, metric, outcome, b, higher, rng, resamples)
        card["within_budget"][b] = {"spearman": rho, "spearman_ci": list(rci),
                                    "kendall": tau, "kendall_ci": list(tci)}
    budgeted = points[points["budget"] != "self"]
    card["pooled"] = {
        "spearman": spearman(points["x"].tolist(), points["loss"].tolist()),
        "budget_alone": spearman((-budgeted["budget"].astype(float)).tolist(),
                                 budgeted["loss"].tolist()),
        "memory_alone": spearman((-points["memory"]).tolist(), points["loss"].tolist())}
    card["left_out"], residuals = _left_out_errors(points, rows, metric, outcome, increasing, rng,
                                                   resamples)
    card["top"] = top_choices(points, higher)
    if "kl" in points:
        _kl_chain(card, points, budgeted)
    _fitted_map(card, points, residuals, increasing)
    if targets:
        card["targets"] = check_targets(card, targets)
    return card, points


SKILL_TARGET = 0.5  # the scale-free target when --targets gives three values


def check_targets(card, targets):
    """The four targets: family-left-out error (absolute), within-budget Spearman at every
    budget, top-1 regret at every budget, and family-left-out skill over the memory-only map
    (scale-free: met when its 95% interval's lower end reaches the target)."""
    mae_max, rho_min, regret_max, skill_min = (list(targets) + [SKILL_TARGET])[:4]
    left = card["left_out"].get("policy family", {})
    family = left.get("mae", float("nan"))
    skill_low = left.get("skill_ci", [float("nan")])[0]
    rhos = {b: v["spearman"] for b, v in card["within_budget"].items()}
    regrets = {b: v["regret"] for b, v in card["top"].items()}
    return {
        "family_left_out_mae": {"target": mae_max, "value": family, "met": bool(family <= mae_max)},
        "within_budget_spearman": {"target": rho_min, "values": rhos,
                                   "met": bool(all(v >= rho_min for v in rhos.values()))},
        "top1_regret": {"target": regret_max, "values": regrets,
                        "met": bool(all(v <= regret_max for v in regrets.values()))},
        "family_left_out_skill": {"target": skill_min, "value": left.get("skill", float("nan")),
                                  "ci": left.get("skill_ci"), "met": bool(skill_low >= skill_min)}}


def fmt(x, spec=".3f"):
    return "–" if x is None or (isinstance(x, float) and np.isnan(x)) else format(x, spec)


def budget_text(b):
    return "its own size" if b == "self" else f"{b}%"


def _write_within_budget(f, card):
    f.write("Within each budget, rank correlation with the live loss over the policies "
            "(95% intervals resample the samples and the policy families):\n\n| budget | Spearman | "
            "Kendall | top-1 regret (pick → best) | top-3 overlap |\n|---|---|---|---|---|\n")
    for b, v in card["within_budget"].items():
        t = card["top"].get(b, {})
        f.write(f"| {b}% | {fmt(v['spearman'], '+.2f')} [{fmt(v['spearman_ci'][0], '+.2f')}, "
                f"{fmt(v['spearman_ci'][1], '+.2f')}] | {fmt(v['kendall'], '+.2f')} "
                f"[{fmt(v['kendall_ci'][0], '+.2f')}, {fmt(v['kendall_ci'][1], '+.2f')}] | "
                f"{fmt(t.get('regret', float('nan')))} (`{t.get('pick')}` → "
                f"`{t.get('best')}`) | {fmt(t.get('top3_overlap', float('nan')), '.2f')} |\n")


def _write_pooled_and_left_out(f, card, outcome):
    p = card["pooled"]
    f.write(f"\nPooled over budgets: Spearman {fmt(p['spearman'], '+.2f')}, beside "
            f"{fmt(p['budget_alone'], '+.2f')} for the budget alone and "
            f"{fmt(p['memory_alone'], '+.2f')} for the memory held alone.\n\n")
    f.write(f"Out of sample: mean absolute error of the predicted {outcome} (an isotonic map "
            "from the replay metric, fitted without what is predicted), beside the same map "
            "from the memory held alone; skill = 1 − error / memory alone, with a 95% "
            "interval over the groups left out drawn with replacement:\n\n| left out | "
            "error | memory alone | skill |\n|---|---|---|---|\n")
    for k, v in card["left_out"].items():
        ci = v.get("skill_ci")
        interval = (f" [{fmt(ci[0], '+.2f')}, {fmt(ci[1], '+.2f')}]"
                    if ci and not np.isnan(ci[0]) else "")
        f.write(f"| {k} | {fmt(v['mae'])} | {fmt(v['mae_memory_only'])} | "
                f"{fmt(v['skill'], '+.2f')}{interval} |\n")


def _write_chain_and_misses(f, card):
    if "chain" in card:
        c = card["chain"]
        f.write("\nThe chain, pooled (Spearman): replay metric → teacher-forced KL "
                f"{fmt(c['metric_vs_kl'], '+.2f')}, KL → live loss "
                f"{fmt(c['kl_vs_loss'], '+.2f')}, replay metric → live loss "
                f"{fmt(c['metric_vs_loss'], '+.2f')}; within budgets (metric → KL / KL → "
                "loss): " +
                ", ".join(f"{b}%: {fmt(v['metric_vs_kl'], '+.2f')} / "
                          f"{fmt(v['kl_vs_loss'], '+.2f')}"
                          for b, v in card["chain_within_budget"].items()) + ".\n")
    if card.get("missed_most"):
        seed = (lambda m: f" (seed {m['seed']})") if card["seeds"] > 1 else (lambda m: "")
        f.write("\nMissed most (family left out): " + "; ".join(
            f"`{m['policy']}` at {budget_text(m['budget'])}{seed(m)}: predicted "
            f"{m['predicted']:.3f}, measured {m['measured']:.3f}"
            for m in card["missed_most"]) + ".\n")


def _write_targets(f, card):
    if card.get("targets"):
        t = card["targets"]
        family = t["family_left_out_mae"]
        f.write(f"\nTargets: family-left-out error ≤ {family['target']}: "
                f"{fmt(family['value'])} ({'met' if family['met'] else 'not met'}); "
                f"within-budget Spearman ≥ {t['within_budget_spearman']['target']} at every "
                f"budget: {'met' if t['within_budget_spearman']['met'] else 'not met'}; "
                f"top-1 regret ≤ {t['top1_regret']['target']}: "
                f"{'met' if t['top1_regret']['met'] else 'not met'}; family-left-out skill "
                f"≥ {t['family_left_out_skill']['target']} (scale-free; met when its "
                f"interval's lower end reaches it): "
                f"{fmt(t['family_left_out_skill']['value'], '+.2f')} "
                f"({'met' if t['family_left_out_skill']['met'] else 'not met'}).\n")


def write_markdown(card, path):
    outcome = "accuracy" if card["outcome"] == "contains" else "ΔNLL"
    with open(path, "w", encoding="utf-8") as f:
        seeds = f"{card['seeds']} seeds × " if card["seeds"] > 1 else ""
        f.write(f"**Prediction card: {card['model']}** — replay's `{card['metric']}` against the "
                f"live {outcome} ({card['configurations']} configurations: {seeds}budgets × "
                f"policies; {card['images']} samples).\n\n")
        _write_within_budget(f, card)
        _write_pooled_and_left_out(f, card, outcome)
        _write_chain_and_misses(f, card)
        _write_targets(f, card)


def figure(card, points, out):
    written = []
    fig, ax = new_figure(figsize=(7, 4.5))
    for policy, g in points.groupby("policy"):
        style = policy_style(policy)
        ax.scatter(g["x"], g["y"], s=12, color=style["color"], marker=style["marker"],
                   label=policy)
    if "map" in card:  # none when the full cache is at chance
        kx, ky = card["map"]["knots_x"], card["map"]["knots_y"]
        ax.plot(kx, ky, color="black", lw=1.2, label="isotonic map (all points)")
        if "residual_95" in card["map"]:
            lo, hi = card["map"]["residual_95"]
            low, high = np.array(ky) - hi, np.array(ky) - lo
            if card["outcome"] == "contains":  # an accuracy lies in [0, 1]
                low, high = np.clip(low, 0, 1), np.clip(high, 0, 1)
            ax.fill_between(kx, low, high, color="grey", alpha=0.2,
                            label="95% of family-left-out errors")
    outcome = "accuracy" if card["outcome"] == "contains" else "ΔNLL (nats per token)"
    metric = {"replay_output_rel_error": "replay output error ‖o − ô‖/‖o‖",
              "replay_mass_recall": "replay mass recall"}.get(card["metric"], card["metric"])
    note = ("the full cache is at chance: no card" if "at_chance" in card
            else "one point per seed, budget and policy")
    ax.set(title=f"{card['model']}: live {outcome} against replay\n({note})",
           xlabel=f"{metric} (mean over samples)", ylabel=f"live {outcome}")
    ax.legend(fontsize=5, loc="center left", bbox_to_anchor=(1.01, 0.5))
    save(fig, out, "card", written)
    return written


def write_at_chance(rows, reading, metric, name, out):
    """card.md and card.json of a model that does not read its images: no card; the figure
    shows the points alone."""
    card = {"model": name, "metric": metric, "outcome": "contains", "at_chance": reading}
    with open(os.path.join(out, "card.json"), "w", encoding="utf-8") as f:
        json.dump(card, f, indent=1)
        f.write("\n")
    with open(os.path.join(out, "card.md"), "w", encoding="utf-8") as f:
        f.write(f"**Prediction card: {name}** — none.\n\n" + at_chance_text(reading, "sample"))
    figure(card, configurations(rows, metric, "contains"), out)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--by-image", required=True, help="one row per seed, budget, policy, image")
    ap.add_argument("--outcome", choices=("contains", "dnll"), required=True)
    ap.add_argument("--metric", default="replay_output_rel_error")
    ap.add_argument("--name", required=True, help="the model, for the card's title")
    ap.add_argument("--targets", help="family-left-out error, within-budget Spearman, top-1 "
                                      "regret and, optionally, family-left-out skill (e.g. "
                                      "0.05,0.8,0.02,0.5; the skill's default 0.5)")
    ap.add_argument("--chance", type=float,
                    help="the accuracy of a guess: a full cache not above it gives no card")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if not os.path.exists(a.by_image):
        fail(f"{a.by_image}: no such file")
    rows = pd.read_csv(a.by_image, dtype={"sample": str, "budget": str})
    for column in ("budget", "policy", "sample", a.outcome, a.metric, "kv_fraction"):
        if column not in rows:
            fail(f"{a.by_image}: no column '{column}'")
    if "seed" not in rows:
        rows["seed"] = 0
    rows["full"] = rows["full_contains"] if a.outcome == "contains" else 0.0
    targets = [float(t) for t in a.targets.split(",")] if a.targets else None
    if targets is not None and len(targets) not in (3, 4):
        fail(f"--targets {a.targets}: give three or four numbers (error, Spearman, regret[, "
             "skill])")
    os.makedirs(a.out, exist_ok=True)
    reading = (full_cache_reading(rows, a.chance)
               if a.chance is not None and a.outcome == "contains" else None)
    if reading and not reading["above_chance"]:
        write_at_chance(rows, reading, a.metric, a.name, a.out)
        print(open(os.path.join(a.out, "card.md"), encoding="utf-8").read())
        return 0
    card, points = make_card(rows, a.metric, a.outcome, a.name, targets)
    with open(os.path.join(a.out, "card.json"), "w", encoding="utf-8") as f:
        json.dump(card, f, indent=1, default=float)
        f.write("\n")
    write_markdown(card, os.path.join(a.out, "card.md"))
    figure(card, points, a.out)
    print(open(os.path.join(a.out, "card.md"), encoding="utf-8").read())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
