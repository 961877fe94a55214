"""A quantized TFLite MobileNetV2 -> graph.json + model.safetensors (float32, PyTorch conv
layout) + reference_outputs.json, the layout kvsim.vlm.encoder runs. numpy only: the flatbuffer
is read by hand from TFLite's schema (tensorflow/lite/schema/schema.fbs), no TensorFlow.

Weights are dequantized as scale · (q − zero_point), per output channel where the model is
(conv weights [O, H, W, I] -> [O, I, H, W]; depthwise [1, H, W, C] -> [C, 1, H, W]); int32 biases
times their own scale. Activations are not re-quantized: a float run of the quantized weights.
"""
import os
import struct

import numpy as np

from kvsim.models.files import write_json, write_safetensors

__all__ = ["convert", "read_model"]

# schema.fbs: BuiltinOperator, ActivationFunctionType, Padding, TensorType (the values used here).
OPS = {0: "ADD", 1: "AVERAGE_POOL_2D", 3: "CONV_2D", 4: "DEPTHWISE_CONV_2D", 22: "RESHAPE",
       25: "SOFTMAX", 43: "SQUEEZE"}
ACTIVATIONS = {0: "none", 3: "relu6"}
DTYPES = {0: "<f4", 2: "<i4", 3: "u1", 9: "i1"}


class FormatError(Exception):
    pass


class Table:
    """A flatbuffer table: field i of the vtable, as a scalar, string, table or vector."""

    def __init__(self, buf, pos):
        self.buf, self.pos = buf, pos
        vtable = pos - struct.unpack_from("<i", buf, pos)[0]
        size = struct.unpack_from("<H", buf, vtable)[0]
        self.fields = struct.unpack_from(f"<{(size - 4) // 2}H", buf, vtable + 4)

    def _at(self, i):
        return self.pos + self.fields[i] if i < len(self.fields) and self.fields[i] else None

    def scalar(self, i, fmt, default=0):
        at = self._at(i)
        return default if at is None else struct.unpack_from("<" + fmt, self.buf, at)[0]

    def _target(self, i):
        at = self._at(i)
        return None if at is None else at + struct.unpack_from("<I", self.buf, at)[0]

    def table(self, i):
        at = self._target(i)
        return None if at is None else Table(self.buf, at)

    def string(self, i):
        at = self._target(i)
        if at is None:
            return ""
        n = struct.unpack_from("<I", self.buf, at)[0]
        return bytes(self.buf[at + 4:at + 4 + n]).decode("utf-8")

    def vector(self, i, fmt=None):
        """A vector of scalars (struct format `fmt`) as a list, or of tables."""
        at = self._target(i)
        if at is None:
            return []
        n = struct.unpack_from("<I", self.buf, at)[0]
        if fmt:
            return list(struct.unpack_from(f"<{n}{fmt}", self.buf, at + 4))
        slots = [at + 4 + 4 * k for k in range(n)]  # each holds an offset from itself
        return [Table(self.buf, s + struct.unpack_from("<I", self.buf, s)[0]) for s in slots]

    def bytes(self, i):
        at = self._target(i)
        if at is None:
            return b""
        n = struct.unpack_from("<I", self.buf, at)[0]
        return bytes(self.buf[at + 4:at + 4 + n])


def read_model(path):
    """(tensors, operators, inputs) of the model's first subgraph: tensors as dicts (name, shape,
    dtype, data, scale, zero_point), operators as dicts (op, inputs, outputs, options table)."""
    with open(path, "rb") as f:
        buf = f.read()
    if buf[4:8] != b"TFL3":
        raise FormatError(f"{path}: not a TFLite flatbuffer (identifier {buf[4:8]!r})")
    model = Table(buf, struct.unpack_from("<I", buf, 0)[0])
    codes = [max(c.scalar(0, "b"), c.scalar(3, "i")) for c in model.vector(1)]
    buffers = [b.bytes(0) for b in model.vector(4)]
    graph = model.vector(2)[0]
    tensors = []
    for t in graph.vector(0):
        q = t.table(4)
        dtype = DTYPES.get(t.scalar(1, "b"))
        data = buffers[t.scalar(2, "I")]
        shape = t.vector(0, "i")
        tensors.append({
            "name": t.string(3), "shape": shape,
            "data": np.frombuffer(data, dtype).reshape(shape) if data and dtype else None,
            "scale": np.array(q.vector(2, "f"), np.float32) if q else None,
            "zero_point": np.array(q.vector(3, "q"), np.int64) if q else None})
    operators = []
    for o in graph.vector(3):
        code = codes[o.scalar(0, "I")]
        if code not in OPS:
            raise FormatError(f"{path}: builtin operator {code} is not one this converter knows")
        operators.append({"op": OPS[code], "inputs": o.vector(1, "i"), "outputs": o.vector(2, "i"),
                          "options": o.table(4)})
    return tensors, operators, graph.vector(1, "i")


def dequantize(t):
    """float32 scale · (q − zero_point), per channel along the first axis where scales are."""
    q = t["data"].astype(np.int64) - t["zero_point"].reshape(-1, *[1] * (t["data"].ndim - 1))
    scale = t["scale"].reshape(-1, *[1] * (t["data"].ndim - 1))
    return (q.astype(np.float32) * scale).astype(np.float32)


def _activation(code, what):
    if code not in ACTIVATIONS:
        raise FormatError(f"{what}: fused activation {code} is not none or relu6")
    return ACTIVATIONS[code]


def graph_and_weights(tensors, operators, inputs):
    """graph.json's op list and the {name: float32 array} of its weights."""
    names = {inputs[0]: "t0"}
    ops, weights = [], {}
    for i, o in enumerate(operators):
        names[o["outputs"][0]] = f"t{i + 1}"
        out = tensors[o["outputs"][0]]
        entry = {"index": i, "input": names[o["inputs"][0]], "output": f"t{i + 1}",
                 "tflite_output": out["name"]}
        opt = o["options"]
        if o["op"] in ("CONV_2D", "DEPTHWISE_CONV_2D"):
            depthwise = o["op"] == "DEPTHWISE_CONV_2D"
            w, b = tensors[o["inputs"][1]], tensors[o["inputs"][2]]
            stride = opt.scalar(1, "i")
            if stride != opt.scalar(2, "i") or opt.scalar(0, "b") != 0:
                raise FormatError(f"op {i}: only equal strides and SAME padding are converted")
            entry.update(op="depthwise" if depthwise else "conv", stride=stride, padding="same",
                         activation=_activation(opt.scalar(4 if depthwise else 3, "b"), f"op {i}"),
                         weight=f"ops.{i}.weight", bias=f"ops.{i}.bias")
            if depthwise:  # [1, H, W, C] -> [C, 1, H, W]; the channel scales on the last axis
                q = {**w, "data": w["data"].transpose(3, 0, 1, 2)}
            else:  # [O, H, W, I] -> [O, I, H, W]
                q = {**w, "data": w["data"].transpose(0, 3, 1, 2)}
            weights[f"ops.{i}.weight"] = dequantize(q)
            weights[f"ops.{i}.bias"] = dequantize(b)
        elif o["op"] == "ADD":
            entry.update(op="add", input2=names[o["inputs"][1]],
                         activation=_activation(opt.scalar(0, "b"), f"op {i}"))
        elif o["op"] == "AVERAGE_POOL_2D":
            entry["op"] = "global_avg_pool"
        elif o["op"] in ("RESHAPE", "SQUEEZE"):
            entry["op"] = "flatten"
        else:
            entry["op"] = "softmax"
        ops.append(entry)
    return ops, weights


GRAPH_HEADER = {
    "format": "kvsim-shared mobilenet_v2 graph v1",
    "input": {"tensor": "t0", "layout": "NCHW", "size": [3, 224, 224], "color": "RGB",
              "resize": "bilinear (PIL) to 224x224",
              "normalize": "(x - 128) / 128 on 0..255 pixel values"},
    "conv_padding_same": "TensorFlow SAME: total pad max((ceil(h/s)-1)*s + k - h, 0), the "
                         "smaller half before"}
REFERENCE_IMAGES = ("grace_hopper.bmp", "parrot.jpg", "cat.bmp", "bird.bmp", "owl.jpg")
FEATURE_TENSOR = "t62"  # Conv_1's 7x7x1280 grid


def reference_outputs(directory):
    """Each photo's top-5 classes (probabilities to 5 decimals) and the Conv_1 grid's mean (6)
    and L2 norm (4), from a float32 run of the converted graph (kvsim.vlm.encoder)."""
    from PIL import Image

    from kvsim.vlm.encoder import MobileNetV2

    enc = MobileNetV2(directory)
    with open(os.path.join(directory, "imagenet_labels.txt"), encoding="utf-8") as f:
        labels = f.read().split("\n")
    out = []
    for name in REFERENCE_IMAGES:
        probs, grid = enc(enc.preprocess(Image.open(os.path.join(directory, "images", name)))[None])
        p, g = probs.numpy()[0], grid.numpy()[0]
        top = np.argsort(-p, kind="stable")[:5]
        out.append({"image": name,
                    "top5": [[int(k), labels[k], round(float(p[k]), 5)] for k in top],
                    "features": {"tensor": FEATURE_TENSOR, "shape": list(g.shape),
                                 "mean": round(float(g.mean()), 6),
                                 "l2": round(float(np.linalg.norm(g.astype(np.float64))), 4)}})
    return out


def convert(directory):
    """Writes graph.json, model.safetensors and reference_outputs.json into `directory` from its
    mobilenet_v2_1.0_224_quant.tflite (and its photos). Returns the files written."""
    tensors, operators, inputs = read_model(os.path.join(directory,
                                                         "mobilenet_v2_1.0_224_quant.tflite"))
    ops, weights = graph_and_weights(tensors, operators, inputs)
    graph = dict(GRAPH_HEADER, ops=ops)
    write_json(os.path.join(directory, "graph.json"), graph, 1, newline=False)
    write_safetensors(os.path.join(directory, "model.safetensors"), weights)
    refs = reference_outputs(directory)
    write_json(os.path.join(directory, "reference_outputs.json"), refs, 1, newline=False)
    return ["graph.json", "model.safetensors", "reference_outputs.json"]
