"""Two built-in policies written again in Python, as examples of kvsim.Policy and as the test
that a Python policy runs inside the engine exactly as its C++ twin does (same decisions, same
numbers): `streamingllm` (policies/streamingllm.cpp) and `h2o` (policies/h2o.cpp)."""
import math

import numpy as np

from . import Policy, resolve_budget


class StreamingLLM(Policy):
    """Attention sinks + sliding window (Xiao et al. 2024, Sec. 3.2)."""

    def __init__(self, budget="20%", sinks=4):
        self.budget_text, self.sinks = budget, sinks

    def start(self, sample):
        self.budget = resolve_budget(str(self.budget_text), sample["prompt_len"])

    def capacity(self, layer, kv_head):
        return self.budget

    def _trim(self, cache):
        for g in range(cache.kv_heads):
            n = cache.size(g)
            if n > self.budget:
                keep = np.zeros(n, dtype=np.uint8)
                keep[: self.sinks] = 1
                keep[n - (self.budget - self.sinks):] = 1
                cache.keep_only(g, keep)

    def on_prefill(self, view, cache):
        self._trim(cache)

    def on_decode(self, view, att, cache):
        self._trim(cache)


class H2O(Policy):
    """Heavy hitters: cumulative attention received plus a recent window (Zhang et al. 2023)."""

    needs = {"prefill_column_sums": True}

    def __init__(self, budget="20%", recent="50%"):
        self.budget_text, self.recent_text = budget, recent

    def start(self, sample):
        P = sample["prompt_len"]
        self.budget = resolve_budget(str(self.budget_text), P)
        r = str(self.recent_text)
        self.recent = (math.floor(float(r[:-1]) / 100 * self.budget + 1e-9) if r.endswith("%")
                       else int(r))
        self.recent = min(self.recent, self.budget)

    def capacity(self, layer, kv_head):
        return self.budget

    def on_prefill(self, view, cache):
        P, group = view.prompt_len, view.group_size
        self.scores = np.zeros((cache.kv_heads, P))
        for g in range(cache.kv_heads):
            for r in range(group):  # float64 sums in the C++ order: query heads one by one
                self.scores[g, :P] += view.prefill_column_sums(g * group + r)
        self._trim(cache)

    def on_decode(self, view, att, cache):
        grow = view.visible_len - self.scores.shape[1]  # the positions that exist so far
        if grow > 0:
            self.scores = np.pad(self.scores, ((0, 0), (0, grow)))
        for g in range(cache.kv_heads):
            pos = cache.positions(g)
            probs = att.probs(g)
            for r in range(att.group):
                self.scores[g, pos] += probs[r]
        self._trim(cache)

    def _trim(self, cache):
        for g in range(cache.kv_heads):
            n = cache.size(g)
            if n <= self.budget:
                continue
            s = self.scores[g, cache.positions(g)]
            candidates = n - self.recent
            # The top budget - recent of the older entries by score, ties to the newer entry.
            order = np.lexsort((-np.arange(candidates), -s[:candidates]))
            keep = np.zeros(n, dtype=np.uint8)
            keep[order[: self.budget - self.recent]] = 1
            keep[candidates:] = 1
            cache.keep_only(g, keep)
