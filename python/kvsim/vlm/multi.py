"""The assembled VLM's multi-image task: eight Fashion-MNIST images in numbered boxes, and a
question about one box, chosen at random ("Box one: <image>. Box two: <image>. ... What was in
box three? Lily saw the" -> " coat."). The answer depends on one image
that the question picks, so a policy must keep the right image when most of the 512-token prompt
(392 of about 500 positions) is image tokens.

Its counting form (setting task = "count"): the same boxes, one to five of them holding the class
asked about, and a question about how many ("... How many boxes had a bag? Lily saw" -> " two."):
every image counts, the asked class's and the others' alike (an image it misses changes the
count if it is of the class, and nothing tells which ones are before the question is read).

The single-image projector cannot teach a frozen 260K-parameter decoder to look an image up by
its box number, so this build fine-tunes the decoder with the projector (both documented in
build.json; the frozen-decoder single-image build is unchanged). The result is cached like the
single-image build, under a key of every setting, the parts' bytes and this package's source:
    model/             the fine-tuned decoder as a LlamaForCausalLM checkpoint (+ vocabulary)
    projector.safetensors
    prompts.h5         held-out items (test images only): kvprompt v1, the projected rows of the
                       eight images as inputs_embeds, the question's length, the class word
    prompts_noimage.h5, prompts_swapped.h5, prompts_shuffled.h5   the controls, with the
                       original items' references: no images; the asked box's image replaced by
                       one of a class not in the item (counting: one more box of the asked class,
                       or one fewer where five hold it); the images shuffled among the boxes (the
                       answer must follow the image, not the box; counting: the answer unchanged)
    prompts_shared.h5  several questions on one context: the first test_items / images held-out
                       items' boxes, each asked about every box (context_id names the context;
                       counting: about every class the context holds)
    build.json         settings, accuracies (full cache and controls; by box), losses, times
"""
import contextlib
import json
import os
import shutil
import time

import numpy as np

from kvsim.models.fetch import sha256_of
from kvsim.models.files import write_json, write_safetensors
from kvsim.vlm import data
from kvsim.vlm.assemble import (END_IDS, IMAGE_TOKEN_ID, SOURCES, _accuracy, _key, _parts,
                                _publish, _write_model, cache_root, image_tokens)
from kvsim.vlm.decoder import LlamaDecoder, greedy_answers
from kvsim.vlm.encoder import MobileNetV2

__all__ = ["MULTI_DEFAULTS", "MULTI_SMALL", "build_multi", "train_multi", "BOX_WORDS"]
# This package's files whose text is part of a build's cache key, beside assemble.SOURCES.
MULTI_SOURCES = ("multi.py", "attention.py")

BOX_WORDS = ["one", "two", "three", "four", "five", "six", "seven", "eight"]
# The counting form's answers: how many boxes hold the asked class, one to five.
COUNT_WORDS = BOX_WORDS[:5]
TASKS = ("lookup", "count")
# `seed` draws the training items, the projector's initial weights and the batches; `test_seed`
# draws the held-out items (from the test split's images only).
# Training items hold min_train_images..images boxes (shorter prompts train faster, and the count
# varies); held-out items hold `images`. `task`: "lookup" (what was in box k) or "count" (how many
# boxes had a class).
MULTI_DEFAULTS = dict(images=8, min_train_images=2, train_per_class=300, test_per_class=40,
                      test_items=320, steps=1000, batch=16, lr=1e-3, decoder_lr=3e-4,
                      projector_hidden=256, seed=0, test_seed=1, threads=2, max_answer_tokens=8,
                      device="cpu", task="lookup")
# Settings added after weights were committed, at the value those weights were trained with: a
# training record without one was trained at it, and a build's cache key leaves it out there.
LATER_SETTINGS = {"task": "lookup"}
MULTI_SMALL = dict(MULTI_DEFAULTS, train_per_class=20, test_per_class=4, test_items=16, steps=4,
                   batch=4)


class MultiTask:
    """Token ids of the prompt's text pieces under the decoder's vocabulary. An item is (target,
    image indices): the target is the asked box (lookup) or the asked class (count)."""

    def __init__(self, vocab, images, kind="lookup"):
        if not 1 <= images <= len(BOX_WORDS):
            raise ValueError(f"images = {images}: between 1 and {len(BOX_WORDS)}")
        if kind not in TASKS:
            raise ValueError(f"task = {kind!r}: one of {', '.join(TASKS)}")
        self.vocab, self.images, self.kind = vocab, images, kind
        self.before = [vocab.encode(f"Box {w}:") for w in BOX_WORDS[:images]]
        self.after = vocab.encode(".")
        if kind == "lookup":
            self.questions = [vocab.encode(f"What was in box {w}? {data.ANSWER_PREFIX}")
                              for w in BOX_WORDS[:images]]
            self.words = data.CLASS_WORDS
        else:
            self.questions = [vocab.encode(f"How many boxes had a {w}? Lily saw")
                              for w in data.CLASS_WORDS]
            self.words = COUNT_WORDS
        self.answers = [vocab.encode(f"{w}.") for w in self.words]

    def answer(self, target, idx, labels):
        """The index in self.words of the item's answer, its images' classes being labels[idx]."""
        if self.kind == "lookup":
            return int(labels[idx[target]])
        return int(np.sum(labels[idx] == target)) - 1

    def describe(self, target, classes):
        """The `task` text of a held-out item in its prompt file, its boxes holding `classes`:
        the asked box; counting, the asked class and the boxes holding it (numbered from one),
        which a report needs to tell the images that count from the others."""
        if self.kind == "lookup":
            return f"fashion-mnist {self.images} boxes, box {target + 1}"
        held = ", ".join(str(b + 1) for b in np.flatnonzero(np.asarray(classes) == target))
        return (f"fashion-mnist {self.images} boxes, count {data.CLASS_WORDS[target]} in boxes "
                f"{held}")

    def layout(self, target, count, with_images=True):
        """[(kind, value)] in prompt order of an item of `count` boxes: ("text", ids) or
        ("image", slot)."""
        out = [("text", [1])]
        for slot in range(count):
            out.append(("text", self.before[slot]))
            if with_images:
                out.append(("image", slot))
            out.append(("text", self.after))
        out.append(("text", self.questions[target]))
        return out

    def prompt_len(self, target, count, with_images=True):
        return sum(49 if kind == "image" else len(v)
                   for kind, v in self.layout(target, count, with_images))


def _layout_arrays(task, items, with_images, answers=None):
    """The token ids [N, W] (0 at image and pad positions), image-row indices [N, W] (into the
    items' images stacked in order, 49 rows each; -1 elsewhere) and pads [N, W] (True: padding,
    left) of a batch of items, each followed by its teacher-forced `answers` when given."""
    ids, rows = [], []
    image = 0
    for i, (target, idx) in enumerate(items):
        item_ids, item_rows = [], []
        for kind, value in task.layout(target, len(idx), with_images):
            if kind == "image":
                item_ids += [IMAGE_TOKEN_ID] * 49
                item_rows += range((image + value) * 49, (image + value + 1) * 49)
            else:
                item_ids += value
                item_rows += [-1] * len(value)
        if answers is not None:
            item_ids += answers[i]
            item_rows += [-1] * len(answers[i])
        image += len(idx)
        ids.append(item_ids)
        rows.append(item_rows)
    width = max(len(x) for x in ids)
    out_ids = np.zeros((len(ids), width), dtype=np.int64)
    out_rows = np.full((len(ids), width), -1, dtype=np.int64)
    pad = np.ones((len(ids), width), dtype=bool)
    for i, (a, r) in enumerate(zip(ids, rows)):
        out_ids[i, width - len(a):] = a
        out_rows[i, width - len(a):] = r
        pad[i, width - len(a):] = False
    return out_ids, out_rows, pad


def _batch(dec, task, items, rows_of, answers=None):
    """Left-padded batch on the decoder's device: inputs [N, T, hidden] and pads [N, T] (True:
    padding, at negative positions, masked). Items are (target slot, image indices); rows_of(idx)
    gives their projected rows [len(idx), 49, hidden] (rows_of None: the boxes' text without
    images)."""
    import torch

    with_images = rows_of is not None
    ids, rows, pad = _layout_arrays(task, items, with_images, answers)
    at = dec.params["model.embed_tokens.weight"].device
    x = dec.embed(torch.from_numpy(ids).to(at))
    if with_images:
        images = rows_of(np.concatenate([idx for _, idx in items]))
        where = torch.from_numpy(rows >= 0).to(at)
        x = x.masked_scatter(where[..., None], images.reshape(-1, images.shape[-1])[
            torch.from_numpy(rows[rows >= 0]).to(at)])
    return x, torch.from_numpy(pad).to(at)


def _forward(dec, x, pad, last=None):
    """Logits of a left-padded batch (of its last `last` positions when given): each item at
    positions 0.. from its first real token (the pads never attended)."""
    return dec(x, pad=pad if bool(pad.any()) else None, last=last)


def _draw_items(rng, labels, count, images, fewest=None, kind="lookup"):
    """(target, image indices) items over a pool of images with these `labels`, each of `images`
    images (or a uniform number from `fewest` to `images`). Lookup: distinct classes (so the
    answer names exactly one box), the asked box uniform. Count: the asked class uniform, held by
    a uniform number of boxes from one to min(5, boxes), those boxes uniform, every other box of a
    uniform other class (repeats allowed: only the asked class is counted)."""
    items = []
    by_class = [np.flatnonzero(labels == c) for c in range(10)]
    for _ in range(count):
        n = images if fewest is None else int(rng.integers(fewest, images + 1))
        if kind == "lookup":
            classes = rng.choice(10, size=n, replace=False)
            idx = np.array([rng.choice(by_class[c]) for c in classes])
            items.append((int(rng.integers(n)), idx))
            continue
        target = int(rng.integers(10))
        held = int(rng.integers(1, min(len(COUNT_WORDS), n) + 1))
        others = [c for c in range(10) if c != target]
        classes = np.array([others[i] for i in rng.integers(len(others), size=n)])
        classes[rng.choice(n, size=held, replace=False)] = target
        items.append((target, np.array([rng.choice(by_class[c]) for c in classes])))
    return items


@contextlib.contextmanager
def cpu_threads(dec, threads):
    """On the CPU: OpenBLAS's products and kvsim's attention kernels on `threads` threads,
    PyTorch's own operations on one, restored on exit. Otherwise PyTorch's OpenMP threads and
    OpenBLAS's spin beside each other (two of each on two cores: a training step took 0.50 s
    instead of 0.22 s). No effect on another device."""
    import torch

    from kvsim import _kvsim

    if dec.params["model.embed_tokens.weight"].device.type != "cpu":
        yield
        return
    saved = (torch.get_num_threads(), _kvsim.blas_threads(threads), dec.attention_threads)
    torch.set_num_threads(1)
    dec.attention_threads = threads
    try:
        yield
    finally:
        torch.set_num_threads(saved[0])
        _kvsim.blas_threads(saved[1])
        dec.attention_threads = saved[2]


def _train(settings, dec, task, feats, labels, log, milestone=None):
    """Next-token loss on the answer and its end token; the projector and every decoder weight,
    on the decoder's device. milestone(step, proj, losses), when given, is called after every
    step: the learning rate is constant, so the weights after step n are those of a build of n
    steps."""
    import torch

    at = dec.params["model.embed_tokens.weight"].device
    proj = projector(settings, dec.hidden).to(at)
    decoder_params = dec.trainable(sorted(dec.params))
    opt = torch.optim.AdamW([{"params": proj.parameters(), "lr": settings["lr"]},
                             {"params": decoder_params, "lr": settings["decoder_lr"]}],
                            weight_decay=0.0)
    rng = np.random.default_rng(settings["seed"])
    feats = torch.from_numpy(feats).to(at)
    targets = [a + [END_IDS[0]] for a in task.answers]
    losses = []
    window = 50
    started = time.time()
    for step in range(settings["steps"]):
        items = _draw_items(rng, labels, settings["batch"], task.images,
                            settings["min_train_images"], task.kind)
        answers = [targets[task.answer(t, idx, labels)] for t, idx in items]
        x, pad = _batch(dec, task, items, lambda idx: proj(feats[torch.from_numpy(idx).to(at)]),
                        [a[:-1] for a in answers])
        # The answer's tokens are predicted from the last len(answer) positions of each item.
        logits = _forward(dec, x, pad, last=max(len(a) for a in answers))
        rows = torch.cat([logits[i, logits.shape[1] - len(a):] for i, a in enumerate(answers)])
        loss = torch.nn.functional.cross_entropy(
            rows, torch.tensor([t for a in answers for t in a], device=at))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if (step + 1) % window == 0 or step + 1 == settings["steps"]:
            took = time.time() - started
            log(f"step {step + 1}/{settings['steps']}: answer loss "
                f"{np.mean(losses[-window:]):.4f} ({took:.0f} s, about "
                f"{took / (step + 1) * (settings['steps'] - step - 1):.0f} s left)")
        if milestone is not None:
            milestone(step + 1, proj, losses)
    dec.trainable([])
    return proj, losses


def _greedy(dec, task, items, rows_of, max_tokens, batch=16):
    """Greedy answers of the items, in their order. Items are batched with others of the same
    prompt length, so that no item is padded and each runs as `kvsim live` runs it alone."""
    import torch

    with_images = rows_of is not None
    length = [task.prompt_len(t, len(idx), with_images) for t, idx in items]
    order = sorted(range(len(items)), key=lambda i: (length[i], i))
    groups = []
    for i in order:
        if groups and length[groups[-1][0]] == length[i] and len(groups[-1]) < batch:
            groups[-1].append(i)
        else:
            groups.append([i])
    out = [None] * len(items)
    with torch.no_grad():
        for group in groups:
            x, _ = _batch(dec, task, [items[i] for i in group], rows_of)  # equal lengths: no pads
            for i, a in zip(group, greedy_answers(dec, x, max_tokens, END_IDS)):
                out[i] = a
    return out


def _prompt_samples(task, items, references, rows, names, labels, with_images=True,
                    contexts=None):
    """kvprompt samples of the items: token ids (0 at image positions), modality, media ids (the
    box), the question's length, the reference answer (task.words[references[n]]: the original
    item's, also for a control), the task text (task.describe; `labels`: the classes of the
    images the items index); rows [item][images, 49, hidden]; contexts: each item's context_id
    (items sharing one differ in their question only)."""
    out = {}
    for n, (name, (target, idx)) in enumerate(zip(names, items)):
        ids, modality, media, embeds = [], [], [], []
        for kind, value in task.layout(target, len(idx), with_images):
            if kind == "image":
                ids += [IMAGE_TOKEN_ID] * 49
                modality += [1] * 49
                media += [value] * 49
                embeds.append(rows[n][value])
            else:
                ids += value
                modality += [0] * len(value)
                media += [-1] * len(value)
        label = int(references[n])
        sample = {"token_ids": ids, "modality": modality, "media_id": media,
                  "segment": [0] + [1] * (len(ids) - 1),
                  "question_len": len(task.questions[target]),
                  "reference_ids": task.answers[label], "reference": task.words[label],
                  "task": task.describe(target, labels[idx])}
        if contexts is not None:
            sample["context_id"] = contexts[n]
        if with_images:
            sample["inputs_embeds"] = np.concatenate(embeds).astype(np.float32)
        out[name] = sample
    return out


def _controls(rng, items, labels, kind="lookup"):
    """The swapped control and the shuffled one, item by item; indices into the pool whose labels
    are `labels`. Lookup: the asked box's image replaced by one of a class not in the item; the
    images permuted among the boxes so the asked box holds another image. Count: one box not of
    the asked class given an image of it (one more), or where five boxes (or all) hold it, one of
    them an image of another class (one fewer); the images permuted so at least one box changes
    class (the count stays; an item whose boxes all hold the class is left as it is)."""
    if kind == "count":
        return _count_controls(rng, items, labels)
    swapped, shuffled = [], []
    for target, idx in items:
        present = set(int(labels[i]) for i in idx)
        others = np.flatnonzero([int(c) not in present for c in labels])
        s = idx.copy()
        s[target] = rng.choice(others)
        swapped.append((target, s))
        perm = rng.permutation(len(idx))
        while perm[target] == target:
            perm = rng.permutation(len(idx))
        shuffled.append((target, idx[perm]))
    return swapped, shuffled


def _count_controls(rng, items, labels):
    swapped, shuffled = [], []
    for target, idx in items:
        held = labels[idx] == target
        # One more unless five boxes, or every box, already hold the class.
        more = int(held.sum()) < min(len(COUNT_WORDS), len(idx))
        # The box changed is drawn among those not holding the class (one more) or holding it.
        box = int(rng.choice(np.flatnonzero(~held if more else held)))
        pool = np.flatnonzero(labels == target if more else labels != target)
        s = idx.copy()
        s[box] = rng.choice(pool)
        swapped.append((target, s))
        if held.all():  # every box of one class: no order changes a box's class
            shuffled.append((target, idx.copy()))
            continue
        perm = rng.permutation(len(idx))
        while np.array_equal(labels[idx[perm]], labels[idx]):  # some box must change class
            perm = rng.permutation(len(idx))
        shuffled.append((target, idx[perm]))
    return swapped, shuffled


def _settings(settings):
    settings = dict(MULTI_DEFAULTS, **(settings or {}))
    unknown = set(settings) - set(MULTI_DEFAULTS)
    if unknown:
        raise ValueError(f"unknown multi-image VLM setting(s) {sorted(unknown)}; known: "
                         f"{sorted(MULTI_DEFAULTS)}")
    if settings["task"] not in TASKS:
        raise ValueError(f"task = {settings['task']!r}: one of {', '.join(TASKS)}")
    return settings


def _keyed_settings(settings):
    """The settings a build's cache key holds: a later setting at its earlier value left out, so
    the builds made before it keep their keys."""
    return {k: v for k, v in settings.items()
            if k not in LATER_SETTINGS or LATER_SETTINGS[k] != v}


def _deterministic_cuda():
    """What a GPU needs to train the same bytes twice: cuBLAS with a fixed workspace (set before
    CUDA starts; a process that already used CUDA keeps its own), PyTorch's deterministic
    algorithms (a warning names any operation that has none), and no TF32 (float32 products
    rounded to 10-bit mantissas otherwise, on Ampere and later)."""
    import torch

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False


def setup(models, settings):
    """The parts and task of a build: (settings, encoder, decoder on settings' device, vocabulary,
    task, the decoder's folder)."""
    import torch
    from kvsim.prompts import Llama2cVocab

    settings = _settings(settings)
    enc_dir, dec_dir = _parts(models)
    try:
        device = torch.device(settings["device"])
    except RuntimeError:
        raise ValueError(f"device {settings['device']!r}: not a torch device (cpu, cuda, "
                         "cuda:N)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {settings['device']!r}: torch {torch.__version__} here sees no "
                         "CUDA device; train where one is (experiments/vlm_multi_gpu.py) and "
                         "build from those weights with --weights")
    if device.type == "cuda":
        _deterministic_cuda()
    torch.set_num_threads(settings["threads"])
    encoder = MobileNetV2(enc_dir).to(settings["device"])
    dec = LlamaDecoder.load(dec_dir).to(settings["device"])
    dec.contiguous = True
    if device.type == "cpu":
        dec.attention = "kvsim"  # kvsim's C++ attention kernels: several times faster here
    vocab = Llama2cVocab(dec_dir)
    task = MultiTask(vocab, settings["images"], settings["task"])
    longest = (max(task.prompt_len(t, task.images) for t in range(len(task.questions))) +
               settings["max_answer_tokens"])
    limit = int(dec.config.get("max_position_embeddings", 0) or 0)
    if limit and longest > limit:
        raise ValueError(f"{task.images} images need {longest} positions with the answer, beyond "
                         f"the decoder's {limit}")
    return settings, encoder, dec, vocab, task, dec_dir


def image_pools(settings, encoder, log=print, train=True):
    """The training and held-out images' tokens and labels: (train_f [N, 49, 1280], train_labels,
    test_f, test_labels), drawn by `seed` and `test_seed` (train=False: the held-out ones only,
    None for the others)."""
    test_x, test_y = data.read_fashion_mnist("test")
    test_pool = data.balanced_subset(test_y, settings["test_per_class"], settings["test_seed"])
    train_f = train_labels = None
    if train:
        train_x, train_y = data.read_fashion_mnist("train")
        train_pool = data.balanced_subset(train_y, settings["train_per_class"], settings["seed"])
        log(f"encoding {len(train_pool)} training images")
        train_f, train_labels = image_tokens(encoder, train_x[train_pool]), train_y[train_pool]
        train_labels = train_labels.astype(int)
    log(f"encoding {len(test_pool)} held-out images")
    return (train_f, train_labels, image_tokens(encoder, test_x[test_pool]),
            test_y[test_pool].astype(int))


def held_out(settings, test_labels):
    """The held-out items and their controls: (items, swapped, shuffled), drawn by test_seed."""
    rng = np.random.default_rng(settings["test_seed"])
    items = _draw_items(rng, test_labels, settings["test_items"], settings["images"],
                        kind=settings["task"])
    return (items, *_controls(rng, items, test_labels, settings["task"]))


def shared_contexts(settings, items, labels):
    """Several questions on one context: the boxes of the first test_items // images held-out
    items, each asked about every box in turn (counting: about every class its boxes hold, in
    class order); `labels` are the held-out images' classes. Returns (items, context ids)."""
    count = max(1, settings["test_items"] // settings["images"])
    targets = ((lambda idx: range(len(idx))) if settings["task"] == "lookup" else
               (lambda idx: sorted(set(int(c) for c in labels[idx]))))
    shared = [(t, idx) for _, idx in items[:count] for t in targets(idx)]
    contexts = [f"context{c:04d}" for c, (_, idx) in enumerate(items[:count])
                for _ in targets(idx)]
    return shared, contexts


def evaluate(settings, dec, proj, vocab, task, test_f, test_labels):
    """Greedy answers to the held-out items and their controls: ({run: report}, items, swapped,
    shuffled, rows_of) where rows_of(idx) gives the projected rows of held-out images."""
    import torch

    items, swapped, shuffled = held_out(settings, test_labels)
    at = dec.params["model.embed_tokens.weight"].device
    with torch.no_grad():
        test_rows = proj(torch.from_numpy(test_f).to(at))
    rows_of = lambda idx: test_rows[torch.as_tensor(idx, device=at)]  # noqa: E731
    labels = np.array([task.answer(t, idx, test_labels) for t, idx in items])
    shared, _ = shared_contexts(settings, items, test_labels)
    m = settings["max_answer_tokens"]
    runs = {"full": _greedy(dec, task, items, rows_of, m),
            "shared": _greedy(dec, task, shared, rows_of, m),
            "no_image": _greedy(dec, task, items, None, m),
            "swapped": _greedy(dec, task, swapped, rows_of, m),
            "shuffled": _greedy(dec, task, shuffled, rows_of, m)}
    report = {}
    for name, answers in runs.items():
        truth = labels if name != "shared" else [task.answer(t, idx, test_labels)
                                                 for t, idx in shared]
        words, right, a_class = _accuracy(vocab, answers, np.asarray(truth), task.words)
        report[name] = {"accuracy": float(right.mean()),
                        "answers_a_class_word": float(a_class.mean())}
        if name == "full":
            report[name]["answers"] = words
            if task.kind == "lookup":
                targets = np.array([t for t, _ in items])
                report[name]["by_box"] = {BOX_WORDS[b]: float(right[targets == b].mean())
                                          for b in range(task.images) if (targets == b).any()}
            else:
                report[name]["by_count"] = {COUNT_WORDS[c]: float(right[labels == c].mean())
                                            for c in range(len(COUNT_WORDS))
                                            if (labels == c).any()}
        if name in ("swapped", "shuffled"):
            now = [task.answer(t, idx, test_labels) for t, idx in (swapped if name == "swapped"
                                                                   else shuffled)]
            key = ("names_the_class_now_in_the_box" if task.kind == "lookup" else
                   "names_the_count_now")
            report[name][key] = float(np.mean([w == task.words[c] for w, c in zip(words, now)]))
    return report, items, swapped, shuffled, rows_of


def projector(settings, hidden):
    """The projector's layers (Linear-GELU-Linear), initialised from `seed`."""
    import torch

    torch.manual_seed(settings["seed"])
    return torch.nn.Sequential(torch.nn.Linear(1280, settings["projector_hidden"]),
                               torch.nn.GELU(), torch.nn.Linear(settings["projector_hidden"],
                                                                hidden))


WEIGHT_FILES = ("decoder.safetensors", "projector.safetensors")


def save_weights(directory, dec, proj, record):
    """Writes trained weights where load_weights reads them: decoder.safetensors,
    projector.safetensors and training.json (`record`: settings, losses, where it ran; the two
    files' sha256 are added to it)."""
    os.makedirs(directory, exist_ok=True)
    write_safetensors(os.path.join(directory, WEIGHT_FILES[0]),
                      {k: v.detach().cpu().numpy() for k, v in dec.params.items()})
    write_safetensors(os.path.join(directory, WEIGHT_FILES[1]),
                      {k: v.detach().cpu().numpy() for k, v in proj.state_dict().items()})
    record = dict(record, sha256={f: sha256_of(os.path.join(directory, f)) for f in WEIGHT_FILES})
    write_json(os.path.join(directory, "training.json"), record, indent=1)


def load_weights(directory, settings, dec, proj):
    """Loads weights that save_weights wrote for these settings into dec and proj (on their
    device); returns the training record. Refuses weights trained with other settings."""
    import torch

    from kvsim.vlm.encoder import read_safetensors

    path = os.path.join(directory, "training.json")
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot read the training record ({e})") from None
    trained = dict(LATER_SETTINGS, **record.get("settings", {}))
    differ = [f"{k}={trained.get(k)!r}, not {settings[k]!r}" for k in sorted(settings)
              if trained.get(k) != settings[k]]
    if differ:
        raise ValueError(f"{directory}: trained with other settings ({'; '.join(differ)})")
    for name, want in record.get("sha256", {}).items():
        if not os.path.exists(os.path.join(directory, name)):
            raise ValueError(f"{os.path.join(directory, name)}: missing (training.json records it)")
        got = sha256_of(os.path.join(directory, name))
        if got != want:
            raise ValueError(f"{os.path.join(directory, name)}: sha256 {got}, but training.json "
                             f"records {want} (a damaged or replaced file; check it out again)")
    at = dec.params["model.embed_tokens.weight"].device
    arrays = read_safetensors(os.path.join(directory, "decoder.safetensors"))
    if set(arrays) != set(dec.params):
        raise ValueError(f"{directory}/decoder.safetensors: not this decoder's tensors")
    dec.params = {k: torch.from_numpy(arrays[k].astype(np.float32)).to(at) for k in dec.params}
    proj.load_state_dict({k: torch.from_numpy(v.astype(np.float32)) for k, v in
                          read_safetensors(os.path.join(directory,
                                                        "projector.safetensors")).items()})
    return record


def _source_revision():
    """The git commit of the checkout this file is in ("+changes" when tracked files differ from
    it), or None outside a checkout."""
    import subprocess

    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                              text=True, check=True).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                 cwd=here, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+changes" if changed.strip() else "")


def train_multi(models, settings=None, out=None, log=print):
    """Trains the eight-box VLM's projector and decoder here (on settings' device) and writes
    them to the folder `out` as save_weights does, with what produced them: the settings, every
    step's loss, the training time, the machine and libraries, the source's git commit. The
    folder appears complete or not at all, and is never written over. Returns `out`."""
    import torch

    from kvsim import __version__
    from kvsim.machine import describe_machine

    settings = _settings(settings)
    if os.path.exists(out):
        raise ValueError(f"{out}: already exists; trained weights are never written over (remove "
                         "it or choose another folder)")
    source = _source_revision()  # the code that trains, before anything can change it
    _, encoder, dec, _, task, _ = setup(models, settings)
    train_f, train_labels, _, _ = image_pools(settings, encoder, log)
    t0 = time.time()
    with cpu_threads(dec, settings["threads"]):
        proj, losses = _train(settings, dec, task, train_f, train_labels, log)
    record = {"settings": settings, "seconds": round(time.time() - t0, 1),
              "device_name": _device_name(settings["device"]), "torch": torch.__version__,
              "kvsim": __version__, "source": source, "machine": describe_machine(),
              "losses": losses}
    tmp = out + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    save_weights(tmp, dec, proj, record)
    os.replace(tmp, out)
    log(f"eight-box VLM weights written to {out} ({record['seconds']} s of training)")
    return out


def build_multi(models, settings=None, out=None, log=print, force=False, weights=None):
    """Builds (or finds in the cache) the multi-image VLM from the parts in `models`. Returns its
    directory. `weights`: a folder of weights trained elsewhere with the same settings (the
    recipe on a GPU: experiments/vlm_multi_gpu.py); the build then evaluates them and writes the
    prompts here, under the key the settings give."""
    from kvsim import _kvsim
    from kvsim.machine import describe_machine

    settings = _settings(settings)
    enc_dir, dec_dir = _parts(models)
    # The vector kernels' instruction set changes the attention's rounding, so it is in the key.
    out = out or os.path.join(cache_root(), "multi-" + _key(
        dict(_keyed_settings(settings), kvsim_simd=_kvsim.simd()), enc_dir, dec_dir,
        SOURCES + MULTI_SOURCES))
    if os.path.exists(os.path.join(out, "build.json")) and not force:
        log(f"multi-image VLM: cached in {out}")
        return out
    t0 = time.time()
    # Weights trained elsewhere are evaluated here, on the CPU, whatever device trained them.
    _, encoder, dec, vocab, task, dec_dir = setup(
        models, settings if weights is None else dict(settings, device="cpu"))
    train_f, train_labels, test_f, test_labels = image_pools(settings, encoder, log,
                                                             train=weights is None)
    t_encode = time.time() - t0
    proj, losses, t_train, record = _weights(settings, weights, dec, task, train_f, train_labels,
                                             t0 + t_encode, log)
    with cpu_threads(dec, settings["threads"]):
        report, items, swapped, shuffled, rows_of = evaluate(settings, dec, proj, vocab, task,
                                                             test_f, test_labels)
    shared, contexts = shared_contexts(settings, items, test_labels)
    for name in ("full", "no_image", "swapped", "shuffled", "shared"):
        count = len(shared) if name == "shared" else len(items)
        log(f"{name}: accuracy {report[name]['accuracy']:.3f} over {count} held-out items")
    report = {"what": "the assembled toy VLM on an eight-box task (MobileNetV2 encoder, trained "
                      "projector, stories260K decoder fine-tuned with it), not a production VLM",
              "settings": settings, "images_per_prompt": task.images, "image_tokens": 49,
              "test_items": len(items), "train_loss_every_50": [
                  float(np.mean(losses[i:i + 50])) for i in range(0, len(losses), 50)],
              "decoder": "fine-tuned (every weight) with the projector",
              "trained_on": {k: record.get(k) for k in ("device_name", "torch")},
              "weights_sha256": record.get("sha256"), "evaluated_on": describe_machine(),
              "seconds": {"encode": round(t_encode, 1), "train": round(t_train, 1)}, **report}
    tmp = out + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    _write_model(dec_dir, os.path.join(tmp, "model"))
    write_safetensors(os.path.join(tmp, "model", "model.safetensors"),
                      {k: v.detach().cpu().numpy() for k, v in dec.params.items()})
    write_safetensors(os.path.join(tmp, "projector.safetensors"),
                      {k: v.detach().cpu().numpy() for k, v in proj.state_dict().items()})
    _write_multi_prompts(tmp, task, items, swapped, shuffled, shared, contexts, rows_of,
                         test_labels)
    return _publish(tmp, out, report, t0, log, "multi-image VLM")


def _weights(settings, weights, dec, task, train_f, train_labels, started, log):
    """The projector and decoder weights: read from `weights` (trained elsewhere), or trained
    here from `started` on. Returns them with the losses, the training time and its record."""
    import torch

    if weights is not None:
        proj = projector(settings, dec.hidden)
        record = load_weights(weights, settings, dec, proj)
        log(f"multi-image VLM: weights trained on {record.get('device_name', '?')} read from "
            f"{weights}")
        return proj, record["losses"], record.get("seconds", 0.0), record
    with cpu_threads(dec, settings["threads"]):
        proj, losses = _train(settings, dec, task, train_f, train_labels, log)
    t_train = time.time() - started
    return proj, losses, t_train, {"device_name": _device_name(settings["device"]),
                                   "torch": torch.__version__}


def _write_multi_prompts(tmp, task, items, swapped, shuffled, shared, contexts, rows_of,
                         test_labels):
    """prompts.h5, the controls' prompt files (no image, swapped, shuffled) and the several
    questions on one context (prompts_shared.h5)."""
    from kvsim.prompts import write as write_prompts

    names = [f"boxes{i:04d}" for i in range(len(items))]
    references = np.array([task.answer(t, idx, test_labels) for t, idx in items])
    model_name = ("assembled VLM, eight boxes" + (", counting" if task.kind == "count" else "") +
                  " (MobileNetV2 + projector + fine-tuned stories260K)")
    for suffix, chosen, with_images in (("", items, True), ("_noimage", items, False),
                                        ("_swapped", swapped, True),
                                        ("_shuffled", shuffled, True)):
        rows = [rows_of(idx).cpu().numpy() for _, idx in chosen] if with_images else None
        write_prompts(os.path.join(tmp, f"prompts{suffix}.h5"),
                      _prompt_samples(task, chosen, references, rows, names, test_labels,
                                      with_images),
                      model=model_name)
    write_prompts(os.path.join(tmp, "prompts_shared.h5"),
                  _prompt_samples(task, shared, [task.answer(t, idx, test_labels)
                                                 for t, idx in shared],
                                  [rows_of(idx).cpu().numpy() for _, idx in shared],
                                  [f"{c}_{_asked(task, t)}" for c, (t, _) in zip(contexts, shared)],
                                  test_labels, contexts=contexts), model=model_name)


def _asked(task, target):
    """What a shared context's question asks, in its sample's name: box3, or count_bag."""
    return f"box{target + 1}" if task.kind == "lookup" else f"count_{data.CLASS_WORDS[target]}"


def _device_name(device):
    import torch

    d = torch.device(device)
    return torch.cuda.get_device_name(d) if d.type == "cuda" else "cpu"
