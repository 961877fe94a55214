"""llama2.c's checkpoint and tokenizer -> transformers' LlamaForCausalLM layout, as kvsim live
and kvsim.vlm read it (config.json, model.safetensors, vocab.json, tokenizer.bin).

The checkpoint is llama2.c's legacy export (`legacy_export` in its export.py): seven int32s (dim,
hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, negative when the classifier is not
shared, seq_len), then float32 tensors in nn.Linear's [out, in] layout: the token embeddings, every
layer's attention RMSNorm weights, wq, wk, wv, wo, the FFN RMSNorm weights, w1, w2, w3, the final
RMSNorm weights, the RoPE tables (freq_cis real and imaginary, [seq_len, head_size / 2]: not
needed, RoPE is recomputed from rope_theta), and the classifier when unshared.

llama2.c rotates interleaved pairs (x0, x1), (x2, x3), ...; transformers rotates halves (x_i,
x_{i+d/2}). So wq and wk are permuted per head as transformers' convert_llama_weights_to_hf.py
does (`permute`): row 2i of a head becomes row i, row 2i+1 becomes row i + d/2. Without it the
logits differ and the greedy text changes.
"""
import os
import struct

import numpy as np

from kvsim.models.files import write_bytes, write_json, write_safetensors

__all__ = ["convert", "read_checkpoint", "read_tokenizer"]

HEADER = struct.Struct("<7i")

# What vocab.json says of itself: the vocabulary's encode and decode rules (kvsim.prompts).
VOCAB_FORMAT = ("llama2.c tokenizer (tokenizer.bin in this directory is the same vocabulary in "
                "llama2.c's binary layout). Encoding: dummy space prefix, one token per UTF-8 code "
                "point (unknown -> byte tokens, id = byte + 3), then repeatedly merge the adjacent "
                "pair whose concatenation has the highest score. Decoding: concatenate pieces; "
                "'<0xNN>' pieces are raw bytes; drop the leading space of the piece after BOS.")


class FormatError(Exception):
    pass


def read_checkpoint(path):
    """(header dict, {llama2.c name: float32 array}) of a legacy llama2.c checkpoint."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < HEADER.size:
        raise FormatError(f"{path}: {len(raw)} bytes, shorter than llama2.c's 28-byte header")
    dim, hidden, layers, heads, kv_heads, vocab, seq = HEADER.unpack_from(raw)
    shared = vocab > 0
    vocab = abs(vocab)
    if min(dim, hidden, layers, heads, kv_heads, vocab, seq) <= 0 or dim % heads:
        raise FormatError(f"{path}: not a llama2.c checkpoint (header dim {dim}, hidden {hidden}, "
                          f"layers {layers}, heads {heads}, kv_heads {kv_heads}, vocab {vocab}, "
                          f"seq_len {seq})")
    head = dim // heads
    kv = kv_heads * head
    shapes = [("tok_embeddings", (vocab, dim)), ("attention_norm", (layers, dim)),
              ("wq", (layers, dim, dim)), ("wk", (layers, kv, dim)), ("wv", (layers, kv, dim)),
              ("wo", (layers, dim, dim)), ("ffn_norm", (layers, dim)),
              ("w1", (layers, hidden, dim)), ("w2", (layers, dim, hidden)),
              ("w3", (layers, hidden, dim)), ("norm", (dim,)),
              ("freq_cis_real", (seq, head // 2)), ("freq_cis_imag", (seq, head // 2))]
    if not shared:
        shapes.append(("output", (vocab, dim)))
    need = HEADER.size + 4 * sum(int(np.prod(s)) for _, s in shapes)
    if len(raw) != need:
        raise FormatError(f"{path}: {len(raw)} bytes, the header implies {need}")
    tensors, offset = {}, HEADER.size
    for name, shape in shapes:
        count = int(np.prod(shape))
        tensors[name] = np.frombuffer(raw, "<f4", count, offset).reshape(shape)
        offset += 4 * count
    header = dict(dim=dim, hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads,
                  vocab=vocab, seq_len=seq, shared_classifier=shared)
    return header, tensors


def read_tokenizer(path, vocab):
    """(max_token_length, pieces, scores) of llama2.c's tokenizer.bin: an int32, then per token
    a float32 score, an int32 length and the piece's bytes."""
    with open(path, "rb") as f:
        raw = f.read()
    (longest,), offset = struct.unpack_from("<i", raw), 4
    pieces, scores = [], []
    for i in range(vocab):
        if offset + 8 > len(raw):
            raise FormatError(f"{path}: ends at token {i} of {vocab}")
        score, length = struct.unpack_from("<fi", raw, offset)
        offset += 8
        pieces.append(raw[offset:offset + length].decode("utf-8"))
        scores.append(score)
        offset += length
    if offset != len(raw):
        raise FormatError(f"{path}: {len(raw) - offset} bytes after the {vocab} tokens")
    return longest, pieces, scores


def permute_rotary(w, heads):
    """Rows of each head from interleaved pairs to halves (transformers' `permute`)."""
    out_dim, in_dim = w.shape
    return w.reshape(heads, out_dim // heads // 2, 2, in_dim).transpose(0, 2, 1, 3).reshape(
        out_dim, in_dim)


def hf_tensors(header, t):
    """{transformers name: float32 array} of a llama2.c checkpoint's tensors."""
    out = {"model.embed_tokens.weight": t["tok_embeddings"], "model.norm.weight": t["norm"]}
    if not header["shared_classifier"]:
        out["lm_head.weight"] = t["output"]
    for i in range(header["layers"]):
        pre = f"model.layers.{i}."
        out.update({
            pre + "input_layernorm.weight": t["attention_norm"][i],
            pre + "self_attn.q_proj.weight": permute_rotary(t["wq"][i], header["heads"]),
            pre + "self_attn.k_proj.weight": permute_rotary(t["wk"][i], header["kv_heads"]),
            pre + "self_attn.v_proj.weight": t["wv"][i],
            pre + "self_attn.o_proj.weight": t["wo"][i],
            pre + "post_attention_layernorm.weight": t["ffn_norm"][i],
            pre + "mlp.gate_proj.weight": t["w1"][i],
            pre + "mlp.down_proj.weight": t["w2"][i],
            pre + "mlp.up_proj.weight": t["w3"][i],
        })
    return out


def hf_config(header):
    """config.json of the converted model (rms_norm_eps 1e-5: llama2.c's, which transformers'
    default of 1e-6 is not)."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": header["dim"], "intermediate_size": header["hidden"],
            "num_hidden_layers": header["layers"], "num_attention_heads": header["heads"],
            "num_key_value_heads": header["kv_heads"], "head_dim": header["dim"] // header["heads"],
            "hidden_act": "silu", "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
            "rope_scaling": None, "attention_bias": False, "mlp_bias": False,
            "vocab_size": header["vocab"], "max_position_embeddings": header["seq_len"],
            "tie_word_embeddings": header["shared_classifier"], "bos_token_id": 1,
            "eos_token_id": 2, "torch_dtype": "float32"}


def convert(directory):
    """Writes config.json, model.safetensors, vocab.json and tokenizer.bin into `directory` from
    its llama2c/stories260K.bin and llama2c/tok512.bin. Returns the files written."""
    source = os.path.join(directory, "llama2c")
    header, tensors = read_checkpoint(os.path.join(source, "stories260K.bin"))
    longest, pieces, scores = read_tokenizer(os.path.join(source, "tok512.bin"), header["vocab"])
    write_json(os.path.join(directory, "config.json"), hf_config(header), 2)
    write_safetensors(os.path.join(directory, "model.safetensors"), hf_tensors(header, tensors),
                      {"format": "pt"})
    write_json(os.path.join(directory, "vocab.json"),
                {"format": VOCAB_FORMAT, "unk_id": 0, "bos_id": 1, "eos_id": 2,
                 "max_token_length": longest, "pieces": pieces, "scores": scores}, 1,
               ascii_only=False)
    with open(os.path.join(source, "tok512.bin"), "rb") as f:
        write_bytes(os.path.join(directory, "tokenizer.bin"), [f.read()])
    return ["config.json", "model.safetensors", "vocab.json", "tokenizer.bin"]
