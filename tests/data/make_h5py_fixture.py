#!/usr/bin/env python3
"""Writes tests/data/h5py_small.h5: a kvtrace v1 file made the way a user's PyTorch hook would
make it, with h5py's own conventions (int64 and variable-length UTF-8 string attributes, numpy
float16, gzip + shuffle chunks next to contiguous datasets). test_kvtrace.cpp checks that kvsim
reads it back exactly. Values are small multiples of 1/8, exact in float16.

Run with Debian's python3 (python3-h5py, python3-numpy):  /usr/bin/python3 make_h5py_fixture.py
"""
import os

import h5py
import numpy as np

L, H, HKV, D = 2, 4, 2, 8


def pattern(shape, salt):
    t, h, i = np.indices(shape)
    return (((t * 7 + h * 3 + i + salt) % 11) - 5) / 8.0


def main():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "h5py_small.h5")
    with h5py.File(path, "w") as f:
        f.attrs["kvtrace_version"] = 1
        f.attrs["model"] = "h5py-fixture"
        f.attrs["num_layers"] = L
        f.attrs["num_heads"] = H
        f.attrs["num_kv_heads"] = HKV
        f.attrs["head_dim"] = D
        f.attrs["scale"] = 0.25
        # Sample "a": float16, image tokens, gzip+shuffle q, contiguous k and v.
        a = f.create_group("samples/a")
        a.attrs["prompt_len"] = 5
        a.attrs["gen_len"] = 3
        a.attrs["task"] = "docvqa"
        a.attrs["reference"] = "forty-two"
        a["modality"] = np.array([0, 1, 1, 1, 0, 0, 0, 0], dtype=np.uint8)
        a["segment"] = np.array([0, 1, 1, 1, 1, 2, 2, 2], dtype=np.uint8)
        a["media_id"] = np.array([-1, 0, 0, 0, -1, -1, -1, -1], dtype=np.int32)
        a["token_ids"] = np.arange(8, dtype=np.int32) + 100
        for l in range(L):
            g = a.create_group(f"layers/{l}")
            g.create_dataset("q", data=pattern((8, H, D), l).astype(np.float16),
                             chunks=(4, H, D), compression="gzip", shuffle=True)
            g.create_dataset("k", data=pattern((8, HKV, D), l + 1).astype(np.float16))
            g.create_dataset("v", data=pattern((8, HKV, D), l + 2).astype(np.float16))
        # Sample "b": float32, text only, no values, no optional datasets.
        b = f.create_group("samples/b")
        b.attrs["prompt_len"] = 3
        b.attrs["gen_len"] = 1
        b["modality"] = np.zeros(4, dtype=np.uint8)
        b["segment"] = np.array([0, 1, 1, 2], dtype=np.uint8)
        for l in range(L):
            g = b.create_group(f"layers/{l}")
            g["q"] = pattern((4, H, D), 5 + l).astype(np.float32)
            g["k"] = pattern((4, HKV, D), 6 + l).astype(np.float32)


if __name__ == "__main__":
    main()
