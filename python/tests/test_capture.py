"""kvsim.capture on a small PyTorch decoder written here (rotary embedding, GQA, a KV cache),
whose q/k/v this test computes again independently, in float64, from one full-sequence pass.

Run by ctest with Debian's python3 and python3-torch (no transformers needed)."""
import math
import os
import tempfile
import unittest

import h5py
import numpy as np
import torch

from kvsim import capture

VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS = 61, 32, 3, 4, 2
D = HIDDEN // HEADS


def rotate_half(x):
    a, b = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-b, a), dim=-1)


def rope(x, positions, base=10000.0):
    """x [B, heads, n, d]; the rotate-half convention of LLaMA."""
    inv = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = positions.to(torch.float64)[:, None] * inv[None, :]
    cos = torch.cat((ang.cos(), ang.cos()), -1).to(x.dtype)
    sin = torch.cat((ang.sin(), ang.sin()), -1).to(x.dtype)
    return x * cos + rotate_half(x) * sin


class Layer(torch.nn.Module):
    def __init__(self, idx):
        super().__init__()
        self.layer_idx = idx
        self.norm1 = torch.nn.LayerNorm(HIDDEN)
        self.q = torch.nn.Linear(HIDDEN, HEADS * D)
        self.k = torch.nn.Linear(HIDDEN, KV_HEADS * D)
        self.v = torch.nn.Linear(HIDDEN, KV_HEADS * D)
        self.o = torch.nn.Linear(HEADS * D, HIDDEN)
        self.norm2 = torch.nn.LayerNorm(HIDDEN)
        self.up = torch.nn.Linear(HIDDEN, 2 * HIDDEN)
        self.down = torch.nn.Linear(2 * HIDDEN, HIDDEN)


class TinyDecoder(torch.nn.Module):
    """Attention goes through self.attention_fn with transformers' AttentionInterface
    signature: the few lines that make an architecture capturable."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(7)
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
        self.layers = torch.nn.ModuleList(Layer(i) for i in range(LAYERS))
        self.head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
        self.vision = torch.nn.Linear(HIDDEN, HIDDEN)  # a stand-in vision tower's attention
        self.attention_fn = capture.eager_attention

    def step(self, ids, cache):
        start = 0 if cache is None else cache[0][0].shape[2]
        n = ids.shape[1]
        pos = torch.arange(start, start + n)
        x = self.embed(ids)
        # A call without layer_idx, as a vision tower's attention makes: never recorded.
        t = self.vision(x).view(1, n, 1, HIDDEN).transpose(1, 2)
        self.attention_fn(self.vision, t, t, t, None)
        new_cache = []
        mask = torch.full((n, start + n), float("-inf")).triu(start + 1)[None, None]
        for i, layer in enumerate(self.layers):
            h = layer.norm1(x)
            q = rope(layer.q(h).view(1, n, HEADS, D).transpose(1, 2), pos)
            k = rope(layer.k(h).view(1, n, KV_HEADS, D).transpose(1, 2), pos)
            v = layer.v(h).view(1, n, KV_HEADS, D).transpose(1, 2)
            if cache is not None:
                k = torch.cat((cache[i][0], k), dim=2)
                v = torch.cat((cache[i][1], v), dim=2)
            new_cache.append((k, v))
            out, _ = self.attention_fn(layer, q, k, v, mask, scaling=D ** -0.5)
            x = x + layer.o(out.reshape(1, n, HEADS * D))
            x = x + layer.down(torch.nn.functional.silu(layer.up(layer.norm2(x))))
        return self.head(x), new_cache


def reference_qkv(model, ids):
    """q (after RoPE), k, v of every layer for the whole sequence in one causal pass, float64,
    computed here without the model's step() or the recorder."""
    m = TinyDecoder()
    m.load_state_dict(model.state_dict())
    m = m.double()
    T = len(ids)
    x = m.embed(torch.tensor([ids]))
    pos = torch.arange(T)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    out = []
    with torch.no_grad():
        for layer in m.layers:
            h = layer.norm1(x)
            q = rope(layer.q(h).view(1, T, HEADS, D).transpose(1, 2), pos)
            k = rope(layer.k(h).view(1, T, KV_HEADS, D).transpose(1, 2), pos)
            v = layer.v(h).view(1, T, KV_HEADS, D).transpose(1, 2)
            out.append({"q": q[0].transpose(0, 1).numpy(), "k": k[0].transpose(0, 1).numpy(),
                        "v": v[0].transpose(0, 1).numpy()})
            kk = k.repeat_interleave(HEADS // KV_HEADS, 1)
            vv = v.repeat_interleave(HEADS // KV_HEADS, 1)
            s = (q @ kk.transpose(2, 3)) / math.sqrt(D)
            s = s.masked_fill(~causal, float("-inf"))
            a = torch.softmax(s, -1) @ vv
            x = x + layer.o(a.transpose(1, 2).reshape(1, T, HEADS * D))
            x = x + layer.down(torch.nn.functional.silu(layer.up(layer.norm2(x))))
    return out


def metadata(P, G, images=(2, 6)):
    modality = np.zeros(P + G, dtype=np.uint8)
    modality[images[0]:images[1]] = 1
    segment = np.array([0] * 2 + [1] * (P - 2) + [2] * G, dtype=np.uint8)
    media = np.where(modality == 1, 0, -1).astype(np.int32)
    return modality, segment, media


class CaptureTest(unittest.TestCase):
    def kvsim_module(self, needed):
        """kvsim, or the test skipped when its C++ module (`needed` from it) is not built."""
        try:
            import kvsim
            getattr(kvsim, needed)
        except (ImportError, AttributeError):
            self.skipTest("the kvsim C++ module is not built")
        return kvsim

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.model = TinyDecoder().eval()

    def tearDown(self):
        self.dir.cleanup()

    def run_capture(self, prompts, gen):
        rec = capture.Recorder()
        self.model.attention_fn = rec.attention
        tokens = []
        for i, prompt in enumerate(prompts):
            modality, segment, media = metadata(len(prompt), gen)
            with rec.sample(f"{i:06d}", modality=modality, segment=segment, media_id=media):
                ids = capture.greedy(self.model.step, prompt, gen)
            tokens.append(ids)
        return rec, tokens

    def test_recorded_tensors_equal_an_independent_full_pass(self):
        prompts = [[3, 14, 15, 9, 26, 5, 35, 8, 9], [7, 1, 2, 3, 4, 5, 6]]
        rec, tokens = self.run_capture(prompts, gen=5)
        path = os.path.join(self.dir.name, "t.h5")
        rec.write(path, model="tiny", dtype="float32", progress=False)
        with h5py.File(path, "r") as f:
            self.assertEqual(f.attrs["kvtrace_version"], 1)
            self.assertEqual((f.attrs["num_layers"], f.attrs["num_heads"],
                              f.attrs["num_kv_heads"], f.attrs["head_dim"]),
                             (LAYERS, HEADS, KV_HEADS, D))
            self.assertAlmostEqual(f.attrs["scale"], D ** -0.5)
            self.assertEqual(sorted(f["samples"]), ["000000", "000001"])
            for i, ids in enumerate(tokens):
                g = f[f"samples/{i:06d}"]
                P = len(prompts[i])
                self.assertEqual((g.attrs["prompt_len"], g.attrs["gen_len"]), (P, 5))
                ref = reference_qkv(self.model, ids)
                for l in range(LAYERS):
                    for key in ("q", "k", "v"):
                        got = g[f"layers/{l}/{key}"][()]
                        self.assertEqual(got.shape, ref[l][key].shape)
                        np.testing.assert_allclose(got, ref[l][key], rtol=1e-4, atol=1e-5,
                                                   err_msg=f"sample {i} layer {l} {key}")
                np.testing.assert_array_equal(g["media_id"][()], metadata(P, 5)[2])

    def test_kvsim_reads_and_replays_the_capture(self):
        kvsim = self.kvsim_module("Trace")
        rec, tokens = self.run_capture([[3, 14, 15, 9, 26, 5, 35, 8, 9, 11, 12]], gen=4)
        path = os.path.join(self.dir.name, "t16.h5")
        rec.write(path, model="tiny", dtype="float16", progress=False)
        t = kvsim.Trace(path)
        s = t.sample("000000")
        self.assertEqual((s.prompt_len, s.gen_len, s.dtype), (11, 4, "float16"))
        layer = s.layer(1)
        ref = reference_qkv(self.model, tokens[0])[1]
        np.testing.assert_allclose(layer["k"], ref["k"], rtol=2e-3, atol=2e-3)
        res = kvsim.replay(path, {"full": None, "h2o": {"budget": "6"}})
        full = res["policy"] == "full"
        np.testing.assert_allclose(res["mass_recall"][full], 1, rtol=1e-6)
        np.testing.assert_allclose(res["output_rel_error"][full], 0, atol=1e-6)
        self.assertTrue(np.all(res["mass_recall"][~full] <= 1))

    def test_compact_capture_equals_compacting_the_full_capture(self):
        kvsim = self.kvsim_module("compact_trace")
        prompt = [(7 * i + 3) % VOCAB for i in range(150)]
        modality, segment, media = metadata(150, 5, images=(2, 120))  # a 30-token question
        full_path, direct_path, converted_path = (
            os.path.join(self.dir.name, name) for name in ("f.h5", "d.h5", "c.h5"))
        for path, compact in ((full_path, False), (direct_path, True)):
            rec = capture.Recorder()
            if compact:
                rec.compact(window=32, dtype="float16")
            self.model.attention_fn = rec.attention
            with rec.sample("000000", modality=modality, segment=segment, media_id=media):
                capture.greedy(self.model.step, prompt, 5)
            rec.write(path, model="tiny", dtype="float16", progress=False)
        kvsim.compact_trace(full_path, converted_path, window=32)
        direct, converted = kvsim.Trace(direct_path), kvsim.Trace(converted_path)
        self.assertEqual(direct.compact_window, 32)
        with h5py.File(direct_path) as d, h5py.File(converted_path) as c:
            g, h = d["samples/000000"], c["samples/000000"]
            # context 120; the 64-row block holding row 120 - 32 = 88 starts at 64
            self.assertEqual((g.attrs["compact_first_row"], g.attrs["compact_context_len"]),
                             (64, 120))
            for l in range(LAYERS):
                for name in ("q_rows", "k", "v", "stats/prompt/column_sums",
                             "stats/prompt/column_sums_rounded", "stats/prompt/text_column_sums",
                             "stats/context/column_sums", "stats/context/text_column_max",
                             "stats/entropies"):
                    np.testing.assert_array_equal(g[f"layers/{l}/{name}"][()],
                                                  h[f"layers/{l}/{name}"][()],
                                                  err_msg=f"layer {l} {name}")
        policies = {"h2o": {"budget": "20"}, "snapkv": {"budget": "20"}, "knorm:kvpress": {"budget": "20"},
                    "lookm:released": {"budget": "20"}, "meda": None}
        a, b = kvsim.replay(direct_path, policies), kvsim.replay(converted_path, policies)
        for column in ("mass_recall", "output_rel_error"):
            np.testing.assert_array_equal(a[column], b[column])
        with self.assertRaisesRegex(capture.CaptureError, "write it as that, not float32"):
            rec.write(os.path.join(self.dir.name, "x.h5"), dtype="float32")

    def test_host_statistics_do_not_depend_on_the_thread_count(self):
        kvsim = self.kvsim_module("prompt_statistics")
        rng = np.random.default_rng(5)
        P, H, Hkv, d = 300, 6, 2, 16  # GQA, more heads than threads; a 40-token question
        modality = np.zeros(P, np.uint8)
        modality[20:260] = 1
        q = rng.standard_normal((P, H, d)).astype(np.float16).astype(np.float32)
        k = rng.standard_normal((P, Hkv, d)).astype(np.float16).astype(np.float32)
        one, two, three = (kvsim.prompt_statistics(q, k, modality, scale=0.4, threads=n)
                           for n in (1, 2, 3))
        self.assertEqual(one["context_len"], 260)
        for other in (two, three):
            np.testing.assert_array_equal(one["entropies"], other["entropies"])
            for part in ("prompt", "context"):
                for name, want in one[part].items():
                    np.testing.assert_array_equal(other[part][name], want, err_msg=f"{part} {name}")
        with self.assertRaisesRegex(ValueError, "compact threads -1"):
            capture.Recorder().compact(threads=-1)

    def test_device_statistics_equal_the_host_ones_to_float32_rounding(self):
        kvsim = self.kvsim_module("prompt_statistics")
        from kvsim.capture import device_stats

        rng = np.random.default_rng(3)
        P, H, Hkv, d = 200, 8, 2, 16  # GQA; images 10..149, then a 30-token question... and
        modality = np.zeros(P, np.uint8)  # a video stretch, so the question is the last 30
        modality[10:150] = 1
        modality[155:170] = 2
        q = rng.standard_normal((P, H, d)).astype(np.float32)
        k = rng.standard_normal((P, Hkv, d)).astype(np.float32)
        for dtype in ("float16", "float32"):
            stored = [x.astype(dtype).astype(np.float32) for x in (q, k)]
            ref = kvsim.prompt_statistics(*stored, modality, scale=0.3, entropies=False,
                                          window=40, dtype=dtype)
            for block in (7, 64, 512):  # row blocks straddling the context's end, or none
                got = device_stats.prompt_statistics(
                    torch.from_numpy(q).transpose(0, 1), torch.from_numpy(k).transpose(0, 1),
                    modality, 0.3, window=40, dtype=dtype, block_rows=block)
                self.assertEqual((got["first_row"], got["context_len"]),
                                 (ref["first_row"], ref["context_len"]))
                self.assertEqual((got["first_row"], got["context_len"]), (128, 170))
                for part in ("prompt", "context"):
                    for name, want in ref[part].items():
                        # float32 sums in another order; a probability that lands on a float16
                        # rounding boundary can round the other way in the rounded sums
                        np.testing.assert_allclose(got[part][name], want, rtol=1e-4, atol=1e-6,
                                                   err_msg=f"{dtype} {part} {name} {block}")

    def test_compact_capture_with_device_statistics(self):
        kvsim = self.kvsim_module("compact_trace")
        prompt = [(5 * i + 1) % VOCAB for i in range(150)]
        modality, segment, media = metadata(150, 4, images=(2, 120))
        paths = {}
        for mode in ("host", "device"):
            rec = capture.Recorder()
            if mode == "host":
                rec.compact(window=32, dtype="float16", entropies=False)
            else:
                rec.compact(window=32, dtype="float16", entropies=False, on_device=True)
            self.model.attention_fn = rec.attention
            with rec.sample("000000", modality=modality, segment=segment, media_id=media):
                capture.greedy(self.model.step, prompt, 4)
            paths[mode] = os.path.join(self.dir.name, f"{mode}.h5")
            rec.write(paths[mode], model="tiny", dtype="float16", progress=False)
        with h5py.File(paths["host"]) as a, h5py.File(paths["device"]) as b:
            self.assertEqual(b.attrs["compact_entropies"], 0)
            g, h = a["samples/000000"], b["samples/000000"]
            self.assertEqual(h.attrs["compact_first_row"], 64)
            for l in range(LAYERS):
                for name in ("q_rows", "k", "v"):
                    np.testing.assert_array_equal(g[f"layers/{l}/{name}"][()],
                                                  h[f"layers/{l}/{name}"][()])
                for part in ("prompt", "context"):
                    for name in ("column_sums", "column_sums_rounded", "text_column_sums",
                                 "text_column_max"):
                        key = f"layers/{l}/stats/{part}/{name}"
                        np.testing.assert_allclose(h[key][()], g[key][()], rtol=1e-4, atol=1e-6)
        res = kvsim.replay(paths["device"], {"h2o": {"budget": "20"}, "snapkv": {"budget": "20"}})
        self.assertEqual(set(res["policy"]), {"h2o", "snapkv"})
        self.assertTrue(np.all(np.isfinite(res["mass_recall"])))
        with self.assertRaisesRegex(ValueError, "entropies=False"):
            capture.Recorder().compact(on_device=True)

    def test_errors_name_the_sample(self):
        rec = capture.Recorder()
        self.model.attention_fn = rec.attention
        modality, segment, media = metadata(6, 3)
        with self.assertRaisesRegex(capture.CaptureError, "sample 'short'.*positions recorded"):
            with rec.sample("short", modality=modality, segment=segment):
                capture.greedy(self.model.step, [1, 2, 3, 4, 5, 6], gen=2)  # one step short
        with self.assertRaisesRegex(capture.CaptureError, "no attention call"):
            with rec.sample("none", modality=modality, segment=segment):
                pass
        bad = segment.copy()
        bad[1] = 2
        with self.assertRaisesRegex(capture.CaptureError, "must be the last"):
            with rec.sample("order", modality=modality, segment=bad):
                capture.greedy(self.model.step, [1, 2, 3, 4, 5, 6], gen=3)
        with self.assertRaisesRegex(capture.CaptureError, "no sample"):
            rec.write(os.path.join(self.dir.name, "x.h5"))
        ids = np.tile(np.arange(9), (3, 1))
        with self.assertRaisesRegex(capture.CaptureError, "sample 'ids'.*need the recorder's "
                                    "mrope_section"):
            with rec.sample("ids", modality=modality, segment=segment, position_ids=ids):
                capture.greedy(self.model.step, [1, 2, 3, 4, 5, 6], gen=3)
        rec.mrope_section = [1, 1, 2]
        with self.assertRaisesRegex(capture.CaptureError, r"position_ids has shape \[3, 8\], "
                                    r"not \[3, 9\]"):
            with rec.sample("ids", modality=modality, segment=segment, position_ids=ids[:, :8]):
                capture.greedy(self.model.step, [1, 2, 3, 4, 5, 6], gen=3)



class CommandLine(unittest.TestCase):
    def test_a_missing_dependency_is_named(self):
        # Debian has torch but not transformers: the message names transformers alone.
        import importlib.util
        import subprocess
        import sys

        if importlib.util.find_spec("transformers") is not None:
            self.skipTest("transformers is installed here")
        r = subprocess.run([sys.executable, "-m", "kvsim.capture", "--model", "m", "--prompts",
                            "p.jsonl", "--out", "t.h5"], capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertEqual(r.stderr.strip(),
                         f"python -m kvsim.capture needs transformers, which this interpreter "
                         f"({sys.executable}) lacks; neither torch nor transformers is a "
                         f"dependency of kvsim itself")

if __name__ == "__main__":
    unittest.main()
