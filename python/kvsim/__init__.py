"""kvsim from Python: open kvtrace files as numpy arrays, replay them through KV-cache eviction
policies (built-in or written in Python), and list the policies.

    import kvsim, pandas
    t = kvsim.Trace("trace.h5"); s = t.sample(t.samples()[0]); q = s.layer(3)["q"]  # [T, H, d]
    res = kvsim.replay("trace.h5", policies={"h2o": {"budget": "20%"}, "snapkv": {}})
    df = pandas.DataFrame(res)   # the columns and rows of `kvsim replay --out`

The C++ engine does the work (`kvsim._kvsim`, built by CMake with pybind11); see docs/python.md,
section "Python".
"""
import sys as _sys

# What an interpreter without numpy is told (a python3 on PATH that is not Debian's, say).
_NEEDS_NUMPY = (f"kvsim needs numpy, which this interpreter ({_sys.executable}) lacks: use "
                f"Debian's /usr/bin/python3 (./install-deps.sh installs python3-numpy, -pandas "
                f"and -matplotlib), or install numpy into this one")

try:
    import numpy as _numpy  # noqa: F401  (the C++ module hands out numpy arrays)
except ImportError:
    _numpy = None
try:
    if _numpy is None:
        raise ImportError(_NEEDS_NUMPY)
    from ._kvsim import (Cache, LayerView, Sample, StepAttention, Trace, __version__,
                         compact_trace, policies, presets, prompt_statistics, resolve_budget,
                         step_metrics, write_trace)
    from ._kvsim import replay as _replay
    from ._kvsim import stats as _stats
except ImportError as _missing:  # kvsim.capture needs only torch and h5py (e.g. on a GPU machine)
    import glob as _glob
    import os as _os

    _built = [_os.path.basename(p) for p in
              _glob.glob(_os.path.join(_os.path.dirname(__file__), "_kvsim*.so"))]
    _here = (f"this interpreter is {_sys.executable} (Python {_sys.version.split()[0]}, "
             f"ABI tag {_sys.implementation.cache_tag})")
    if _numpy is None:
        _why = _NEEDS_NUMPY
    elif _built:
        _why = ("it needs the C++ module kvsim._kvsim, which could not be imported: the module "
                f"here was built for another interpreter ({', '.join(_built)}); {_here}: run "
                "`pip install .` (or CMake) with this interpreter")
    else:
        _why = (f"it needs the C++ module kvsim._kvsim, which could not be imported: {_missing}; "
                f"{_here}: build it with `pip install .` from the checkout, or with CMake "
                "(docs/python.md)")

    def __getattr__(name):
        raise ImportError(f"kvsim.{name} is unavailable: {_why}")
else:
    _why = None

    def _trace_len(self):
        return len(self.samples())

    def _trace_iter(self):
        return (self.sample(name) for name in self.samples())

    def _trace_contains(self, name):
        return name in self.samples()

    def _trace_enter(self):
        return self

    def _trace_exit(self, *exc):
        return False

    # A trace is a read-only mapping of sample names to Samples: len(t), iteration over its
    # samples, t["000000"] (KeyError naming the samples), `name in t`, and `with kvsim.Trace(...)`.
    Trace.__len__ = _trace_len
    Trace.__iter__ = _trace_iter
    Trace.__getitem__ = Trace.sample
    Trace.__contains__ = _trace_contains
    Trace.__enter__ = _trace_enter
    Trace.__exit__ = _trace_exit
    Trace.keys = Trace.samples


def _require_engine(name):
    """ImportError naming what is missing (numpy, or the C++ module) before kvsim.NAME runs."""
    if _why is not None:
        raise ImportError(f"kvsim.{name} is unavailable: {_why}")


def _progress_callback(progress, what):
    """(callback, bar to close): True draws a tqdm bar (text in terminals and notebooks) when
    tqdm is installed; a callable is called as progress(done, total); None or False: nothing."""
    if callable(progress):
        return progress, None
    if progress is not True:
        return None, None
    try:
        from tqdm import tqdm
    except ImportError:
        return None, None
    bar = tqdm(total=0, desc=what, unit="layer", leave=False)

    def update(done, total):
        if bar.total != total:
            bar.total = total
        bar.update(done - bar.n)

    return update, bar


def _frame(columns, integer=(), nullable=()):
    import pandas as pd

    df = pd.DataFrame(columns)
    for name in df.columns:
        if name in nullable:  # counts that may be missing: pandas' nullable integers
            df[name] = pd.array([None if v != v else int(v) for v in df[name]], dtype="Int64")
        elif name in integer:
            df[name] = df[name].astype("int64")
        elif df[name].dtype == object:
            df[name] = df[name].astype("string")
    return df


def replay(trace, policies, samples=None, threads=0, budget="", diagnostics=False,
           decisions=False, as_frame=False, progress=None, seeds=5, equal_memory=False,
           prompt_tail=None, metrics=()):
    """Replays samples of a trace through policies, as `kvsim replay --out` does.

    policies: a policy or preset name, a kvsim.Policy object, a list of either (objects are
    labelled by their class name), or a dict whose keys are labels and whose values are None,
    {parameter: value} or a kvsim.Policy object. samples: names (default: every sample; KeyError
    for one the trace lacks). threads: 0 = all cores (results do not depend on it). budget: for
    every policy that declares one and is given none (like --budget). diagnostics: also fill the
    hit-rate, miss and evicted-mass columns (like --diagnostics). progress: True for a tqdm bar,
    or a callable progress(layers_done, layers_total). seeds: a policy with a `seed` parameter
    (random) and none given runs once per seed 0 .. seeds - 1, labelled NAME@seedK (like
    --seeds; kvsim.summarize and kvsim.compare pool them). equal_memory: hold every budgeted
    policy to its budget at every step (like --equal-memory). prompt_tail: N or "question":
    every policy compresses the prompt less its last N tokens (or its question), which are then
    fed as the first decode steps, so no answer token comes from the full prompt (like
    --prompt-tail; the steps then start with those tokens). metrics: optional per-step metrics
    to run by name (like --metrics; kvsim.step_metrics() lists them and their columns).

    Returns a dict of numpy columns named as the CSV's (pandas.DataFrame(result) is the CSV), or
    with as_frame=True a DataFrame: text as pandas strings, counts int64, metrics float32,
    the metrics' counts (misses_top10) as nullable Int64. With decisions=True, returns (results, decisions): one row
    per eviction (into_position -1) and per merge. Errors: FileNotFoundError, KeyError,
    ValueError (a parameter, naming it and the policy), and a Python policy's own exception as
    itself, with a note naming the policy."""
    _require_engine("replay")
    callback, bar = _progress_callback(progress, "replay")
    try:
        out = _replay(trace, policies, samples, threads, budget, diagnostics, decisions, callback,
                      seeds, equal_memory, prompt_tail, list(metrics))
    finally:
        if bar is not None:
            bar.close()
    if not as_frame:
        return out
    counts = {c for m in step_metrics() for c in m["counts"]}
    if decisions:
        results, log = out
        return (_frame(results, nullable=counts),
                _frame(log, integer=set(log) - {"policy", "sample"}))
    return _frame(out, nullable=counts)


def stats(trace, samples=None, as_frame=False, **options):
    """The attention statistics of `kvsim stats` ({sample: {dataset: float64 array}}), with the
    same options (epsilon, concentration, ppci, dap_r, dap_alpha, key_quantiles, threads).
    as_frame=True: one DataFrame of the per-layer datasets (sample, layer, then one column per
    dataset that has one value per layer)."""
    _require_engine("stats")
    out = _stats(trace, samples, **options)
    if not as_frame:
        return out
    import pandas as pd

    frames = []
    for name, datasets in out.items():
        layers = {k: v for k, v in datasets.items() if v.ndim == 1}
        n = max((len(v) for v in layers.values()), default=0)
        columns = {"sample": [name] * n, "layer": list(range(n))}
        columns.update({k: v for k, v in layers.items() if len(v) == n})
        frames.append(pd.DataFrame(columns))
    return _frame(pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(),
                  integer={"layer"})


def sweep(traces, policies, out, grid=None, set=None, budget="", samples=None, threads=0,
          as_frame=False, progress=None, seeds=5, equal_memory=False):
    """`kvsim sweep` on this machine: every configuration of `policies` over the `grid` axes,
    on every trace and sample; finished items are kept under `out` (a rerun skips them, and
    resumes an interrupted (trace, sample) after the last layer it finished). Returns
    OUT/results.csv as a dict of numpy columns (numbers as float64 / int64, names as object
    arrays), or with as_frame=True a pandas DataFrame.

    traces: a path or a list of paths. policies: a name or a list of names (policies or presets).
    grid: {"h2o.budget": ["5%", "10%"], "st3.S+R": ["1/1.75", "7/12.25"]} or axis strings as
    `--grid` takes them ("h2o.budget=40:130:10"). set: {"h2o.recent": "25%"} (as `--set`).
    budget: as `--budget`. progress: True for a tqdm bar, or a callable progress(done, total)
    called after every replayed layer. seeds: a `seed` axis 0 .. seeds - 1 for every policy that
    draws (random) and is given no seed (like --seeds). equal_memory: hold every configuration to
    its budget (like --equal-memory)."""
    _require_engine("sweep")
    import csv
    import os

    import numpy as np

    from ._kvsim import _sweep

    traces = [traces] if isinstance(traces, str) else list(traces)
    policies = [policies] if isinstance(policies, str) else list(policies)
    def text(value):  # as kvsim reads parameter values (and kvsim.replay converts them)
        return ("true" if value else "false") if isinstance(value, bool) else str(value)

    if isinstance(grid, dict):
        grids = [f"{axis}={','.join(text(v) for v in values)}" for axis, values in grid.items()]
    else:
        grids = list(grid or [])
    sets = [f"{k}={text(v)}" for k, v in (set or {}).items()]
    callback, bar = _progress_callback(progress, "sweep")
    try:
        _sweep(traces, policies, grids, sets, budget, out, list(samples or []), threads, callback,
               seeds, equal_memory)
    finally:
        if bar is not None:
            bar.close()
    with open(os.path.join(out, "results.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    text = {"trace", "trace_hash", "sample", "label", "policy", "params"}
    integer = {"layer", "kv_head", "steps"}
    columns = {}
    names = rows[0].keys() if rows else []
    for name in names:
        cells = [r[name] for r in rows]
        if name in integer:
            columns[name] = np.array(cells, dtype=np.int64)
        elif name in text:
            columns[name] = np.array(cells, dtype=object)
        else:
            try:  # measurements, budget_entries/fraction and numeric parameters
                columns[name] = np.array([float(c) if c else np.nan for c in cells])
            except ValueError:  # a parameter with text values ("50%", "kv_head")
                columns[name] = np.array(cells, dtype=object)
    return _frame(columns, integer=integer) if as_frame else columns


def _table(results, metric):
    """(policy, sample, values, weights) of a result table: a path to a CSV kvsim wrote, a
    DataFrame, or a dict of columns (kvsim.replay's result), as `kvsim compare` reads them."""
    import numpy as np
    import pandas as pd

    if isinstance(results, (str, bytes)) or hasattr(results, "__fspath__"):
        frame = pd.read_csv(results, keep_default_na=False, na_values=[""], dtype={"sample": str})
    else:
        frame = pd.DataFrame(results)
    label = "label" if "label" in frame.columns else "policy"
    for needed in (label, "sample", metric):
        if needed not in frame.columns:
            raise KeyError(f"no column {needed!r} (the table has: {', '.join(map(str, frame.columns))})")
    sample = frame["sample"].astype(str)
    if "trace" in frame.columns:
        sample = [s if s == "all" else f"{t}/{s}" for t, s in zip(frame["trace"].astype(str), sample)]
    weight = next((frame[w] for w in ("rows", "steps") if w in frame.columns), None)
    # The memory each row held (`kvsim compare` reads the same columns).
    budget = next((frame[b] for b in ("budget_entries", "budget") if b in frame.columns), None)
    budget = [] if budget is None else ["" if pd.isna(b) else _budget_text(b) for b in budget]
    return ([str(p) for p in frame[label]], [str(s) for s in sample],
            pd.to_numeric(frame[metric], errors="raise").astype(float).tolist(),
            [] if weight is None else np.asarray(weight, dtype=float).tolist(), budget)


def _budget_text(value):
    """A budget cell as kvsim writes it: 40, not pandas' 40.0."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def summarize(results, metrics, resamples=2000, seed=0):
    """Means over samples with their count and 95% interval, per policy, for one metric or a list:
    a DataFrame with columns policy, metric, n, seeds, mean, ci_low, ci_high, seed_sd.

    results: a result CSV's path (replay --summary or --out, live evaluate --summary, a sweep's
    results.csv), a DataFrame or kvsim.replay's dict. A policy's value on a sample is the mean of
    its rows there (weighted by `rows` or `steps` where the table has them); the runs of one policy
    over seeds (NAME@seedK) are one policy, each sample's value their mean, with the SD of the
    runs' means in seed_sd. The interval is the seeded percentile bootstrap over samples
    (docs/outputs.md); with one sample there is none (NaN)."""
    _require_engine("summarize")
    import pandas as pd

    from ._kvsim import _summarize

    frames = []
    for metric in [metrics] if isinstance(metrics, str) else list(metrics):
        policy, sample, value, weight, _ = _table(results, metric)
        out = _summarize(policy, sample, value, weight, resamples, seed)
        frame = pd.DataFrame(out)
        frame.insert(1, "metric", metric)
        frames.append(frame)
    return _frame(pd.concat(frames, ignore_index=True), integer={"n", "seeds"})


def crossed_bootstrap(values, resamples=2000, seed=0):
    """Inference over trained models and items at once: `values` is [seeds, items] (every model,
    trained with its own seed, asked the same items; e.g. one policy's answer minus another's).
    Seeds and items are resampled independently (Owen's pigeonhole bootstrap, for crossed
    random effects; docs/outputs.md), so the interval covers which models were trained as well
    as which items were asked. Returns a dict: seeds, items, mean (of every cell), ci_low and
    ci_high (the 95% percentile interval; NaN with under two seeds or items), and p_value (the
    two-sided bootstrap p of a mean of 0). ValueError for a ragged or non-finite table."""
    _require_engine("crossed_bootstrap")
    import numpy as np

    from ._kvsim import _crossed_bootstrap

    table = np.asarray(values, dtype=float)
    if table.ndim != 2:
        raise ValueError(f"crossed_bootstrap: values must be [seeds, items], not {table.ndim}-D")
    return _crossed_bootstrap(table.tolist(), resamples, seed)


def compare_seeds(results, metric, reference, policies=None, higher_is_better=None, alpha=0.05,
                  resamples=10000, seed=0):
    """Paired comparisons over trained models and items at once: each policy against `reference`
    where `results` (a DataFrame or dict of columns) holds one or more rows per (seed, policy,
    sample) with the value in column `metric` (rows of one cell, e.g. a random floor's draws, are
    averaged). A seed is a model trained with that seed; every seed answers the same samples. The
    rows must be of one memory (one budget): a `budget` column with two values is refused. Each
    comparison resamples seeds and samples at once (crossed_bootstrap on the paired differences;
    a sample missing under any seed for either policy is left out), Holm over the family
    (policies: default every policy but the reference). Returns a DataFrame with kvsim.compare's
    columns (test = crossed_bootstrap; n counts samples, seeds the trained models; wins / ties /
    losses over the samples' seed means) where `detectable` is the difference with 80% power at
    Holm's first step (alpha / family size): smaller differences have less power. ValueError for a
    missing column, policy or seed, or rows of several budgets."""
    _require_engine("compare_seeds")
    import pandas as pd

    from ._kvsim import _compare_seeds

    frame = pd.DataFrame(results)
    for needed in ("seed", "policy", "sample", metric):
        if needed not in frame.columns:
            raise ValueError(f"compare_seeds: no column {needed!r} (the table has: "
                             f"{', '.join(map(str, frame.columns))})")
    if "budget" in frame.columns and frame["budget"].nunique(dropna=False) > 1:
        raise ValueError("compare_seeds: the rows hold several budgets "
                         f"({', '.join(map(str, frame['budget'].unique()))}); compare one memory "
                         "at a time")
    cells = frame.pivot_table(index=["policy", "seed"], columns="sample", values=metric,
                              aggfunc="mean", dropna=False)
    names = list(dict.fromkeys(frame["policy"]))
    if reference not in names:
        raise ValueError(f"compare_seeds: no reference {reference!r} among the policies "
                         f"({', '.join(map(str, names))})")
    if isinstance(policies, str):
        policies = [policies]
    chosen = [p for p in names if p != reference] if policies is None else list(policies)
    for p in chosen:
        if p not in names:
            raise ValueError(f"compare_seeds: no policy {p!r} (the table has: "
                             f"{', '.join(map(str, names))})")
    seeds = sorted(frame["seed"].unique())

    def matrix(policy):
        return cells.loc[policy].reindex(seeds).to_numpy(dtype=float).tolist()

    out = _compare_seeds([str(p) for p in chosen], [matrix(p) for p in chosen], str(reference),
                         matrix(reference), metric, higher_is_better, alpha, resamples, seed)
    higher = out.pop("higher_is_better")
    seeds_column = out.pop("seeds")
    frame = pd.DataFrame(out)
    frame.insert(3, "seeds", seeds_column)
    frame.insert(2, "metric", metric)
    frame.insert(3, "higher_is_better", higher)
    return _frame(frame, integer={"n", "seeds", "wins", "ties", "losses", "family_size"})


def compare(results, metric, reference="full", policies=None, higher_is_better=None, alpha=0.05,
            resamples=2000, seed=0, any_memory=False):
    """`kvsim compare` from Python: the policies of a result table (a CSV path, a DataFrame or
    kvsim.replay's dict) against `reference`, sample by sample, at equal memory: a budgeted
    reference is compared with the rows of its budget only (the others listed in
    frame.attrs["skipped"]; naming one in `policies` raises KeyError), the full cache with every
    row, a self-sizing reference with none (KeyError) unless any_memory=True; each memory class
    is its own Holm family. Returns a DataFrame with the columns of `kvsim compare -o`
    (docs/outputs.md): n, test (mcnemar for right/wrong answers, else sign_flip), mean,
    reference_mean, difference and its 95% bootstrap interval (ci_low, ci_high), wins / ties /
    losses, effect_size (d_z), p_value, p_holm (Holm's adjustment within the memory class),
    detectable (the difference n samples detect with 80% power at Holm's first step, alpha /
    family_size; NaN where the test cannot reach it), verdict ("better", "worse" or "no difference shown": never an order
    that the test does not show), memory, family_size and smallest_p (the smallest p n pairs
    allow). higher_is_better: None for kvsim's own columns, else say. KeyError for a missing
    column or policy."""
    _require_engine("compare")
    import pandas as pd

    from ._kvsim import _compare

    policy, sample, value, weight, budget = _table(results, metric)
    if isinstance(policies, str):
        policies = [policies]
    out = _compare(policy, sample, value, weight, metric, reference, list(policies or []),
                   higher_is_better, alpha, resamples, seed, budget, any_memory)
    higher = out.pop("higher_is_better")
    skipped = out.pop("skipped")
    frame = pd.DataFrame(out)
    frame.insert(2, "metric", metric)
    frame.insert(3, "higher_is_better", higher)
    frame = _frame(frame, integer={"n", "wins", "ties", "losses", "family_size"})
    frame.attrs["skipped"] = skipped
    return frame


def register(name, factory, params=(), summary="", provenance="Python", switches=()):
    """Registers a policy written in Python under `name`, with typed parameters, so that it is
    used like a built-in one in this process: by name in kvsim.replay and kvsim.sweep (grids over
    its parameters included), listed by kvsim.policies(), its values checked against the
    declarations (errors name the parameter and the policy).

    factory: a kvsim.Policy subclass (or any callable) called per sample with the resolved
    parameters as keyword arguments (int, float and bool as Python values; size, choice and
    string as str). params: dicts with "name", "type" (int, float, bool, size, choice, string),
    "default", and optionally "doc", "min", "max", "choices". switches: any of "decode" (grow,
    cap or every:N while decoding, applied around the policy), "caches" (kv_head or query_head:
    one cache per query head on GQA layers) and "question" (compress, or append: the context
    compressed alone and the question appended after it), each adding its parameter as the
    built-in policies have it (`kvsim.policies()` lists them); a parameter of `params` may not
    take their names. A name registered from Python may be registered again (the new definition
    replaces it); a built-in name may not."""
    _require_engine("register")
    from ._kvsim import _register

    _register(name, factory, [dict(p) for p in params], summary, provenance,
              [switches] if isinstance(switches, str) else list(switches))


class Policy:
    """Base of policies written in Python; pass an instance to kvsim.replay under any label.

    The engine calls, per sample: start(sample) once, then on_prefill(view, cache) for every
    layer in order and on_decode(view, att, cache) for each decode step of that layer (the call
    order of C++ policies, policies/policy.hpp). `view` (kvsim.LayerView), `att`
    (kvsim.StepAttention) and `cache` (kvsim.Cache) expose numpy views of the engine's own
    buffers: no copies, valid only during the call. Edit the cache with cache.evict(g, entries),
    cache.keep_only(g, flags), cache.set_attended(g, e, bool) and cache.merge(g, e, into, key,
    value); entries are indices in cache order (ascending positions, cache.positions(g)).

    Class attributes: `needs`, the statistics the policy reads ({"prefill_column_sums": True,
    "prefill_window": 8, "text_query_layers": 1}); `merges = True` if it merges. Define
    capacity(layer, kv_head) to have the engine check a bound after every hook.
    """

    needs = {}
    merges = False
    _HOOKS = ("start", "on_prefill", "on_decode", "capacity", "score")

    def __init_subclass__(cls, **kwargs):
        # A misspelt hook would run silently as the full cache: say so when the class is made.
        super().__init_subclass__(**kwargs)
        import difflib
        import warnings

        for name in vars(cls):
            if name.startswith("on_") and name not in cls._HOOKS:
                close = difflib.get_close_matches(name, cls._HOOKS, n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                warnings.warn(f"{cls.__name__}.{name} is not a kvsim.Policy hook and is never "
                              f"called{hint}; the hooks are on_prefill and on_decode",
                              stacklevel=2)
        if cls.__module__ == __name__:  # kvsim's own bases
            return
        bases = [c for c in cls.__mro__ if c.__module__ != __name__ and c is not object]
        if not any(h in c.__dict__ for c in bases for h in cls._HOOKS):
            warnings.warn(f"{cls.__name__} overrides no hook of kvsim.Policy (on_prefill, "
                          f"on_decode, or score for a ScorerPolicy): it keeps the full cache",
                          stacklevel=2)

    def start(self, sample):
        """Before each sample: a dict with name, prompt_len and the prompt's modality (the generation's
        length is not known before decoding)."""

    def on_prefill(self, view, cache):
        """End of a layer's prefill: the cache holds positions 0..P-1 in every KV head."""

    def on_decode(self, view, att, cache):
        """After decode step att.step attended; the cache already holds its position."""


class ScorerPolicy(Policy):
    """A policy written the way a kvpress ScorerPress is: define score(view, cache), returning
    one score per position for every KV head (a [num_kv_heads, view.visible_len] array; higher
    is kept), and kvsim's C++ selectors do the rest, with the parameters of the built-in
    policies:

    budget (required, no default: kvpress's presses state their compression_ratio too): entries
        kept per KV head (a count, "20%" of the prompt, or "compression_ratio:0.8" as kvpress,
        which keeps int(P * 0.2)); window: the newest entries always kept;
        sinks: the first entries always kept; selection: "per_head" (each head its own best)
        or "adaptive" (kvpress's AdaKVPress: a floor of int(alpha * budget) per head, the rest
        jointly across heads); decode: False to compress at the end of the prefill only (as
        kvpress's presses), True to select again whenever a head holds more than the budget
        during decoding.

    Scores are gathered at each head's cached positions (cache.positions(g)); ties keep the
    newer entry, as every built-in selection does. Each call of score() costs what its numpy
    code costs plus one gather and one selection per KV head (docs/python.md)."""

    def __init__(self, budget, window=0, sinks=0, selection="per_head", alpha=0.2,
                 decode=False):
        if selection not in ("per_head", "adaptive"):
            raise ValueError(f"{type(self).__name__}: selection must be 'per_head' or "
                             f"'adaptive', not {selection!r}")
        for name, value in (("window", window), ("sinks", sinks)):
            if int(value) < 0:
                raise ValueError(f"{type(self).__name__}: {name} must be >= 0, not {value}")
        resolve_budget(str(budget), 1)  # ValueError now, not at the first sample
        self.budget, self.window, self.sinks = str(budget), int(window), int(sinks)
        self.selection, self.alpha, self.decode = selection, float(alpha), bool(decode)

    def score(self, view, cache):
        raise NotImplementedError(f"{type(self).__name__} must define score(view, cache)")

    def start(self, sample):
        self.keep = resolve_budget(self.budget, sample["prompt_len"])

    def on_prefill(self, view, cache):
        self._select(view, cache)

    def on_decode(self, view, att, cache):
        if self.decode and any(cache.size(g) > self.keep for g in range(cache.kv_heads)):
            self._select(view, cache)

    def _select(self, view, cache):
        import numpy as np

        from ._kvsim import _select

        if all(cache.size(g) <= self.keep for g in range(cache.kv_heads)):
            return
        scores = np.asarray(self.score(view, cache), dtype=np.float64)
        want = (cache.kv_heads, view.visible_len)
        if scores.shape != want:
            raise ValueError(f"{type(self).__name__}.score returned shape {scores.shape}; "
                             f"expected (num_kv_heads, visible_len) = {want}")
        per_entry = [scores[g][cache.positions(g)] for g in range(cache.kv_heads)]
        alpha = self.alpha if self.selection == "adaptive" else -1.0
        for g, keep in enumerate(_select(per_entry, self.keep, self.sinks, self.window, alpha)):
            if not keep.all():
                cache.keep_only(g, keep)


__all__ = ["Trace", "Sample", "replay", "stats", "sweep", "summarize", "compare",
           "compare_seeds", "crossed_bootstrap", "write_trace",
           "compact_trace", "prompt_statistics", "register", "policies", "presets", "Policy",
           "ScorerPolicy", "resolve_budget", "step_metrics",
           "LayerView", "StepAttention", "Cache", "__version__"]
