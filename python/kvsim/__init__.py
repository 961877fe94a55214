"""kvsim from Python: open kvtrace files as numpy arrays, replay them through KV-cache eviction
policies, and list the policies.

    import kvsim, pandas
    t = kvsim.Trace("trace.h5"); s = t.sample(t.samples()[0]); q = s.layer(3)["q"]  # [T, H, d]
    res = kvsim.replay("trace.h5", policies={"h2o": {"budget": "20%"}, "snapkv": {}})
    df = pandas.DataFrame(res)   # the columns and rows of `kvsim replay --out`

The C++ engine does the work (`kvsim._kvsim`, built by CMake with pybind11); see README.md,
section "Python".
"""
from ._kvsim import Sample, Trace, __version__, policies, presets, replay

__all__ = ["Trace", "Sample", "replay", "policies", "presets", "__version__"]
