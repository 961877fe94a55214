"""The look every kvsim figure shares: a fixed colour and marker per policy (a preset in its
policy's hue, shaded by its reading; tagged runs in their policy's), a line style per label, figures outside pyplot's global state, and
saving as PNG and PDF (or into a dict, for kvsim.plot). Used by figures.py, sweep_report.py and
the experiments' reports."""
import os
import re

import matplotlib
import numpy as np
from matplotlib.figure import Figure

# One colour per policy, the same in every figure and every run (presets use their policy's).
POLICY_COLOURS = {
    "full": "#000000", "oracle": "#7f7f7f", "streamingllm": "#bcbd22", "h2o": "#1f77b4",
    "snapkv": "#9467bd", "pyramidkv": "#17becf", "adakv": "#a55194", "tova": "#8c564b",
    "lookm": "#e377c2", "fastv": "#637939", "vtw": "#9c9ede", "hae": "#d62728",
    "madakv": "#2ca02c", "avl": "#ff7f0e", "st3": "#8c6d31", "meda": "#e7ba52",
    "knorm": "#843c39", "expected_attention": "#ad494a",
    # the floors and the image-free reference: greys and muted tones
    "random": "#a5a5a5", "downsample": "#6b6ecf", "text_only": "#cedb9c",
}


# A preset is drawn in its policy's hue, mixed toward black or white by its reading, so that the
# presets of one policy (six for adakv) and the policy itself are told apart.
PRESET_SHADES = {
    "original": ("black", 0.3), "paper": ("black", 0.3), "table1": ("black", 0.3),
    "released": ("black", 0.3), "kvpress": ("white", 0.3), "kvcache-factory": ("black", 0.5),
    "quickstart": ("white", 0.5), "table2": ("white", 0.5), "kvpress-expected-attention":
    ("white", 0.5), "table3": ("white", 0.7), "kvpress-expected-attention-e2": ("white", 0.7),
    "authors": ("black", 0.7),
}
OTHER_SHADES = [("black", 0.4), ("white", 0.4), ("white", 0.6), ("black", 0.6)]


def seed_group(label):
    """The policy a seeded run's label belongs to, as kvsim labels the runs over seeds (its
    seeded_label): NAME@seedK -> NAME, NAME@TAG-seedK -> NAME@TAG; other labels as they are."""
    m = re.fullmatch(r"(.*?)(?:@seed|(@[^@]*)-seed)\d+", label)
    return m.group(1) + (m.group(2) or "") if m else label


def policy_or_preset(name):
    """The policy or preset a label names: a tagged run ("@seed0"), a sweep configuration
    ("[...]"), a curve of one setting ("h2o (recent=25%)") and a row merging identical policies
    ("tova, tova:kvpress") name their (first) one."""
    return name.split(" (")[0].split(", ")[0].split("@")[0].split("[")[0]


def preset_of(name):
    """The reading of a preset label ("snapkv:kvpress" -> "kvpress"), "" for a policy's own."""
    return policy_or_preset(name).partition(":")[2]


def policy_colour(name):
    """The policy's fixed colour, a preset's in the same hue shaded by its reading; a tagged run
    and a row merging identical policies ("tova, tova:kvpress") take their (first) policy's."""
    base = base_policy(name)
    if base in POLICY_COLOURS:
        colour = POLICY_COLOURS[base]
    else:
        palette = matplotlib.colormaps["tab20"].colors
        colour = palette[sum(map(ord, base)) % len(palette)]
    preset = preset_of(name)
    if not preset:
        return colour
    towards, share = PRESET_SHADES.get(
        preset, OTHER_SHADES[sum(map(ord, preset)) % len(OTHER_SHADES)])
    end = np.zeros(3) if towards == "black" else np.ones(3)
    return matplotlib.colors.to_hex((1 - share) * np.array(matplotlib.colors.to_rgb(colour)) +
                                    share * end)


# One marker per policy, likewise, no two alike.
POLICY_MARKERS = {
    "full": "o", "oracle": "*", "streamingllm": "v", "h2o": "s", "snapkv": "D",
    "pyramidkv": "^", "adakv": "<", "tova": ">", "lookm": "p", "fastv": "h", "vtw": "H",
    "hae": "X", "madakv": "P", "avl": "d", "st3": "8", "meda": "+", "knorm": "1",
    "expected_attention": "2", "random": "x", "downsample": "3", "text_only": "4",
}
MARKERS = "osD^v<>ph*XP"
LINESTYLES = ["-", "--", "-.", ":"]


def base_policy(name):
    """The policy of a label: a preset, a tagged run ("@seed0"), a sweep configuration ("[...]"),
    a curve of one setting ("h2o (recent=25%)") and a row merging identical policies ("tova,
    tova:kvpress") take their (first) policy's."""
    return policy_or_preset(name).partition(":")[0]


def policy_marker(name):
    """The policy's fixed marker (one from its name for a policy not listed)."""
    base = base_policy(name)
    return POLICY_MARKERS.get(base, MARKERS[sum(map(ord, base)) % len(MARKERS)])


def policy_style(name):
    """Colour and marker (fixed per policy) and line style (fixed per label), so that sixteen
    curves stay distinguishable in print and in greyscale."""
    h = sum((i + 1) * ord(c) for i, c in enumerate(name))
    return {"color": policy_colour(name), "marker": policy_marker(name),
            "linestyle": LINESTYLES[h % len(LINESTYLES)]}


def layer_axis(ax):
    """Layers are whole numbers: no 0.5 ticks on small traces."""
    from matplotlib.ticker import MaxNLocator
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def new_figure(rows=1, cols=1, figsize=None, **kwargs):
    """A Figure and its axes, outside pyplot's global state: nothing accumulates over a long
    run, and a notebook shows a returned Figure once."""
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(rows, cols, **kwargs)


def save(fig, out, stem, written, context=None):
    """PNG and PDF in the directory `out`, or, when `out` is a dict (kvsim.plot), the finished
    Figure under `stem`. `context` (trace and sample) goes above the panels' own titles."""
    for ax in fig.axes:
        if ax.get_xlabel() == "layer":
            layer_axis(ax)
    if context:
        fig.suptitle(context, fontsize=9)
    fig.tight_layout()
    if isinstance(out, dict):
        out[stem] = fig
        return
    for ext in ("png", "pdf"):
        path = os.path.join(out, f"{stem}.{ext}")
        # No creation date in the PDF: the same figure gives the same bytes.
        fig.savefig(path, dpi=150, metadata={"CreationDate": None} if ext == "pdf" else None)
        written.append(path)


def readable_legend(fig, ax, entries):
    """One legend for the figure's labelled artists (every panel's, each label once) on `ax`,
    readable in print (8 pt): inside the axes for a few entries, beside them for more."""
    handles, labels = [], []
    for panel in fig.axes:
        for h, label in zip(*panel.get_legend_handles_labels()):
            if label not in labels:
                handles.append(h)
                labels.append(label)
    if not labels:
        return
    if entries <= 6:
        ax.legend(handles, labels, fontsize=8)
        return
    ax.legend(handles, labels, fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1),
              borderaxespad=0, ncol=1 if entries <= 16 else 2)
    fig.set_figwidth(fig.get_figwidth() + (2.2 if entries <= 16 else 4.2))


def draw_intervals(ax, xs, lows, highs, colour):
    """Vertical 95% interval bars at each point (none where a bound is NaN)."""
    keep = [i for i in range(len(xs)) if np.isfinite(lows[i]) and np.isfinite(highs[i])]
    if keep:
        ax.vlines([xs[i] for i in keep], [lows[i] for i in keep], [highs[i] for i in keep],
                  colors=colour, lw=1.2, alpha=0.7)


def memory_axes(recall_ax, error_ax, xlabel, note):
    """The axes of recall and output error against the memory held: labels, and titles with the
    figure's note (what is pooled, what the bars are) on a second line."""
    recall_ax.set(xlabel=xlabel, ylabel="mean mass recall")
    error_ax.set(xlabel=xlabel, ylabel="mean relative output error ‖o − ô‖/‖o‖")
    recall_ax.set_title(f"Mass recall vs memory held\n{note}", fontsize=9)
    error_ax.set_title(f"Output error vs memory held\n{note}", fontsize=9)


def label_points(ax, xs, ys, labels):
    """Each point's label (its budget) beside it, small."""
    for x, y, text in zip(xs, ys, labels):
        if np.isfinite(x) and np.isfinite(y):
            ax.annotate(str(text), (x, y), fontsize=7, textcoords="offset points", xytext=(3, 3))
