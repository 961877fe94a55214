"""Prompt files (kvprompt v1, the input of `kvsim live capture` and `live evaluate`) from token
ids, or from text through any tokenizer, and a reader of llama2.c vocabularies (stories260K's).

    from kvsim import prompts
    vocab = prompts.Llama2cVocab("stories260K/vocab.json")
    prompts.write("p.h5", prompts.from_texts(vocab.encode, ["Once upon a time"],
                                             references=[" there was a girl."], bos=vocab.bos_id))

    python -m kvsim.prompts --vocab stories260K/vocab.json --jsonl stories.jsonl -o p.h5

The start token is never guessed: from_texts prepends `bos` when it is given and the tokenizer's
ids do not already start with it (transformers' tokenizers add it themselves; llama2.c's encoder
does not), and leaves the ids alone when `bos` is None. References are tokenized without it.
Needs h5py.
"""
import argparse
import json
import os
import sys

import numpy as np

__all__ = ["write", "from_texts", "Llama2cVocab", "load_tokenizer", "main"]

_OPTIONAL = {"modality": np.uint8, "segment": np.uint8, "media_id": np.int32,
             "reference_ids": np.int32}


def _check(name, sample):
    if "token_ids" not in sample:
        raise ValueError(f"sample '{name}': token_ids is required")
    ids = np.asarray(sample["token_ids"])
    if ids.ndim != 1 or len(ids) == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"sample '{name}': token_ids must be a non-empty 1-D array of integers")
    if ids.min() < 0:
        raise ValueError(f"sample '{name}': token_ids holds a negative id")
    unknown = set(sample) - set(_OPTIONAL) - {"token_ids", "inputs_embeds", "position_ids",
                                              "task", "reference", "question_len",
                                              "context_id"}
    if unknown:
        raise ValueError(f"sample '{name}': unknown field(s) {sorted(unknown)}")
    for key in ("modality", "segment", "media_id"):
        if key in sample and len(np.asarray(sample[key])) != len(ids):
            raise ValueError(f"sample '{name}': {key} has {len(np.asarray(sample[key]))} values "
                             f"for {len(ids)} prompt tokens")
    if "inputs_embeds" in sample:
        rows = int((np.asarray(sample.get("modality", np.zeros(len(ids)))) != 0).sum())
        embeds = np.asarray(sample["inputs_embeds"])
        if embeds.ndim != 2 or embeds.shape[0] != rows:
            raise ValueError(f"sample '{name}': inputs_embeds needs one row per non-text "
                             f"position ({rows}), has shape {embeds.shape}")
    if sample.get("position_ids") is not None:
        pos = np.asarray(sample["position_ids"])
        if pos.shape != (len(ids), 3) or not np.issubdtype(pos.dtype, np.integer) or \
                (pos.size and pos.min() < 0):
            raise ValueError(f"sample '{name}': position_ids must be non-negative integers of "
                             f"shape [{len(ids)}, 3] (M-RoPE), has shape {pos.shape}")
    q = sample.get("question_len")
    if q is not None and not 0 <= int(q) <= len(ids):
        raise ValueError(f"sample '{name}': question_len {q} is not in [0, {len(ids)}]")


def write(path, samples, model="", force=False):
    """Writes a kvprompt v1 file. samples: {name: {"token_ids": [...], optional "modality",
    "segment", "media_id" (one per prompt token), "inputs_embeds" [non-text positions, hidden],
    "position_ids" [P, 3] (M-RoPE), "reference_ids", "task", "reference", "question_len",
    "context_id" (samples naming one context_id share the prompt less their question: several
    questions on one context)}}, or a list of such dicts (or of token-id lists), named 000000,
    000001, ... Everything is checked before anything is written;
    errors name the sample. The file appears under its name only when complete. An existing
    prompt file at `path` is replaced only with force=True, any other kvtrace or kvprompt file
    never (FileExistsError)."""
    import h5py

    from kvsim._kvsim import check_outputs

    if isinstance(samples, (list, tuple)):
        samples = {f"{i:06d}": s if isinstance(s, dict) else {"token_ids": s}
                   for i, s in enumerate(samples)}
    if not samples:
        raise ValueError("no samples to write")
    for name, sample in samples.items():
        if "/" in name or not name:
            raise ValueError(f"sample name {name!r}: must be non-empty and without '/'")
        _check(name, sample)
    check_outputs([(path, "path", "prompts")], force=force)
    partial = path + ".partial"
    try:
        with h5py.File(partial, "w") as f:
            f.attrs["kvprompt_version"] = np.int32(1)
            if model:
                f.attrs["model"] = model
            for name, sample in samples.items():
                g = f.create_group(f"samples/{name}")
                g["token_ids"] = np.asarray(sample["token_ids"], dtype=np.int32)
                for key, dtype in _OPTIONAL.items():
                    if key in sample and sample[key] is not None:
                        g[key] = np.asarray(sample[key], dtype=dtype)
                if sample.get("position_ids") is not None:
                    g["position_ids"] = np.asarray(sample["position_ids"], dtype=np.int32)
                if "inputs_embeds" in sample:
                    embeds = np.asarray(sample["inputs_embeds"])
                    g["inputs_embeds"] = embeds.astype(
                        embeds.dtype if embeds.dtype in (np.float16, np.float32) else np.float32)
                for key in ("task", "reference", "context_id"):
                    if sample.get(key):
                        g.attrs[key] = str(sample[key])
                if sample.get("question_len") is not None:
                    g.attrs["question_len"] = np.int32(sample["question_len"])
        os.replace(partial, path)
    except BaseException:
        if os.path.exists(partial):
            os.remove(partial)
        raise
    return path


def from_texts(tokenize, texts, references=None, bos=None, names=None, task=""):
    """Samples for write() from text: tokenize(text) -> ids (any tokenizer callable:
    transformers' AutoTokenizer(...).encode, Llama2cVocab.encode, ...). bos: the start-token id
    to put first (when the ids do not already start with it), or None to use the ids as they
    come. references: one continuation per text, tokenized without a start token and stored as
    reference_ids (scored by `kvsim live evaluate`)."""
    def ids_of(text, first):
        ids = [int(i) for i in tokenize(text)]
        if first and bos is not None and (not ids or ids[0] != bos):
            ids = [int(bos)] + ids
        if not first and bos is not None and ids and ids[0] == bos:
            ids = ids[1:]
        return ids

    texts = list(texts)
    if references is not None and len(references) != len(texts):
        raise ValueError(f"{len(texts)} texts but {len(references)} references")
    names = list(names) if names is not None else [f"{i:06d}" for i in range(len(texts))]
    out = {}
    for i, (name, text) in enumerate(zip(names, texts)):
        sample = {"token_ids": ids_of(text, True)}
        if references is not None:
            sample["reference_ids"] = ids_of(references[i], False)
            sample["reference"] = references[i]
        if task:
            sample["task"] = task
        out[name] = sample
    return out


class Llama2cVocab:
    """A llama2.c vocabulary (vocab.json beside a converted checkpoint, as stories260K has): its
    encoder and decoder, as llama2.c's run.c defines them. encode(text) prepends the dummy space,
    maps each UTF-8 code point to its piece (unknown ones to byte pieces, id = byte + 3), then
    merges the adjacent pair whose concatenation scores highest until none is in the vocabulary;
    no BOS is added. decode(ids) concatenates pieces, '<0xNN>' as raw bytes, and drops the leading
    space of the piece after BOS."""

    def __init__(self, path):
        if os.path.isdir(path):
            path = os.path.join(path, "vocab.json")
        with open(path, encoding="utf-8") as f:
            v = json.load(f)
        try:
            self.pieces, self.scores = list(v["pieces"]), list(v["scores"])
            self.bos_id, self.eos_id = int(v["bos_id"]), int(v["eos_id"])
        except KeyError as e:
            raise ValueError(f"{path}: not a llama2.c vocabulary (no {e})") from None
        self._ids = {}
        for i, p in enumerate(self.pieces):
            self._ids.setdefault(p, i)

    def __len__(self):
        return len(self.pieces)

    def encode(self, text):
        ids = []
        for ch in " " + text:
            if ch in self._ids:
                ids.append(self._ids[ch])
            else:
                ids.extend(b + 3 for b in ch.encode("utf-8"))
        while True:
            best, at = None, -1
            for i in range(len(ids) - 1):
                merged = self._ids.get(self.pieces[ids[i]] + self.pieces[ids[i + 1]])
                if merged is not None and (best is None or self.scores[merged] > self.scores[best]):
                    best, at = merged, i
            if best is None:
                return ids
            ids[at:at + 2] = [best]

    def __call__(self, text):
        return self.encode(text)

    def decode(self, ids):
        out, prev = bytearray(), None
        for i in ids:
            piece = self.pieces[int(i)]
            if prev == self.bos_id and piece.startswith(" "):
                piece = piece[1:]
            if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                out.append(int(piece[3:5], 16))
            elif int(i) not in (self.bos_id, self.eos_id):
                out.extend(piece.encode("utf-8"))
            prev = int(i)
        return out.decode("utf-8", errors="replace")


def load_tokenizer(path):
    """A tokenizer callable (text -> ids) for a checkpoint directory: its llama2.c vocabulary
    (vocab.json in that format, as stories260K has), else transformers' AutoTokenizer when
    transformers is installed (its encode, which adds the model's start token itself). Returns
    (tokenize, bos_id)."""
    vocab_json = os.path.join(path, "vocab.json") if os.path.isdir(path) else path
    if os.path.exists(vocab_json):
        try:
            vocab = Llama2cVocab(vocab_json)
            return vocab.encode, vocab.bos_id
        except (ValueError, KeyError, json.JSONDecodeError):
            pass  # a transformers tokenizer's vocab.json: another format
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ValueError(f"{path}: no llama2.c vocab.json, and transformers (for AutoTokenizer) "
                         "is not installed") from None
    tok = AutoTokenizer.from_pretrained(path)
    return tok.encode, tok.bos_token_id


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="python -m kvsim.prompts",
        description="Write a kvprompt v1 file from text (tokenized with a llama2.c vocabulary) or "
                    "from token ids.",
        epilog="examples:\n"
               "  python -m kvsim.prompts --vocab stories260K/vocab.json --text 'Once upon a time'"
               " -o p.h5\n"
               "  python -m kvsim.prompts --vocab stories260K/vocab.json --jsonl stories.jsonl "
               "-o p.h5   # lines {\"name\", \"prompt\", \"reference\"}\n"
               "  python -m kvsim.prompts --ids 1,403,407 -o p.h5",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--out", required=True, help="kvprompt file to write")
    ap.add_argument("--vocab", "--tokenizer", dest="vocab",
                    help="the model's tokenizer: a llama2.c vocab.json (or its directory), else a "
                         "directory transformers' AutoTokenizer loads")
    ap.add_argument("--text", action="append", default=[], help="a prompt (repeatable)")
    ap.add_argument("--jsonl", help="one JSON object per line: prompt, optional name, reference")
    ap.add_argument("--ids", action="append", default=[], help="comma-separated token ids")
    ap.add_argument("--no-bos", action="store_true", help="do not put the start token first")
    ap.add_argument("--model", default="", help="the file's model attribute")
    ap.add_argument("--force", action="store_true", help="replace an existing prompt file at --out")
    a = ap.parse_args(argv)
    samples = {f"{i:06d}": {"token_ids": [int(x) for x in ids.split(",")]}
               for i, ids in enumerate(a.ids)}
    if a.text or a.jsonl:
        if not a.vocab:
            ap.error("--text and --jsonl need --vocab")
        try:
            tokenize, bos_id = load_tokenizer(a.vocab)
        except ValueError as e:
            sys.exit(f"python -m kvsim.prompts: {e}")
        bos = None if a.no_bos else bos_id
        rows = [{"prompt": t} for t in a.text]
        if a.jsonl:
            with open(a.jsonl, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if line.strip():
                        try:
                            rows.append(json.loads(line))
                        except json.JSONDecodeError as e:
                            ap.error(f"{a.jsonl}:{n}: {e}")
        names = [r.get("name", f"{len(samples) + i:06d}") for i, r in enumerate(rows)]
        refs = [r.get("reference", "") for r in rows]
        samples.update(from_texts(tokenize, [r["prompt"] for r in rows],
                                  references=refs if any(refs) else None, bos=bos, names=names))
    if not samples:
        ap.error("give --text, --jsonl or --ids")
    try:
        write(a.out, samples, model=a.model, force=a.force)
    except (ValueError, OSError) as e:
        sys.exit(f"python -m kvsim.prompts: {e}")
    print(f"wrote {a.out}: {len(samples)} sample(s)")


if __name__ == "__main__":
    main()
