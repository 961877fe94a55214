"""The assembled VLM's task: Fashion-MNIST images (Debian's dataset-fashion-mnist, Zalando's 70,000
labelled 28x28 clothing images) with a question whose answer names the image's class, in the
register of TinyStories (the decoder's training text).

    images, labels = read_fashion_mnist("test")          # uint8 [N, 28, 28], uint8 [N]
    pick = balanced_subset(labels, per_class=12, seed=0)
"""
import gzip
import os

import numpy as np

__all__ = ["FASHION_MNIST_DIR", "CLASS_NAMES", "CLASS_WORDS", "QUESTION", "ANSWER_PREFIX",
           "read_fashion_mnist", "balanced_subset", "to_pil"]

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"

# Zalando's names for labels 0..9, and the word a children's story would use for each. Two
# classes need care: "T-shirt/top" is "tee" so that it is not a substring of "shirt" (class 6),
# and "Ankle boot" is "boot". The words are what the reference answers hold.
CLASS_NAMES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
               "Sneaker", "Bag", "Ankle boot"]
CLASS_WORDS = ["tee", "pants", "sweater", "dress", "coat", "sandal", "shirt", "sneaker", "bag",
               "boot"]

QUESTION = "What did Lily see?"   # after the image; the answer is "Lily saw the <word>."
ANSWER_PREFIX = "Lily saw the"     # ends the prompt, so the generated answer is " <word>."


def _read_idx(path, magic, dims):
    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ValueError(f"{path}: cannot read ({e}); install Debian's dataset-fashion-mnist "
                         "(./install-deps.sh does)") from None
    got = int.from_bytes(data[:4], "big")
    if got != magic:
        raise ValueError(f"{path}: magic {got:#x}, expected {magic:#x} (not an idx file)")
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims)
    if body.size != int(np.prod(shape)):
        raise ValueError(f"{path}: {body.size} bytes of data for shape {shape} (truncated?)")
    return body.reshape(shape)


def read_fashion_mnist(split, directory=FASHION_MNIST_DIR):
    """(images uint8 [N, 28, 28], labels uint8 [N]) of split 'train' (60,000) or 'test' (10,000)."""
    prefix = {"train": "train", "test": "t10k"}.get(split)
    if prefix is None:
        raise ValueError(f"split {split!r}: expected 'train' or 'test'")
    images = _read_idx(os.path.join(directory, f"{prefix}-images-idx3-ubyte.gz"), 0x803, 3)
    labels = _read_idx(os.path.join(directory, f"{prefix}-labels-idx1-ubyte.gz"), 0x801, 1)
    if len(images) != len(labels):
        raise ValueError(f"{directory}: {len(images)} {split} images but {len(labels)} labels")
    return images, labels


def balanced_subset(labels, per_class, seed):
    """Indices of `per_class` examples of every class, drawn without replacement by a seeded
    permutation, in ascending index order (deterministic for a seed)."""
    order = np.random.default_rng(seed).permutation(len(labels))
    picked = []
    for c in range(len(CLASS_WORDS)):
        of_class = order[labels[order] == c][:per_class]
        if len(of_class) < per_class:
            raise ValueError(f"class {c} has {len(of_class)} examples, fewer than {per_class}")
        picked.extend(of_class.tolist())
    return np.sort(np.asarray(picked))


def to_pil(image):
    """A 28x28 uint8 array as a PIL image (grey, light garment on black, as the dataset stores)."""
    from PIL import Image

    return Image.fromarray(np.asarray(image, dtype=np.uint8), mode="L")
