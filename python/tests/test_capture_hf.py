"""kvsim.capture.hf without transformers: a stand-in `transformers` module with the two names the
code uses (AttentionInterface, AttentionMaskInterface) and a small Qwen2-VL-shaped PyTorch model
that follows transformers' calling convention: every attention module looks its function up as
ALL_ATTENTION_FUNCTIONS[config._attn_implementation] and calls it as fn(module, q, k, v, mask,
scaling=..., dropout=...), q and k after the rotary embedding, k and v the whole cache; decoder
attention modules carry layer_idx, the vision tower's do not. The recorded q/k/v are compared
with the same model's tensors computed independently in float64 from one full-sequence pass, the
token ids with the model's own greedy generate, and the media ids with the image grid."""
import math
import os
import sys
import tempfile
import types
import unittest

import numpy as np
import torch

VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS = 50, 32, 2, 4, 2
D = HIDDEN // HEADS
IMAGE_TOKEN, VIDEO_TOKEN, MERGE = 48, 49, 2
GRID = 2  # the processor's 4 x 4 patches, merged 2 x 2: a 2 x 2 grid of image tokens


class Registry(dict):
    """transformers' GeneralInterface in miniature: register(name, fn) and lookup by name."""

    _global_mapping = {"sdpa": "sdpa-mask"}

    def register(self, name, fn):
        self[name] = fn


def install_fake_transformers():
    fake = types.ModuleType("transformers")
    fake.AttentionInterface = Registry()
    fake.AttentionMaskInterface = Registry()
    sys.modules["transformers"] = fake
    return fake


MROPE_SECTION = [2, 1, 1]  # D / 2 = 4 rotary frequencies: temporal, height, width


def rope(x, positions):
    """M-RoPE as Qwen2-VL applies it: positions [3, n] (temporal, height, width); frequencies
    split by MROPE_SECTION over the three axes."""
    half = x.shape[-1] // 2
    inv = 10000.0 ** (-torch.arange(0, x.shape[-1], 2, dtype=torch.float64) / x.shape[-1])
    axis = torch.repeat_interleave(torch.arange(3), torch.tensor(MROPE_SECTION))
    ang = positions.to(torch.float64)[axis].T * inv[None, :]  # [n, half]
    cos = torch.cat((ang.cos(), ang.cos()), -1).to(x.dtype)
    sin = torch.cat((ang.sin(), ang.sin()), -1).to(x.dtype)
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


def rope_index(ids):
    """get_rope_index in miniature: [3, P] ids; text counts on from the previous largest id + 1,
    an image's merged grid (GRID x GRID tokens here) shares one temporal id and takes row and
    column offsets."""
    pos, nxt, i = [], 0, 0
    while i < len(ids):
        if ids[i] == IMAGE_TOKEN:
            for r in range(GRID):
                for c in range(GRID):
                    pos.append((nxt, nxt + r, nxt + c))
            nxt += GRID
            i += GRID * GRID
        else:
            pos.append((nxt, nxt, nxt))
            nxt += 1
            i += 1
    return torch.tensor(pos).T


class Config:
    def __init__(self):
        self._attn_implementation = "eager"
        self.image_token_id = IMAGE_TOKEN
        self.video_token_id = VIDEO_TOKEN
        self.vision_config = types.SimpleNamespace(spatial_merge_size=MERGE)
        self._name_or_path = "tiny-qwen2-vl-shaped"
        self.rope_theta = 10000.0  # as rope() rotates
        self.rope_scaling = {"type": "mrope", "mrope_section": MROPE_SECTION}


class Attention(torch.nn.Module):
    def __init__(self, layer_idx, causal=True):
        super().__init__()
        if layer_idx is not None:
            self.layer_idx = layer_idx
        self.is_causal = causal
        self.q = torch.nn.Linear(HIDDEN, HEADS * D)
        self.k = torch.nn.Linear(HIDDEN, KV_HEADS * D)
        self.v = torch.nn.Linear(HIDDEN, KV_HEADS * D)
        self.o = torch.nn.Linear(HEADS * D, HIDDEN)


def eager(module, q, k, v, mask, scaling, dropout=0.0, **kwargs):
    kk = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
    vv = v.repeat_interleave(q.shape[1] // v.shape[1], 1)
    s = q @ kk.transpose(2, 3) * scaling
    if mask is not None:
        s = s + mask
    return (torch.softmax(s, -1) @ vv).transpose(1, 2), None


def attention(config, module, q, k, v, mask):
    name = config._attn_implementation
    fn = eager if name == "eager" else sys.modules["transformers"].AttentionInterface[name]
    return fn(module, q, k, v, mask, scaling=D ** -0.5, dropout=0.0)[0]


class TinyText(torch.nn.Module):
    """The language model: called with inputs_embeds and M-RoPE position_ids [3, 1, n], as
    Qwen2-VL's text model is."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.layers = torch.nn.ModuleList(Attention(i) for i in range(LAYERS))
        self.mlps = torch.nn.ModuleList(torch.nn.Linear(HIDDEN, HIDDEN) for _ in range(LAYERS))
        self.head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, input_ids=None, inputs_embeds=None, position_ids=None, cache=None,
                causal_mask=None):
        x, n = inputs_embeds, inputs_embeds.shape[1]
        pos = position_ids[:, 0, :]
        new = []
        for i, (a, mlp) in enumerate(zip(self.layers, self.mlps)):
            q = rope(a.q(x).view(1, n, HEADS, D).transpose(1, 2), pos)
            k = rope(a.k(x).view(1, n, KV_HEADS, D).transpose(1, 2), pos)
            v = a.v(x).view(1, n, KV_HEADS, D).transpose(1, 2)
            if cache is not None:
                k, v = torch.cat((cache[i][0], k), 2), torch.cat((cache[i][1], v), 2)
            new.append((k, v))
            x = x + a.o(attention(self.config, a, q, k, v, causal_mask).reshape(1, n, HEADS * D))
            x = x + torch.tanh(mlp(x))
        return self.head(x), new


class TinyVL(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.config = Config()
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
        self.patch = torch.nn.Linear(4, HIDDEN)
        self.vision_attn = Attention(None, causal=False)
        # transformers >= 4.52 keeps the text model at model.language_model
        self.model = torch.nn.Module()
        self.model.language_model = TinyText(self.config)

    def attention(self, module, q, k, v, mask):
        return attention(self.config, module, q, k, v, mask)

    def embed_tokens(self, ids, pixel_values):
        x = self.embed(ids.clamp(max=VOCAB - 1))
        if pixel_values is not None:  # a vision tower: bidirectional attention, no layer_idx
            p = self.patch(pixel_values)[None]  # [1, patches, HIDDEN]
            a = self.vision_attn
            n = p.shape[1]
            q = a.q(p).view(1, n, HEADS, D).transpose(1, 2)
            k = a.k(p).view(1, n, KV_HEADS, D).transpose(1, 2)
            v = a.v(p).view(1, n, KV_HEADS, D).transpose(1, 2)
            p = a.o(self.attention(a, q, k, v, None).reshape(1, n, HEADS * D))
            merged = p.view(1, n // (MERGE * MERGE), MERGE * MERGE, HIDDEN).mean(2)
            x = x.clone()
            x[ids == IMAGE_TOKEN] = merged[0]
        return x

    def set_attn_implementation(self, name):
        self.config._attn_implementation = name

    def generate(self, input_ids, pixel_values=None, image_grid_thw=None, max_new_tokens=1,
                 min_new_tokens=0, do_sample=False, num_beams=1, use_cache=True):
        assert not do_sample and num_beams == 1 and use_cache and min_new_tokens == max_new_tokens
        ids = input_ids
        P = ids.shape[1]
        lm = self.model.language_model
        mask = torch.full((P, P), float("-inf")).triu(1)[None, None]
        pos = rope_index(ids[0].tolist())
        delta = int(pos.max()) + 1 - P  # transformers' rope_deltas
        logits, cache = lm(input_ids=None, inputs_embeds=self.embed_tokens(ids, pixel_values),
                           position_ids=pos[:, None, :], cache=None, causal_mask=mask)
        out = ids[0].tolist()
        for _ in range(max_new_tokens):
            nxt = int(torch.argmax(logits[0, -1]))
            out.append(nxt)
            if len(out) == P + max_new_tokens:
                break
            step = torch.full((3, 1, 1), len(out) - 1 + delta)
            logits, cache = lm(input_ids=None, inputs_embeds=self.embed(torch.tensor([[nxt]])),
                               position_ids=step, cache=cache)
        return torch.tensor([out])


class Processor:
    """A processor's output for one prompt: token ids with the image's merged patches, pixel
    values, image_grid_thw."""

    def __call__(self, text, images=None, return_tensors="pt"):
        ids = [1, 2, 3]
        out = {}
        if images:
            t, h, w = 1, 4, 4  # 16 patches -> 4 image tokens after a 2x2 merge
            ids += [IMAGE_TOKEN] * (t * h * w // (MERGE * MERGE))
            torch.manual_seed(11)
            out["pixel_values"] = torch.randn(t * h * w, 4)
            out["image_grid_thw"] = torch.tensor([[t, h, w]])
        ids += [5 + (ord(c) % 40) for c in text]
        out["input_ids"] = torch.tensor([ids])
        return out

    @staticmethod
    def tokenizer(text, add_special_tokens=True):
        """The processor's tokenizer: spells text alone, as the processor spells its text part."""
        assert not add_special_tokens
        return {"input_ids": [5 + (ord(c) % 40) for c in text]}


def reference_qkv(model, ids, pixel_values, P):
    """q (after RoPE), k, v of every decoder layer for the whole sequence, one causal pass in
    float64, without the attention interface or the recorder."""
    m = TinyVL()
    m.load_state_dict(model.state_dict())
    m = m.double()
    m.config._attn_implementation = "eager"
    T = len(ids)
    with torch.no_grad():
        x = m.embed_tokens(torch.tensor([ids]), pixel_values.double())
        prompt = rope_index(ids[:P])
        nxt = int(prompt.max()) + 1
        pos = torch.cat((prompt, torch.arange(nxt, nxt + T - P).expand(3, -1)), 1)
        mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)[None, None]
        out = []
        lm = m.model.language_model
        for a, mlp in zip(lm.layers, lm.mlps):
            q = rope(a.q(x).view(1, T, HEADS, D).transpose(1, 2), pos)
            k = rope(a.k(x).view(1, T, KV_HEADS, D).transpose(1, 2), pos)
            v = a.v(x).view(1, T, KV_HEADS, D).transpose(1, 2)
            out.append({name: t[0].transpose(0, 1).numpy() for name, t in
                        (("q", q), ("k", k), ("v", v))})
            x = x + a.o(eager(a, q, k, v, mask, D ** -0.5)[0].reshape(1, T, HEADS * D))
            x = x + torch.tanh(mlp(x))
    return out


class CaptureHF(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.saved = sys.modules.get("transformers")
        cls.fake = install_fake_transformers()

    @classmethod
    def tearDownClass(cls):
        if cls.saved is None:
            sys.modules.pop("transformers", None)
        else:
            sys.modules["transformers"] = cls.saved

    def test_capture_records_the_decoder_as_the_model_computes_it(self):
        import h5py

        from kvsim.capture import hf

        model = TinyVL()
        processor = Processor()
        out = os.path.join(tempfile.mkdtemp(), "hf.h5")
        G = 6
        hf.capture_pretrained(model, processor, [{"name": "a", "text": "a cat", "images": ["x"]},
                                                 {"name": "b", "text": "hello there"}], out, gen=G,
                              dtype="float32")
        self.assertEqual(self.fake.AttentionInterface, {"kvsim_capture": self.fake.AttentionInterface
                                                        ["kvsim_capture"]})
        self.assertEqual(self.fake.AttentionMaskInterface["kvsim_capture"], "sdpa-mask")
        self.assertEqual(model.config._attn_implementation, "kvsim_capture")
        inputs = processor("a cat", images=["x"])
        P = inputs["input_ids"].shape[1]
        # what generate gives, with the model's own attention
        plain = TinyVL()
        plain.load_state_dict(model.state_dict())
        expected = plain.generate(inputs["input_ids"], inputs["pixel_values"],
                                  max_new_tokens=G + 1, min_new_tokens=G + 1)[0].tolist()
        ref = reference_qkv(model, expected[: P + G], inputs["pixel_values"], P)
        with h5py.File(out) as f:
            g = f["samples/a"]
            self.assertEqual(g.attrs["prompt_len"], P)
            self.assertEqual(g.attrs["gen_len"], G)
            self.assertEqual(list(g["token_ids"][()]), expected[: P + G])
            self.assertEqual(sorted(g["layers"]), [str(l) for l in range(LAYERS)])  # no vision
            modality = g["modality"][()]
            self.assertEqual(list(np.flatnonzero(modality == 1)), [3, 4, 5, 6])
            self.assertEqual(list(g["media_id"][()][:8]), [-1, -1, -1, 0, 0, 0, 0, -1])
            self.assertEqual(list(g["segment"][()]), [1] * P + [2] * G)
            for l in range(LAYERS):
                for name in ("q", "k", "v"):
                    np.testing.assert_allclose(g[f"layers/{l}/{name}"][()], ref[l][name],
                                               rtol=1e-4, atol=1e-5, err_msg=f"{l} {name}")
            self.assertAlmostEqual(f.attrs["scale"], D ** -0.5)
            # the rotation the recorded q and k carry: M-RoPE ids of every position, the prompt's
            # from get_rope_index, the generated ones one past its largest id on all axes
            self.assertEqual(f.attrs["rope_theta"], 10000.0)
            self.assertEqual(list(f.attrs["mrope_section"]), MROPE_SECTION)
            prompt = rope_index(expected[:P]).numpy()
            nxt = int(prompt.max()) + 1
            np.testing.assert_array_equal(
                g["position_ids"][()],
                np.concatenate([prompt, np.tile(np.arange(nxt, nxt + G), (3, 1))], 1))
            self.assertEqual(f["samples/b"].attrs["gen_len"], G)
            self.assertEqual(int((f["samples/b/modality"][()] != 0).sum()), 0)
        # kvsim reads the ids, and expected_attention undoes them
        import kvsim
        t = kvsim.Trace(out)
        self.assertEqual(t.mrope_section, MROPE_SECTION)
        self.assertEqual(t.sample("a").position_ids.shape, (3, P + G))
        rows = kvsim.replay(out, ["expected_attention"], budget="50%")
        self.assertGreater(len(rows), 0)

    def test_prompts_out_holds_what_the_language_model_received(self):
        import h5py

        from kvsim.capture import hf

        model = TinyVL()
        processor = Processor()
        d = tempfile.mkdtemp()
        trace, prompts = os.path.join(d, "t.h5"), os.path.join(d, "p.h5")
        hf.capture_pretrained(model, processor, [{"name": "a", "text": "a cat", "images": ["x"],
                                                  "answer": ["cat", "a cat"]},
                                                 {"name": "b", "text": "hello"}], trace, gen=3,
                              dtype="float32", prompts_out=prompts, reference_field="answer")
        self.assertFalse("forward" in vars(model.model.language_model))  # the wrapper is gone
        inputs = processor("a cat", images=["x"])
        ids = inputs["input_ids"][0].tolist()
        with torch.no_grad():
            embeds = model.embed_tokens(inputs["input_ids"], inputs["pixel_values"])[0].numpy()
        with h5py.File(prompts) as f:
            g = f["samples/a"]
            self.assertEqual(list(g["token_ids"][()]), ids)
            image = np.flatnonzero(np.asarray(ids) == IMAGE_TOKEN)
            self.assertEqual(list(np.flatnonzero(g["modality"][()] == 1)), list(image))
            # the vision tower's merged rows, exactly as the language model received them
            np.testing.assert_array_equal(g["inputs_embeds"][()], embeds[image])
            # M-RoPE ids [P, 3]: text 0..2, the 2 x 2 grid at temporal 3, then text from 5
            pos = g["position_ids"][()]
            self.assertEqual(pos.shape, (len(ids), 3))
            self.assertEqual(pos[:8].tolist(), [[0, 0, 0], [1, 1, 1], [2, 2, 2], [3, 3, 3],
                                                [3, 3, 4], [3, 4, 3], [3, 4, 4], [5, 5, 5]])
            # the reference answer (the first of the dataset's list) and its tokens alone
            self.assertEqual(g.attrs["reference"], "cat")
            self.assertEqual(list(g["reference_ids"][()]), [5 + (ord(c) % 40) for c in "cat"])
            b = f["samples/b"]
            self.assertNotIn("reference", b.attrs)
            self.assertNotIn("reference_ids", b)
            self.assertNotIn("inputs_embeds", b)
            P = len(b["token_ids"][()])
            self.assertEqual(b["position_ids"][()].tolist(), [[i, i, i] for i in range(P)])

    def test_references_beside_the_prompts(self):
        from kvsim.capture.__main__ import read_prompts

        d = tempfile.mkdtemp()
        prompts, answers = os.path.join(d, "p.jsonl"), os.path.join(d, "a.txt")
        with open(prompts, "w") as f:
            f.write('{"name": "a", "text": "x"}\n{"name": "b", "text": "y"}\n')
        with open(answers, "w") as f:
            f.write("cat\ndog\n")
        self.assertEqual([p["answer"] for p in read_prompts(prompts, answers, "answer")],
                         ["cat", "dog"])
        with open(answers, "w") as f:
            f.write("cat\n")
        with self.assertRaises(SystemExit) as e:
            read_prompts(prompts, answers)
        self.assertEqual(str(e.exception), f"python -m kvsim.capture: {answers} has 1 "
                         f"reference(s) for the 2 prompt(s) of {prompts}: one line per prompt, "
                         f"in order")

    def test_rotary_of_reads_each_config_form(self):
        from kvsim.capture import hf

        ns = types.SimpleNamespace
        self.assertEqual(hf.rotary_of(ns(rope_theta=1e4, rope_scaling=None)), (1e4, None))
        # transformers 5: rope_parameters on the text config
        self.assertEqual(
            hf.rotary_of(ns(text_config=ns(rope_parameters={
                "rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]}))),
            (1e6, [16, 24, 24]))
        # a scaled RoPE is not plain RoPE at rope_theta: the trace does not claim it
        self.assertEqual(hf.rotary_of(ns(rope_theta=5e5, rope_scaling={"rope_type": "llama3",
                                                                      "factor": 8.0})),
                         (None, None))
        np.testing.assert_array_equal(hf.generated_position_ids([[0, 1, 1], [0, 1, 2], [0, 2, 1]], 2),
                                      [[0, 1, 1, 3, 4], [0, 1, 2, 3, 4], [0, 2, 1, 3, 4]])

    def test_media_positions_from_grids_and_runs(self):
        from kvsim.capture.hf import media_positions

        config = Config()
        ids = [1, IMAGE_TOKEN, IMAGE_TOKEN, 2, VIDEO_TOKEN, VIDEO_TOKEN, VIDEO_TOKEN, VIDEO_TOKEN,
               IMAGE_TOKEN, 3]
        # one 2-token image and one 1-token image; a video of two frames of 2 tokens each
        modality, media = media_positions(ids, config, image_grid_thw=[[1, 2, 4], [1, 2, 2]],
                                          video_grid_thw=[[2, 2, 4]])
        self.assertEqual(list(modality), [0, 1, 1, 0, 2, 2, 2, 2, 1, 0])
        self.assertEqual(list(media), [-1, 0, 0, -1, 1, 1, 2, 2, 3, -1])
        # grids as the processor gives them: tensors (on the GPU there; tolist, never numpy)
        _, media_t = media_positions(ids, config, image_grid_thw=torch.tensor([[1, 2, 4], [1, 2, 2]]),
                                     video_grid_thw=torch.tensor([[2, 2, 4]]))
        self.assertEqual(list(media_t), list(media))
        # LLaVA: image_token_index, images of equal size, adjacent
        llava = types.SimpleNamespace(image_token_index=7)
        modality, media = media_positions([1, 7, 7, 7, 7, 2], llava, num_images=2)
        self.assertEqual(list(media), [-1, 0, 0, 1, 1, -1])
        modality, media = media_positions([1, 7, 7, 2, 7, 3], llava)  # runs
        self.assertEqual(list(media), [-1, 0, 0, -1, 1, -1])
        from kvsim.capture import CaptureError

        with self.assertRaises(CaptureError):
            media_positions([7, 7, 7], llava, num_images=2)


if __name__ == "__main__":
    unittest.main()
