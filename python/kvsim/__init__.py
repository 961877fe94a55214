"""kvsim from Python: open kvtrace files as numpy arrays, replay them through KV-cache eviction
policies (built-in or written in Python), and list the policies.

    import kvsim, pandas
    t = kvsim.Trace("trace.h5"); s = t.sample(t.samples()[0]); q = s.layer(3)["q"]  # [T, H, d]
    res = kvsim.replay("trace.h5", policies={"h2o": {"budget": "20%"}, "snapkv": {}})
    df = pandas.DataFrame(res)   # the columns and rows of `kvsim replay --out`

The C++ engine does the work (`kvsim._kvsim`, built by CMake with pybind11); see docs/python.md,
section "Python".
"""
try:
    from ._kvsim import (Cache, LayerView, Sample, StepAttention, Trace, __version__, policies,
                         presets, replay, stats, write_trace)
except ImportError as _missing:  # kvsim.capture needs only torch and h5py (e.g. on a GPU machine)
    _why = str(_missing)

    def __getattr__(name):
        raise ImportError(f"kvsim.{name} needs the C++ module kvsim._kvsim, which could not be "
                          f"imported ({_why}); build it with CMake (docs/python.md)")


def sweep(traces, policies, out, grid=None, set=None, budget="", samples=None, threads=0):
    """`kvsim sweep` on this machine: every configuration of `policies` over the `grid` axes,
    on every trace and sample; finished items are kept under `out` (a rerun skips them, an
    interrupted sweep loses only the item in flight). Returns OUT/results.csv as a dict of
    numpy columns (numbers as float64 / int64, names as object arrays).

    traces: a path or a list of paths. policies: a name or a list of names (policies or presets).
    grid: {"h2o.budget": ["5%", "10%"], "st3.S+R": ["1/1.75", "7/12.25"]} or axis strings as
    `--grid` takes them ("h2o.budget=40:130:10"). set: {"h2o.recent": "25%"} (as `--set`).
    budget: as `--budget`."""
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
    _sweep(traces, policies, grids, sets, budget, out, list(samples or []), threads)
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
    return columns


def register(name, factory, params=(), summary="", provenance="Python"):
    """Registers a policy written in Python under `name`, with typed parameters, so that it is
    used like a built-in one in this process: by name in kvsim.replay and kvsim.sweep (grids over
    its parameters included), listed by kvsim.policies(), its values checked against the
    declarations (errors name the parameter and the policy).

    factory: a kvsim.Policy subclass (or any callable) called per sample with the resolved
    parameters as keyword arguments (int, float and bool as Python values; size, choice and
    string as str). params: dicts with "name", "type" (int, float, bool, size, choice, string),
    "default", and optionally "doc", "min", "max", "choices". A name registered from Python may
    be registered again (the new definition replaces it); a built-in name may not."""
    from ._kvsim import _register

    _register(name, factory, [dict(p) for p in params], summary, provenance)


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

    def start(self, sample):
        """Before each sample: a dict with name, prompt_len and the prompt's modality (the generation's
        length is not known before decoding)."""

    def on_prefill(self, view, cache):
        """End of a layer's prefill: the cache holds positions 0..P-1 in every KV head."""

    def on_decode(self, view, att, cache):
        """After decode step att.step attended; the cache already holds its position."""


__all__ = ["Trace", "Sample", "replay", "stats", "sweep", "write_trace", "register", "policies", "presets", "Policy",
           "LayerView", "StepAttention", "Cache", "__version__"]
