"""kvsim's figures as matplotlib Figures, for notebooks: the figures `kvsim figures` writes (same
code, kvsim.report.figures and kvsim.report.sweep_report), from results in memory or on disk, plus
a look at one head's attention. Nothing is written; nothing goes through pyplot's global state.

    import kvsim, kvsim.plot
    res = kvsim.replay("trace.h5", ["h2o", "snapkv"], budget="20%")
    kvsim.plot.recall_by_layer(res)                                   # a Figure
    kvsim.plot.budget_curves({b: kvsim.replay("trace.h5", ["h2o"], budget=b)
                              for b in ("10%", "20%", "40%")})
"""
import importlib
import math
import sys

try:
    import numpy as np
    importlib.import_module("matplotlib")
except ImportError as _missing:
    raise ImportError(f"kvsim.plot needs numpy and matplotlib; this interpreter "
                      f"({sys.executable}) lacks {_missing.name}: use Debian's /usr/bin/python3 "
                      f"(./install-deps.sh installs python3-numpy and python3-matplotlib), or "
                      f"install it into this one") from None

from .report import figures as _figures
from .report import sweep_report as _sweep_report

__all__ = ["recall_by_layer", "budget_curves", "sweep", "stats", "live", "attention",
           "modality_shares", "policy_style"]

policy_style = _figures.policy_style


def _show_figures_in_notebooks():
    """A Figure made outside pyplot has no display of its own: in IPython (Jupyter), register
    PNG output for Figures, so that a cell ending in kvsim.plot.something(...) shows it."""
    import sys

    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython else None
    if shell is None or not hasattr(shell, "display_formatter"):
        return
    from IPython.core.pylabtools import print_figure
    from matplotlib.figure import Figure

    shell.display_formatter.formatters["image/png"].for_type(
        Figure, lambda fig: print_figure(fig, "png", bbox_inches="tight"))


_show_figures_in_notebooks()


def _columns(results):
    """A replay's rows as {column: sequence}: kvsim.replay's dict, a pandas DataFrame of it, or
    a `kvsim replay --out` CSV path (read whole; use the path form of recall_by_layer for large
    files)."""
    if hasattr(results, "to_dict") and hasattr(results, "columns"):  # pandas.DataFrame
        return {c: results[c].to_numpy() for c in results.columns}
    if isinstance(results, dict):
        return results
    raise TypeError(f"expected kvsim.replay's result (a dict of columns), a pandas DataFrame of it "
                    f"or a replay CSV path, not {type(results).__name__}")


def _means(results, params=None):
    if isinstance(results, str):
        return _figures.ReplayMeans(path=results, params=params)
    cols = _columns(results)
    missing = [c for c in _figures.ReplayMeans.COLUMNS if c not in cols]
    if missing:
        raise ValueError("replay results lack the column(s) " + ", ".join(missing))
    rows = zip(*(cols[c] for c in _figures.ReplayMeans.COLUMNS))
    return _figures.ReplayMeans(rows=rows, params=params)


def recall_by_layer(results, title="replay"):
    """Mean attention mass recall by layer, one line per policy label (and the top-10% hit rate
    beside it when the replay had diagnostics=True)."""
    return _figures.recall_by_layer_figure(_means(results), title)


def budget_curves(runs):
    """Output error and mass recall against the KV entries each policy actually held while
    decoding, one curve per policy over the budgets it ran at.

    runs: {budget: replay results} (kvsim.replay's dicts or DataFrames, or replay CSV paths, one
    per budget as given, e.g. "10%"), or a sweep's results (kvsim.sweep's dict, a DataFrame of
    it, or the path of its results.csv), whose budget axes make the curves."""
    if _is_sweep(runs):
        figs = sweep(runs)
        if "held_vs_error" not in figs:
            raise ValueError("the sweep has no policy at two budgets or more")
        return figs["held_vs_error"]
    if not isinstance(runs, dict) or len(runs) < 2:
        raise ValueError("budget_curves needs {budget: results} with two budgets or more, or "
                         "sweep results")
    means = []
    for budget, results in runs.items():
        m = _means(results)
        m.params = {label: (label.split("@")[0], {"budget": str(budget)} | (
            {"seed": label.split("@seed")[1]} if "@seed" in label else {})) for label in m.labels}
        means.append((f"budget {budget}", m))
    figs = {}
    _figures.replay_figures([], figs, [], means=means)
    if "budget_vs_error" not in figs:
        raise ValueError("no policy label appears at two budgets or more")
    return figs["budget_vs_error"]


def _is_sweep(results):
    if isinstance(results, str):
        with open(results, newline="") as f:
            return f.readline().startswith("trace,trace_hash,")
    return (hasattr(results, "columns") and "trace_hash" in results.columns) or (
        isinstance(results, dict) and "trace_hash" in results)


def _sweep_rows(results):
    if isinstance(results, str):
        return _sweep_report.read_results(results)
    cols = _columns(results)
    names = list(cols)
    n = len(cols[names[0]]) if names else 0
    rows = []
    for i in range(n):
        row = {}
        for c in names:
            v = cols[c][i]
            row[c] = "" if isinstance(v, float) and math.isnan(v) else v
        rows.append(row)
    return rows


def sweep(results):
    """The sweep report's figures by name: '<policy>_<key>' (each swept parameter against recall
    and error), 'held_vs_error' (policies swept over budgets, against the entries held) and
    'pareto' (KV memory per step against recall and error). results: kvsim.sweep's dict, a
    DataFrame of it, or the path of a sweep's results.csv."""
    figs = {}
    rows = _sweep_rows(results)
    if not rows:
        raise ValueError("the sweep results have no rows")
    _sweep_report.figures(rows, figs)
    return figs


def stats(path):
    """The figures of a `kvsim stats --out FILE.h5` file by name:
    '<file>_<sample>_sparsity', '_cumulative_variance', '_ppci', '_layer_similarity',
    '_entropy', '_key_similarity', '_head_preference', '_vision_share'."""
    figs = {}
    _figures.stats_figures(path, figs, [])
    return figs


def live(steps=None, summary=None, replay=None):
    """The figures of `kvsim live evaluate` result CSVs by name ('live_kl_by_step',
    'live_summary', 'live_perplexity' with reference answers, 'live_accuracy' (answer accuracy
    against budget and against memory held; give one summary per budget) when the summaries carry
    answer scores, and 'replay_vs_live' with a replay CSV of the same policies)."""
    def paths(p):
        return [] if p is None else [p] if isinstance(p, str) else list(p)

    figs = {}
    _figures.live_figures(paths(steps), paths(summary), paths(replay), figs, [])
    return figs


def _attention(trace, sample, layer, head):
    s = trace.sample(sample) if isinstance(sample, str) else sample
    tensors = s.layer(layer)
    q = tensors["q"][:, head, :].astype(np.float64)
    group = trace.num_heads // trace.num_kv_heads
    k = tensors["k"][:, head // group, :].astype(np.float64)
    logits = (q @ k.T) * trace.scale
    logits[np.triu_indices_from(logits, 1)] = -np.inf  # causal
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    return s, p / p.sum(axis=1, keepdims=True)


def attention(trace, sample, layer, head, gamma=0.3):
    """One query head's causal attention map (rows: queries, columns: keys), computed from the
    trace's q and k as the engine does, on a power scale (p**gamma) so that small weights stay
    visible; the prompt/decode boundary and the image tokens are marked.

    trace: a kvsim.Trace; sample: its name or a kvsim.Sample."""
    s, p = _attention(trace, sample, layer, head)
    fig, ax = _figures.new_figure(figsize=(6, 5.2))
    im = ax.imshow(p ** gamma, cmap="magma", origin="upper", interpolation="nearest")
    fig.colorbar(im, ax=ax, label=f"attention weight ^ {gamma:g}")
    ax.axhline(s.prompt_len - 0.5, color="white", lw=0.6, ls="--")
    media = np.flatnonzero(np.asarray(s.modality) > 0)
    if media.size:
        ax.axvspan(media[0] - 0.5, media[-1] + 0.5, ymin=0, ymax=1, color="cyan", alpha=0.08)
    ax.set(title=f"{s.name}, layer {layer}, head {head} (dashed: end of prompt; shaded: media)",
           xlabel="key position", ylabel="query position")
    ax.title.set_fontsize(8)
    fig.tight_layout()
    return fig


def modality_shares(trace, sample, layer=None):
    """Where decode steps attend, per query head: the attention mass on system, media, user and
    generated tokens, averaged over decode steps, for one layer or (layer=None) the mean over
    layers as stacked bars."""
    s = trace.sample(sample) if isinstance(sample, str) else sample
    layers = range(trace.num_layers) if layer is None else [layer]
    modality, segment = np.asarray(s.modality), np.asarray(s.segment)
    groups = {"system": (segment == 0) & (modality == 0), "media": modality > 0,
              "user": (segment == 1) & (modality == 0), "generated": segment == 2}
    shares = np.zeros((trace.num_heads, len(groups)))
    for l in layers:
        for h in range(trace.num_heads):
            _, p = _attention(trace, s, l, h)
            decode = p[s.prompt_len:] if s.gen_len else p[-1:]
            shares[h] += [decode[:, m].sum(axis=1).mean() for m in groups.values()]
    shares /= len(layers)
    fig, ax = _figures.new_figure(figsize=(7, 3.8))
    bottom = np.zeros(trace.num_heads)
    for (name, _), column in zip(groups.items(), shares.T):
        ax.bar(range(trace.num_heads), column, bottom=bottom, label=name)
        bottom += column
    where = f"layer {layer}" if layer is not None else "mean over layers"
    ax.set(title=f"{s.name}: attention of decode steps by token kind ({where})",
           xlabel="query head", ylabel="attention mass", ylim=(0, 1.0))
    ax.set_xticks(range(trace.num_heads))
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.18))
    fig.tight_layout()
    return fig
