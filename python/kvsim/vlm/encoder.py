"""The vision encoder of the assembled VLM: Google's ImageNet-trained MobileNetV2 as described by
`graph.json` (ops in execution order) and `model.safetensors` (float32 weights, PyTorch conv
layout) in a model directory. Runs the graph op by op in PyTorch, as the directory's
PROVENANCE.md specifies: TensorFlow SAME padding (the smaller half before), bias, fused ReLU6.

    enc = MobileNetV2("models/mobilenet_v2")
    probs, grid = enc(enc.preprocess(pil_image))   # [N, 1001], the Conv_1 grid [N, 1280, 7, 7]

Needs torch (and PIL for preprocess). No other framework is involved.
"""
import json
import math
import os

import numpy as np

__all__ = ["read_safetensors", "MobileNetV2"]

_DTYPES = {"F32": np.float32, "F16": np.float16}


def read_safetensors(path):
    """{name: numpy array} of a safetensors file (F32 or F16). Raises ValueError naming the file
    and tensor when the file is not one."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    n = int.from_bytes(data[:8], "little")
    if n > len(data) - 8:
        raise ValueError(f"{path}: header length {n} exceeds the file (truncated?)")
    header = json.loads(data[8:8 + n])
    body = memoryview(data)[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        if e.get("dtype") not in _DTYPES:
            raise ValueError(f"{path}: tensor '{name}': dtype {e.get('dtype')} is not F32 or F16")
        begin, end = e["data_offsets"]
        dtype = _DTYPES[e["dtype"]]
        count = int(np.prod(e["shape"], dtype=np.int64))
        if end > len(body) or end - begin != count * np.dtype(dtype).itemsize:
            raise ValueError(f"{path}: tensor '{name}': data_offsets do not fit its shape")
        out[name] = np.frombuffer(body[begin:end], dtype=dtype).reshape(e["shape"]).copy()
    return out


def _same_padding(size, kernel, stride):
    """TensorFlow SAME: total max((ceil(h/s) - 1)·s + k - h, 0), the smaller half before."""
    total = max((math.ceil(size / stride) - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


class MobileNetV2:
    """graph.json + model.safetensors of a directory, run in float32 with PyTorch."""

    FEATURES = "Conv_1"  # the 7x7x1280 grid: the last feature map before pooling

    def __init__(self, directory):
        import torch

        self.dir = directory
        gpath = os.path.join(directory, "graph.json")
        try:
            with open(gpath, encoding="utf-8") as f:
                graph = json.load(f)
        except OSError as e:
            raise ValueError(f"{gpath}: cannot read the encoder's graph ({e.strerror})") from None
        self.ops = graph["ops"]
        self.input = graph["input"]
        weights = read_safetensors(os.path.join(directory, "model.safetensors"))
        self.weights = {k: torch.from_numpy(v.astype(np.float32)) for k, v in weights.items()}
        for op in self.ops:
            for key in ("weight", "bias"):
                if key in op and op[key] not in self.weights:
                    raise ValueError(f"{directory}: op {op['index']} needs tensor '{op[key]}', "
                                     "which model.safetensors lacks")
        feature_ops = [op for op in self.ops if "/Conv_1/" in op.get("tflite_output", "")]
        if len(feature_ops) != 1:
            raise ValueError(f"{gpath}: no single op whose tflite_output is Conv_1")
        self.feature_tensor = feature_ops[0]["output"]

    def to(self, device):
        """Moves the weights to `device`; the outputs are then there too."""
        import torch

        self.weights = {k: v.to(torch.device(device)) for k, v in self.weights.items()}
        return self

    @staticmethod
    def preprocess(image, size=224):
        """A PIL image -> float32 [3, size, size]: RGB, bilinear resize (PIL), (x - 128) / 128."""
        from PIL import Image

        rgb = image.convert("RGB").resize((size, size), Image.BILINEAR)
        x = np.asarray(rgb, dtype=np.float32)
        return (x.transpose(2, 0, 1) - 128.0) / 128.0

    def _conv(self, x, op, groups):
        import torch.nn.functional as F

        w, b = self.weights[op["weight"]], self.weights[op["bias"]]
        s = int(op["stride"])
        if op.get("padding", "same") == "same":
            top, bottom = _same_padding(x.shape[2], w.shape[2], s)
            left, right = _same_padding(x.shape[3], w.shape[3], s)
            x = F.pad(x, (left, right, top, bottom))
        return F.conv2d(x, w, b, stride=s, groups=groups)

    @staticmethod
    def _activate(x, op):
        act = op.get("activation", "none")
        if act == "relu6":
            return x.clamp(0.0, 6.0)
        if act != "none":
            raise ValueError(f"graph op {op['index']}: activation '{act}' is not supported")
        return x

    def __call__(self, images, classify=True):
        """images: float32 [N, 3, 224, 224] (preprocess'ed). Returns (probs [N, 1001] or None,
        the Conv_1 grid [N, 1280, 7, 7]). With classify=False the graph stops at the grid."""
        import torch

        at = next(iter(self.weights.values())).device
        env = {self.input["tensor"]: torch.as_tensor(np.asarray(images, dtype=np.float32)).to(at)}
        grid = None
        with torch.no_grad():
            for op in self.ops:
                x, kind = env[op["input"]], op["op"]
                if kind == "conv":
                    y = self._activate(self._conv(x, op, 1), op)
                elif kind == "depthwise":
                    y = self._activate(self._conv(x, op, x.shape[1]), op)
                elif kind == "add":
                    y = self._activate(x + env[op["input2"]], op)
                elif kind == "global_avg_pool":
                    y = x.mean(dim=(2, 3), keepdim=True)
                elif kind == "flatten":
                    y = x.flatten(1)
                elif kind == "softmax":
                    y = torch.softmax(x, dim=-1)
                else:
                    raise ValueError(f"graph op {op['index']}: op '{kind}' is not supported")
                env[op["output"]] = y
                if op["output"] == self.feature_tensor:
                    grid = y
                    if not classify:
                        return None, grid
        return env[self.ops[-1]["output"]], grid
