"""Builds the assembled VLM, LLaVA's stage-1 recipe on real trained parts: Google's ImageNet
MobileNetV2 (frozen) gives each image a 7x7 grid of 1280-d features (49 image tokens); a
projector (Linear-GELU-Linear, LLaVA-1.5's) trained here maps them into the embedding space of
Karpathy's stories260K (frozen), with next-token loss on one-sentence answers that name the image's
class ("Lily saw the dress."). An assembled toy: a 260K-parameter decoder and one task, not a
production VLM.

The result is cached under a key of every setting, the parts' bytes and this package's source,
in $KVSIM_CACHE/vlm/ (default ~/.cache/kvsim/vlm/), and holds:
    model/            the decoder as an ordinary LlamaForCausalLM checkpoint (stories260K's
                      weights, unchanged), its vocabulary and generation_config.json
    projector.safetensors
    prompts.h5        held-out test images: kvprompt v1 with the projected image rows as
                      inputs_embeds, the question, the reference answer (the class word)
    prompts_noimage.h5, prompts_swapped.h5   the controls: no image, another image's rows
    build.json        settings, accuracies (full cache, both controls), per class, losses, times
"""
import hashlib
import json
import os
import shutil
import time

import numpy as np

from kvsim.models.fetch import sha256_of
from kvsim.models.files import write_safetensors
from kvsim.vlm import data
from kvsim.vlm.decoder import LlamaDecoder, greedy_answers
from kvsim.vlm.encoder import MobileNetV2

__all__ = ["DEFAULTS", "SMALL", "build", "cache_root", "image_tokens"]

# `seed` draws the training images, the projector's initial weights and the order of the batches;
# `test_seed` draws the held-out images, so that projectors trained with different seeds are
# measured on the same images (test_seed = 1 is the draw of every earlier build).
DEFAULTS = dict(train_per_class=200, test_per_class=12, epochs=6, batch=32, lr=1e-3,
                projector_hidden=256, seed=0, test_seed=1, threads=2, max_answer_tokens=8)
# The CI setting: enough to check every piece, not to reach the full model's accuracy (its full
# cache answers at chance: the reports then print no tests; 60 images per class and 6 epochs would
# read the images, 0.55 on seed 0, at four times the cost).
SMALL = dict(DEFAULTS, train_per_class=20, test_per_class=2, epochs=2)

IMAGE_TOKEN_ID = 0   # token_ids at image positions are ignored (inputs_embeds replace them)
END_IDS = (1, 2)     # llama2.c ends a story with the start token (1); 2 is the eos id


def cache_root():
    return os.path.join(os.environ.get("KVSIM_CACHE") or
                        os.path.join(os.path.expanduser("~"), ".cache", "kvsim"), "vlm")


def _parts(models):
    enc, dec = os.path.join(models, "mobilenet_v2"), os.path.join(models, "stories260K")
    for d, files in ((enc, ("graph.json", "model.safetensors")),
                     (dec, ("config.json", "model.safetensors", "vocab.json"))):
        for f in files:
            if not os.path.exists(os.path.join(d, f)):
                raise FileNotFoundError(f"{os.path.join(d, f)}: missing (the VLM's parts are read "
                                        f"from {models})")
    return enc, dec


# The sources a single-image build depends on (its cache key); the multi-image build adds its own.
SOURCES = ("assemble.py", "data.py", "decoder.py", "encoder.py", "../models/files.py")


def _key(settings, enc, dec, sources=SOURCES):
    h = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for d, files in ((enc, ("graph.json", "model.safetensors")),
                     (dec, ("config.json", "model.safetensors", "vocab.json"))):
        for f in files:
            h.update(sha256_of(os.path.join(d, f)).encode())
    here = os.path.dirname(os.path.abspath(__file__))
    for f in sources:
        with open(os.path.join(here, f), "rb") as src:
            h.update(src.read())
    return h.hexdigest()[:16]


def image_tokens(encoder, images, batch=50, progress=None):
    """Conv_1 grids of 28x28 uint8 images as tokens: float32 [N, 49, 1280], row-major over the
    7x7 grid (token r*7+c is grid cell (r, c))."""
    out = []
    for i in range(0, len(images), batch):
        x = np.stack([encoder.preprocess(data.to_pil(im)) for im in images[i:i + batch]])
        _, grid = encoder(x, classify=False)
        out.append(grid.flatten(2).transpose(1, 2).cpu().numpy())
        if progress:
            progress(min(i + batch, len(images)), len(images))
    return np.concatenate(out)


class _Task:
    """Token ids of the prompt's text and of each class's answer under the decoder's vocabulary."""

    def __init__(self, vocab):
        self.vocab = vocab
        self.question = vocab.encode(f"{data.QUESTION} {data.ANSWER_PREFIX}")
        self.answers = [vocab.encode(f"{w}.") for w in data.CLASS_WORDS]  # " dress." etc.

    def prompt_len(self, with_image=True):
        return 1 + (49 if with_image else 0) + len(self.question)


def _projector(settings, hidden):
    import torch

    torch.manual_seed(settings["seed"])
    return torch.nn.Sequential(torch.nn.Linear(1280, settings["projector_hidden"]),
                               torch.nn.GELU(), torch.nn.Linear(settings["projector_hidden"], hidden))


def _inputs(dec, task, n, image_rows, answers=None):
    """Input embeddings [n, T, hidden]: start token, image rows (or none), question, and the
    teacher-forced answer tokens when given."""
    import torch

    parts = [dec.embed(torch.ones(n, 1, dtype=torch.long))]
    if image_rows is not None:
        parts.append(image_rows)
    parts.append(dec.embed(torch.tensor([task.question] * n)))
    if answers is not None:
        parts.append(dec.embed(answers))
    return torch.cat(parts, 1)


def _train(settings, dec, task, feats, labels, log):
    """Next-token loss on the answer and its end token, projector only (LLaVA stage 1)."""
    import torch

    proj = _projector(settings, dec.hidden)
    dec.trainable([])
    opt = torch.optim.AdamW(proj.parameters(), lr=settings["lr"], weight_decay=0.0)
    targets = [a + [END_IDS[0]] for a in task.answers]
    width = max(map(len, targets))
    start = task.prompt_len() - 1  # logits at the last prompt position predict the answer
    losses = []
    feats = torch.from_numpy(feats)
    for epoch in range(settings["epochs"]):
        order = np.random.default_rng(settings["seed"] + epoch).permutation(len(labels))
        total = 0.0
        for i in range(0, len(order), settings["batch"]):
            pick = order[i:i + settings["batch"]]
            tgt = torch.full((len(pick), width), END_IDS[0], dtype=torch.long)
            mask = torch.zeros((len(pick), width), dtype=torch.bool)
            for r, c in enumerate(labels[pick]):
                tgt[r, :len(targets[c])] = torch.tensor(targets[c])
                mask[r, :len(targets[c])] = True
            logits = dec(_inputs(dec, task, len(pick), proj(feats[pick]), tgt[:, :-1]))
            window = logits[:, start:start + width]
            loss = torch.nn.functional.cross_entropy(window[mask], tgt[mask])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss) * len(pick)
        losses.append(total / len(labels))
        log(f"epoch {epoch + 1}/{settings['epochs']}: answer loss {losses[-1]:.4f}")
    return proj, losses


def _greedy(dec, task, image_rows, n, max_tokens):
    """Greedy answers (token ids, the end token included when reached) of n prompts."""
    return greedy_answers(dec, _inputs(dec, task, n, image_rows), max_tokens, END_IDS)


def _answer_word(vocab, ids):
    """The decoded answer with its end token and final period dropped, lower-cased."""
    text = vocab.decode([i for i in ids if i not in END_IDS]).strip().lower()
    return text[:-1].strip() if text.endswith(".") else text


def _accuracy(vocab, answers, labels, choices=data.CLASS_WORDS):
    """The answers' words, whether each is choices[label], and whether each is one of them."""
    words = [_answer_word(vocab, a) for a in answers]
    right = np.array([w == choices[c] for w, c in zip(words, labels)])
    a_class = np.array([w in choices for w in words])
    return words, right, a_class


def _prompt_samples(task, names, labels, rows, with_image=True):
    out = {}
    for i, name in enumerate(names):
        q = task.question
        if with_image:
            ids = [1] + [IMAGE_TOKEN_ID] * 49 + q
            modality = [0] + [1] * 49 + [0] * len(q)
            media = [-1] + [0] * 49 + [-1] * len(q)
        else:
            ids, modality, media = [1] + q, [0] * (1 + len(q)), [-1] * (1 + len(q))
        sample = {"token_ids": ids, "modality": modality, "media_id": media,
                  "segment": [0] + [1] * (len(ids) - 1), "question_len": len(q),
                  "reference_ids": task.answers[labels[i]],
                  "reference": data.CLASS_WORDS[labels[i]], "task": "fashion-mnist class"}
        if with_image:
            sample["inputs_embeds"] = rows[i]
        out[name] = sample
    return out


def _write_model(dec_dir, out):
    os.makedirs(out)
    for f in ("config.json", "model.safetensors", "vocab.json", "tokenizer.bin", "LICENSE"):
        if os.path.exists(os.path.join(dec_dir, f)):
            shutil.copyfile(os.path.join(dec_dir, f), os.path.join(out, f))
    with open(os.path.join(out, "generation_config.json"), "w", encoding="utf-8") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": list(END_IDS)}, f)
        f.write("\n")


def build(models, settings=None, out=None, log=print, force=False):
    """Builds (or finds in the cache) the assembled VLM from the parts in `models` (a folder with
    mobilenet_v2/ and stories260K/). Returns the directory that holds it."""
    import torch
    # The submodule itself: kvsim.vlm runs where the C++ module is not built (a GPU machine).
    from kvsim.prompts import Llama2cVocab

    settings = dict(DEFAULTS, **(settings or {}))
    unknown = set(settings) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown VLM build setting(s) {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    enc_dir, dec_dir = _parts(models)
    out = out or os.path.join(cache_root(), _key(settings, enc_dir, dec_dir))
    if os.path.exists(os.path.join(out, "build.json")) and not force:
        log(f"assembled VLM: cached in {out}")
        return out
    torch.set_num_threads(settings["threads"])  # fixed, so the build's sums are the same
    t0 = time.time()
    encoder, dec = MobileNetV2(enc_dir), LlamaDecoder.load(dec_dir)
    vocab = Llama2cVocab(dec_dir)
    task = _Task(vocab)
    train_x, train_y = data.read_fashion_mnist("train")
    test_x, test_y = data.read_fashion_mnist("test")
    train_idx = data.balanced_subset(train_y, settings["train_per_class"], settings["seed"])
    test_idx = data.balanced_subset(test_y, settings["test_per_class"], settings["test_seed"])
    log(f"encoding {len(train_idx)} training and {len(test_idx)} held-out images "
        "(MobileNetV2 Conv_1, 7x7x1280)")
    train_f = image_tokens(encoder, train_x[train_idx])
    test_f = image_tokens(encoder, test_x[test_idx])
    t_encode = time.time() - t0
    proj, losses = _train(settings, dec, task, train_f, train_y[train_idx], log)
    t_train = time.time() - t0 - t_encode
    labels = test_y[test_idx].astype(int)
    with torch.no_grad():
        rows = proj(torch.from_numpy(test_f))
    # The control: each image's rows replaced by those of the image half the set away (a fixed
    # derangement; classes are balanced, so about 1 in 10 swaps keeps the class).
    swap = (np.arange(len(labels)) + len(labels) // 2) % len(labels)
    n, m = len(labels), settings["max_answer_tokens"]
    runs = {"full": _greedy(dec, task, rows, n, m),
            "no_image": _greedy(dec, task, None, n, m),
            "swapped": _greedy(dec, task, rows[swap], n, m)}
    report = {"what": "an assembled toy VLM (MobileNetV2 encoder, trained projector, stories260K "
                      "decoder; one task: name the Fashion-MNIST class), not a production VLM",
              "settings": settings, "image_tokens": 49, "test_images": n,
              "fashion_mnist_test_indices": test_idx.tolist(), "train_loss": losses,
              "seconds": {"encode": round(t_encode, 1), "train": round(t_train, 1)}}
    _score_runs(report, runs, vocab, labels, swap, log)
    tmp = out + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    _write_model(dec_dir, os.path.join(tmp, "model"))
    write_safetensors(os.path.join(tmp, "projector.safetensors"),
                      {k: v.detach().numpy() for k, v in proj.state_dict().items()})
    _write_prompt_files(tmp, task, test_idx, labels, rows.numpy().astype(np.float32), swap)
    return _publish(tmp, out, report, t0, log, "assembled VLM")


def _score_runs(report, runs, vocab, labels, swap, log):
    """Each run's accuracy (the answer names the image's class) into the build's report: per
    class and with the answers for the full cache, and for the swapped control how often it
    names the class swapped in."""
    for name, answers in runs.items():
        words, right, a_class = _accuracy(vocab, answers, labels)
        report[name] = {"accuracy": float(right.mean()), "answers_a_class_word": float(a_class.mean())}
        if name == "full":
            report[name]["per_class"] = {data.CLASS_WORDS[c]: float(right[labels == c].mean())
                                         for c in range(10)}
            report[name]["answers"] = words
        if name == "swapped":
            report[name]["names_the_swapped_in_class"] = float(np.mean(
                [w == data.CLASS_WORDS[c] for w, c in zip(words, labels[swap])]))
        log(f"{name}: accuracy {right.mean():.3f} over {len(labels)} held-out images")


def _write_prompt_files(tmp, task, test_idx, labels, emb, swap):
    """prompts.h5 and the controls' prompt files (the images swapped, no image)."""
    from kvsim.prompts import write as write_prompts

    names = [f"fmnist{int(i):05d}" for i in test_idx]
    write_prompts(os.path.join(tmp, "prompts.h5"), _prompt_samples(task, names, labels, emb),
                  model="assembled VLM (MobileNetV2 + projector + stories260K)")
    write_prompts(os.path.join(tmp, "prompts_swapped.h5"),
                  _prompt_samples(task, names, labels, emb[swap]))
    write_prompts(os.path.join(tmp, "prompts_noimage.h5"),
                  _prompt_samples(task, names, labels, None, with_image=False))


def _publish(tmp, out, report, t0, log, what):
    """Writes build.json (with the total time) into the finished build `tmp` and moves it to
    `out` in one rename, so that a cache entry is complete or absent. Returns `out`."""
    report["seconds"]["total"] = round(time.time() - t0, 1)
    with open(os.path.join(tmp, "build.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    log(f"{what} written to {out} in {report['seconds']['total']} s")
    return out
