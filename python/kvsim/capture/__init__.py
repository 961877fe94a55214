"""Capture kvtrace v1 files (traces/kvtrace-v1.md) from PyTorch models.

Records, for every decoder layer, q and k exactly as they enter the q·k product (after the
rotary embedding, whatever kind) and v, during the prefill and a greedy decode with a full
cache. Pure Python over torch and h5py, so it runs where kvsim's C++ module is not built (a GPU
machine without HDF5's C library).

Architecture glue: a Recorder stands in for the model's attention function, with the signature
of transformers' AttentionInterface,

    recorder.attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw)

query [1, H, n, d] after the rotary embedding; key, value [1, Hkv, T, d], the whole cache after
this step's update (the last n rows are the new ones); module.layer_idx the decoder layer. Calls
whose module has no layer_idx (a vision tower's attention) pass through unrecorded. The recorder
returns what the function it wraps (`inner`, default: eager softmax attention with the mask)
returns, so the model runs unchanged. Supporting another architecture means routing its
attention through that call, in a few lines; transformers models do so already.

    rec = Recorder()
    model.attention_fn = rec.attention          # however the architecture exposes it
    with rec.sample("000000", modality=m, segment=s):
        ids = greedy(step, prompt_ids, gen=32)   # prefill + 32 decode steps, full cache
    rec.write("trace.h5", model="my-model", dtype="float16")
"""
import contextlib
import math
import sys

import numpy as np

from kvsim.capture import device_stats


def eager_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                    **kwargs):
    """softmax(scaling · q kᵀ + mask) v with GQA (key/value heads repeated); [B, n, H, d] out,
    transformers' convention for attention functions. The mask is additive (float), or boolean
    (True: attend, as transformers' sdpa masks); without one, a causal module
    (`module.is_causal`, default True) attends to the keys up to each query's position, the last
    n of the cache being the queries', and a non-causal one (a vision tower) to every key."""
    import torch

    h, hkv = query.shape[1], key.shape[1]
    if h != hkv:
        key = key.repeat_interleave(h // hkv, dim=1)
        value = value.repeat_interleave(h // hkv, dim=1)
    if scaling is None:
        scaling = 1 / math.sqrt(query.shape[-1])
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        mask = attention_mask[..., : key.shape[-2]]
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask
    elif getattr(module, "is_causal", True) and query.shape[2] > 1:
        n, T = query.shape[2], key.shape[2]
        future = torch.ones(n, T, dtype=torch.bool, device=scores.device).triu(T - n + 1)
        scores = scores.masked_fill(future, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(query.dtype)
    out = torch.matmul(probs, value)
    return out.transpose(1, 2).contiguous(), probs


class CaptureError(RuntimeError):
    """A capture that cannot make a valid trace (the message says which sample and layer)."""


class Recorder:
    """Collects q/k/v per sample and decoder layer; writes them as a kvtrace v1 file."""

    def __init__(self, inner=None):
        self.inner = inner or eager_attention
        self.samples = []  # finished samples, in order
        self.scale = None
        self.shapes = None  # (H, Hkv, d)
        # The rotary embedding the recorded q and k carry, written as the file attributes
        # rope_theta and mrope_section (kvtrace-v1.md) when set (kvsim.capture.hf sets them from
        # the model's config); None: the trace does not say.
        self.rope_theta = None
        self.mrope_section = None
        self._compact = None  # compact(): {"window", "dtype", "entropies", "on_device", "threads"}
        self._current = None

    def compact(self, window=64, dtype="float16", entropies=True, on_device=False, threads=0):
        """Records a compact trace (kvtrace-v1.md, "Compact traces"): at each layer's prefill the
        prompt's statistics are computed (by kvsim's C++ code, from q and k rounded to `dtype`, as
        the file stores them) and only the query rows that windows of up to `window` rows read
        are kept; write() must then use the same dtype. Equals `kvsim compact` of the full
        capture. entropies=False leaves out MEDA's entropies (a pass over all P² logits).
        on_device=True computes the statistics with torch where the model runs (a GPU), without
        moving the prompt's queries to the host (kvsim.capture.device_stats): equal to float32
        rounding, not bit for bit, and without entropies. threads: the host's threads for the
        statistics (0, the default: every core, as `kvsim compact`; the values do not depend on
        it)."""
        if dtype not in ("float16", "float32"):
            raise ValueError(f"capture: dtype '{dtype}': expected float16 or float32")
        if int(window) < 1:
            raise ValueError(f"capture: compact window {window}: must be at least 1")
        if on_device and entropies:
            raise ValueError("capture: statistics on the device leave out the entropies; pass "
                             "entropies=False")
        if int(threads) < 0:
            raise ValueError(f"capture: compact threads {threads}: 0 (every core) or more")
        self._compact = {"window": int(window), "dtype": dtype, "entropies": bool(entropies),
                         "on_device": bool(on_device), "threads": int(threads)}

    @contextlib.contextmanager
    def sample(self, name, *, modality, segment, media_id=None, token_ids=None, task=None,
               reference=None, position_ids=None):
        """Records the forward passes run inside the block as one sample. modality and segment
        (and the optional media_id, token_ids) cover every position, prompt and generated;
        positions with segment 2 are the generated ones (kvtrace v1). position_ids: the M-RoPE
        ids [3, T] (temporal, height, width) the model rotated q and k by, with mrope_section."""
        if self._current is not None:
            raise CaptureError("capture: samples cannot nest")
        meta = {"modality": np.asarray(modality, dtype=np.uint8),
                "segment": np.asarray(segment, dtype=np.uint8)}
        if media_id is not None:
            meta["media_id"] = np.asarray(media_id, dtype=np.int32)
        if token_ids is not None:
            meta["token_ids"] = np.asarray(token_ids, dtype=np.int32)
        if position_ids is not None:
            meta["position_ids"] = np.asarray(position_ids, dtype=np.int32)
        self._current = {"name": str(name), "meta": meta, "layers": {}, "task": task,
                         "reference": reference}
        try:
            yield self
            self.samples.append(self._finish(self._current))
        finally:
            self._current = None

    def set_token_ids(self, token_ids):
        """The token ids of every position of the sample being recorded, when they are known only
        after generating (kvsim.capture.hf)."""
        if self._current is None:
            raise CaptureError("capture: set_token_ids outside a sample")
        self._current["meta"]["token_ids"] = np.asarray(token_ids, dtype=np.int32)

    def set_position_ids(self, position_ids):
        """The M-RoPE ids [3, T] of every position of the sample being recorded, when they are
        known only after generating (kvsim.capture.hf)."""
        if self._current is None:
            raise CaptureError("capture: set_position_ids outside a sample")
        self._current["meta"]["position_ids"] = np.asarray(position_ids, dtype=np.int32)

    def attention(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                  **kwargs):
        layer = getattr(module, "layer_idx", None)
        if self._current is not None and layer is not None:
            self._record(int(layer), query, key, value, scaling)
        return self.inner(module, query, key, value, attention_mask, scaling=scaling,
                          dropout=dropout, **kwargs)

    def _record(self, layer, query, key, value, scaling):
        if query.shape[0] != 1:
            raise CaptureError(f"capture: batch size {query.shape[0]}; capture one prompt at a time")
        n = query.shape[2]
        shapes = (query.shape[1], key.shape[1], query.shape[3])
        if self.shapes is None:
            self.shapes = shapes
        elif shapes != self.shapes:
            raise CaptureError(f"capture: layer {layer} has (H, Hkv, d) = {shapes}, "
                               f"earlier layers {self.shapes}")
        scale = float(scaling) if scaling is not None else 1 / math.sqrt(query.shape[3])
        if self.scale is None:
            self.scale = scale
        elif not math.isclose(scale, self.scale, rel_tol=1e-6):
            raise CaptureError(f"capture: layer {layer} scales q·k by {scale}, others by "
                               f"{self.scale}")

        def rows(x, first=0):  # [1, heads, m, d] -> the last n rows from the first-th, as
            # float32 numpy [n - first, heads, d], sliced before they leave the device
            return x[0, :, x.shape[2] - n + first:, :].transpose(0, 1).detach().to(
                "cpu").float().numpy()

        parts = self._current["layers"].setdefault(layer, {"q": [], "k": [], "v": []})
        k = rows(key)
        if self._compact is not None and not parts["q"]:  # a compact recording's prefill
            stats = self._prompt_statistics(layer, n, query, key, rows, k, scale)
            parts["stats"] = stats
            self._current["compact"] = (stats["first_row"], stats["context_len"])
            q = rows(query, stats["first_row"])  # the kept rows only
        else:
            q = rows(query)
        parts["q"].append(q)
        parts["k"].append(k)
        parts["v"].append(rows(value))

    def _prompt_statistics(self, layer, n, query, key, rows, k, scale):
        """A compact recording's prefill of a layer: its stored statistics, computed where the
        model runs (on_device: kvsim.capture.device_stats), or by kvsim's C++ code from the prompt
        rows as the file stores them (rounded to its dtype). rows(x) gives the call's host rows,
        k = rows(key)."""
        meta = self._current["meta"]
        P = int(np.count_nonzero(meta["segment"] != 2))
        if n < P:
            raise CaptureError(f"capture: sample '{self._current['name']}', layer {layer}: the "
                               f"first call holds {n} of the prompt's {P} rows; a compact "
                               "capture needs the prefill in one call")
        dtype, window = self._compact["dtype"], self._compact["window"]
        if self._compact["on_device"]:
            return device_stats.prompt_statistics(query[0, :, -n:][:, :P], key[0, :, -n:][:, :P],
                                                   meta["modality"], scale, window=window,
                                                   dtype=dtype)
        from kvsim import prompt_statistics

        stored_q, stored_k = (x[:P].astype(dtype).astype(np.float32) for x in (rows(query), k))
        return prompt_statistics(stored_q, stored_k, meta["modality"][:P], scale=scale,
                                 entropies=self._compact["entropies"], window=window, dtype=dtype,
                                 threads=self._compact["threads"])

    def _finish(self, cur):
        name, meta, layers = cur["name"], cur["meta"], cur["layers"]
        if not layers:
            raise CaptureError(f"capture: sample '{name}': no attention call was recorded")
        L = max(layers) + 1
        missing = [l for l in range(L) if l not in layers]
        if missing:
            raise CaptureError(f"capture: sample '{name}': layers {missing} were never called")
        T = len(meta["segment"])
        tensors = {}
        first_row, context_len = cur.get("compact", (0, 0))
        for l in range(L):
            t = {k: np.concatenate(v) for k, v in layers[l].items() if k != "stats"}
            if t["q"].shape[0] + first_row != T:
                raise CaptureError(f"capture: sample '{name}', layer {l}: "
                                   f"{t['q'].shape[0] + first_row} positions recorded, metadata "
                                   f"covers {T}")
            if "stats" in layers[l]:
                t["stats"] = layers[l]["stats"]
            tensors[l] = t
        for key, arr in meta.items():
            if key == "position_ids":
                if arr.shape != (3, T):
                    raise CaptureError(f"capture: sample '{name}': position_ids has shape "
                                       f"{list(arr.shape)}, not [3, {T}] (temporal, height, "
                                       "width for every position)")
                if self.mrope_section is None:
                    raise CaptureError(f"capture: sample '{name}': M-RoPE position ids need the "
                                       "recorder's mrope_section (the rotary pairs per axis)")
            elif len(arr) != T:
                raise CaptureError(f"capture: sample '{name}': {key} has {len(arr)} entries, "
                                   f"segment {T}")
        generated = meta["segment"] == 2
        P = int(np.argmax(generated)) if generated.any() else T
        if generated[:P].any() or not generated[P:].all():
            raise CaptureError(f"capture: sample '{name}': generated positions (segment 2) must "
                               f"be the last ones")
        return {"name": name, "meta": meta, "prompt_len": P, "gen_len": T - P, "tensors": tensors,
                "task": cur["task"], "reference": cur["reference"],
                "compact_first_row": first_row, "compact_context_len": context_len}

    def write(self, path, model="", dtype="float16", progress=None, force=False):
        """Writes every finished sample to `path` (kvtrace v1); dtype float16 or float32. An
        existing trace at `path` is replaced only with force=True, a prompt file never
        (FileExistsError)."""
        import os

        import h5py

        from kvsim._kvsim import check_outputs

        check_outputs([(path, "path", "trace")], force=force)
        L = self._check_writable(dtype)
        show = progress if progress is not None else sys.stderr.isatty()
        total, done = len(self.samples) * L, 0
        with h5py.File(path + ".partial", "w") as f:
            self._write_file_attrs(f, model, L)
            for s in self.samples:
                for _ in self._write_sample(f, s, dtype):
                    done += 1
                    if show:
                        print(f"\rcapture: writing {done}/{total} layers", end="", file=sys.stderr)
        if show:
            print(file=sys.stderr)
        os.replace(path + ".partial", path)

    def _check_writable(self, dtype):
        """What write() refuses before it writes anything; returns the layers of every sample."""
        if dtype not in ("float16", "float32"):
            raise ValueError(f"capture: dtype '{dtype}': expected float16 or float32")
        if not self.samples:
            raise CaptureError("capture: no sample to write")
        if self._compact is not None and dtype != self._compact["dtype"]:
            raise CaptureError(f"capture: the compact recording's statistics are of "
                               f"{self._compact['dtype']} values; write it as that, not {dtype}")
        L = len(self.samples[0]["tensors"])
        for s in self.samples:
            if len(s["tensors"]) != L:
                raise CaptureError(f"capture: sample '{s['name']}' has {len(s['tensors'])} "
                                   f"layers, the first sample {L}")
        return L

    def _write_file_attrs(self, f, model, L):
        from kvsim._kvsim import COMPACT_TRACE_VERSION

        H, Hkv, d = self.shapes
        f.attrs["kvtrace_version"] = 1
        f.attrs["model"] = model
        f.attrs["num_layers"] = L
        f.attrs["num_heads"] = H
        f.attrs["num_kv_heads"] = Hkv
        f.attrs["head_dim"] = d
        f.attrs["scale"] = self.scale
        if self.rope_theta is not None:
            f.attrs["rope_theta"] = float(self.rope_theta)
        if self.mrope_section is not None:
            f.attrs["mrope_section"] = np.asarray(self.mrope_section, dtype=np.int64)
        if self._compact is not None:
            f.attrs["kvtrace_compact"] = COMPACT_TRACE_VERSION
            f.attrs["compact_window"] = self._compact["window"]
            f.attrs["compact_entropies"] = int(self._compact["entropies"])

    def _write_sample(self, f, s, dtype):
        """One sample's group; yields after each layer written (for the progress line)."""
        g = f.create_group(f"samples/{s['name']}")
        g.attrs["prompt_len"] = s["prompt_len"]
        g.attrs["gen_len"] = s["gen_len"]
        for key in ("task", "reference"):
            if s[key] is not None:
                g.attrs[key] = s[key]
        for key, arr in s["meta"].items():
            g[key] = arr
        if self._compact is not None:
            g.attrs["compact_first_row"] = s["compact_first_row"]
            g.attrs["compact_context_len"] = s["compact_context_len"]
        for l, t in s["tensors"].items():
            for key in ("q", "k", "v"):
                name = "q_rows" if key == "q" and self._compact is not None else key
                g[f"layers/{l}/{name}"] = t[key].astype(dtype)
            if "stats" in t:
                _write_stats(g, l, t["stats"])
            yield


def _write_stats(group, layer, stats):
    """A compact trace's stats/ datasets of one layer (kvtrace-v1.md, "Compact traces")."""
    for part in ("prompt", "context"):
        if part not in stats:
            continue
        for key, arr in stats[part].items():
            group[f"layers/{layer}/stats/{part}/{key}"] = np.asarray(arr, dtype=np.float32)
    if "entropies" in stats:
        group[f"layers/{layer}/stats/entropies"] = np.asarray(stats["entropies"], dtype=np.float64)


def greedy(step, prompt_ids, gen):
    """Prefill then `gen` decode steps with a full cache, feeding back the argmax each time.

    step(ids, cache) -> (logits, cache): ids a [1, n] LongTensor of the new tokens, cache None
    at the prefill; logits [1, n, vocab]. Returns the prompt followed by the gen tokens fed back
    (positions P..P+gen-1 of the trace), as a list of ints."""
    import torch

    ids = torch.as_tensor(prompt_ids, dtype=torch.long).reshape(1, -1)
    out = ids[0].tolist()
    with torch.no_grad():
        logits, cache = step(ids, None)
        for _ in range(gen):
            nxt = int(torch.argmax(logits[0, -1]))
            out.append(nxt)
            logits, cache = step(torch.tensor([[nxt]]), cache)
    return out
