"""Writing model files whole or not at all: each goes to PATH.partial and is renamed, so that a
folder never holds a half-written file under a real name. safetensors as the format's writers
lay it out (tensors sorted by name, then __metadata__, the header padded with spaces to 8 bytes)."""
import json
import os

import numpy as np

__all__ = ["write_bytes", "write_json", "write_safetensors"]


def write_bytes(path, parts):
    tmp = path + ".partial"
    with open(tmp, "wb") as f:
        for p in parts:
            f.write(p)
    os.replace(tmp, path)


def write_json(path, value, indent, ascii_only=True, newline=True):
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only) + ("\n" if newline else "")
    write_bytes(path, [text.encode()])


def write_safetensors(path, arrays, metadata=None):
    """{name: float32 array} as one safetensors file, with `metadata` (a dict of strings) when
    given."""
    header, blobs, offset = {}, [], 0
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name], dtype="<f4")
        header[name] = {"dtype": "F32", "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
        blobs.append(a.tobytes())
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((8 - (8 + len(text)) % 8) % 8)
    write_bytes(path, [len(text).to_bytes(8, "little"), text.encode()] + blobs)
