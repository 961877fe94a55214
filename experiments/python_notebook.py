# %% [markdown]
# # kvsim from Python, end to end
# A notebook as a plain script (cells marked `# %%`; run it whole with
# `PYTHONPATH=build/python python3 experiments/python_notebook.py [OUT_DIR]`, CI does): capture a
# trace from a small PyTorch decoder, replay it through three built-in policies and a policy
# written in Python, and draw a figure.

# %%
import math
import os
import sys
import tempfile

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch

import kvsim
from kvsim import capture
from kvsim.python_policies import H2O

out_dir = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="kvsim_notebook_")
os.makedirs(out_dir, exist_ok=True)

# %% [markdown]
# ## A model whose attention kvsim can see
# Any architecture becomes capturable by routing its attention through one function with
# transformers' AttentionInterface signature: (module, query, key, value, mask, scaling=...),
# query after the rotary embedding. transformers' own models already do.

# %%
VOCAB, HIDDEN, HEADS, KV_HEADS, LAYERS = 97, 64, 8, 2, 4
D = HIDDEN // HEADS


def rope(x, pos):
    inv = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float32) / D)
    ang = pos[:, None].float() * inv[None]
    cos, sin = torch.cat((ang.cos(), ang.cos()), -1), torch.cat((ang.sin(), ang.sin()), -1)
    half = torch.cat((-x[..., D // 2:], x[..., : D // 2]), -1)
    return x * cos + half * sin


class Block(torch.nn.Module):
    def __init__(self, idx):
        super().__init__()
        self.layer_idx = idx
        self.qkv = torch.nn.Linear(HIDDEN, (HEADS + 2 * KV_HEADS) * D)
        self.o = torch.nn.Linear(HEADS * D, HIDDEN)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(HIDDEN, 4 * HIDDEN), torch.nn.GELU(),
                                       torch.nn.Linear(4 * HIDDEN, HIDDEN))
        self.n1, self.n2 = torch.nn.LayerNorm(HIDDEN), torch.nn.LayerNorm(HIDDEN)


class Decoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
        self.blocks = torch.nn.ModuleList(Block(i) for i in range(LAYERS))
        self.head = torch.nn.Linear(HIDDEN, VOCAB)
        self.attention_fn = capture.eager_attention

    def step(self, ids, cache):
        start = 0 if cache is None else cache[0][0].shape[2]
        n = ids.shape[1]
        pos = torch.arange(start, start + n)
        mask = torch.full((n, start + n), float("-inf")).triu(start + 1)[None, None]
        x, new = self.embed(ids), []
        for i, b in enumerate(self.blocks):
            q, k, v = b.qkv(b.n1(x)).split([HEADS * D, KV_HEADS * D, KV_HEADS * D], -1)
            q = rope(q.view(1, n, HEADS, D).transpose(1, 2), pos)
            k = rope(k.view(1, n, KV_HEADS, D).transpose(1, 2), pos)
            v = v.view(1, n, KV_HEADS, D).transpose(1, 2)
            if cache is not None:
                k, v = torch.cat((cache[i][0], k), 2), torch.cat((cache[i][1], v), 2)
            new.append((k, v))
            a, _ = self.attention_fn(b, q, k, v, mask, scaling=D ** -0.5)
            x = x + b.o(a.reshape(1, n, HEADS * D))
            x = x + b.mlp(b.n2(x))
        return self.head(x), new


model = Decoder().eval()

# %% [markdown]
# ## Capture: two prompts of 8 "system", 48 "image" and 16 "user" tokens, 24 generated

# %%
rec = capture.Recorder()
model.attention_fn = rec.attention
rng = np.random.default_rng(0)
P, G = 72, 24
for i in range(2):
    prompt = rng.integers(0, VOCAB, P).tolist()
    modality = np.r_[np.zeros(8), np.ones(48), np.zeros(16 + G)].astype(np.uint8)
    segment = np.r_[np.zeros(8), np.ones(64), np.full(G, 2)].astype(np.uint8)
    with rec.sample(f"{i:06d}", modality=modality, segment=segment,
                    media_id=np.where(modality == 1, 0, -1)):
        ids = capture.greedy(model.step, prompt, G)
trace = os.path.join(out_dir, "tiny_trace.h5")
rec.write(trace, model="notebook-decoder", dtype="float16", force=True)  # remade on every run
t = kvsim.Trace(trace)
print(t, t.samples(), t.sample("000000").layer(2)["q"].shape)

# %% [markdown]
# ## Replay: three built-in policies and H2O written in Python, at a 25% budget

# %%
res, decisions = kvsim.replay(
    trace, {"streamingllm": {"sinks": 2}, "h2o": {}, "snapkv": {"window": 8}, "h2o.py": H2O("25%")},
    budget="25%", decisions=True)
labels = list(dict.fromkeys(res["policy"]))
for label in labels:
    rows = res["policy"] == label
    print(f"{label:14s} recall {res['mass_recall'][rows].mean():.4f}  "
          f"output error {res['output_value_error'][rows].mean():.4f}  "
          f"evictions {(decisions['policy'] == label).sum()}")
h2o, py = res["policy"] == "h2o", res["policy"] == "h2o.py"
assert np.array_equal(res["mass_recall"][h2o], res["mass_recall"][py]), "twins disagree"

# %% [markdown]
# ## A figure: mass recall by layer

# %%
fig, ax = plt.subplots(figsize=(6, 3.5))
for label in labels:
    rows = res["policy"] == label
    layers = np.arange(LAYERS)
    ax.plot(layers, [res["mass_recall"][rows & (res["layer"] == l)].mean() for l in layers],
            marker="o", label=label)
ax.set(xlabel="layer", ylabel="attention mass kept", title="Replay of a captured trace, 25%")
ax.legend()
for ext in ("png", "pdf"):
    fig.savefig(os.path.join(out_dir, f"recall_by_layer.{ext}"), dpi=150, bbox_inches="tight")
print("wrote", os.path.join(out_dir, "recall_by_layer.png"))
