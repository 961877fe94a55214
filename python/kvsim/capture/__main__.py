"""python -m kvsim.capture --model DIR --prompts FILE.jsonl --out trace.h5: capture a kvtrace v1
file from a Hugging Face transformers checkpoint (kvsim.capture.hf), greedy, full cache."""
import argparse
import json
import importlib.util
import sys


def missing_modules(names):
    """The modules of `names` this interpreter cannot import, in order."""
    return [n for n in names if importlib.util.find_spec(n) is None]


def load(model_dir, device, dtype):
    """The model (image-text-to-text, vision-to-sequence or causal LM, in that order) and its
    processor (else its tokenizer)."""
    import torch
    import transformers

    torch_dtype = {"float32": torch.float32, "float16": torch.float16,
                   "bfloat16": torch.bfloat16}[dtype]
    model = None
    for cls in ("AutoModelForImageTextToText", "AutoModelForVision2Seq", "AutoModelForCausalLM"):
        auto = getattr(transformers, cls, None)
        if auto is None:
            continue
        try:
            model = auto.from_pretrained(model_dir, torch_dtype=torch_dtype)
            break
        except (ValueError, KeyError):
            continue
    if model is None:
        sys.exit(f"python -m kvsim.capture: {model_dir}: no transformers model class loads it")
    try:
        processor = transformers.AutoProcessor.from_pretrained(model_dir)
    except (OSError, ValueError):
        processor = transformers.AutoTokenizer.from_pretrained(model_dir)
    return model.to(device), processor


def read_prompts(path, references=None, reference_field="reference"):
    """JSON lines: {"name", "text" | "messages", optional "images", "videos" (paths), "task", and
    the reference answer under `reference_field`}. `references`: a text file of one reference
    answer per line, in the prompts' order (it sets each prompt's `reference_field`)."""
    prompts = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                p = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"python -m kvsim.capture: {path}:{n}: {e}")
            if "images" in p:
                from PIL import Image
                p["images"] = [Image.open(x).convert("RGB") for x in p["images"]]
            prompts.append(p)
    if references:
        with open(references, encoding="utf-8") as f:
            answers = [line.rstrip("\n") for line in f]
        while answers and not answers[-1]:
            answers.pop()
        if len(answers) != len(prompts):
            sys.exit(f"python -m kvsim.capture: {references} has {len(answers)} reference(s) for "
                     f"the {len(prompts)} prompt(s) of {path}: one line per prompt, in order")
        for p, answer in zip(prompts, answers):
            p[reference_field] = answer
    return prompts


def _parser():
    ap = argparse.ArgumentParser(
        prog="python -m kvsim.capture", description=__doc__.split("\n")[0],
        epilog="example:\n  python -m kvsim.capture --model llava-1.5-7b-hf --prompts p.jsonl "
               "--out trace.h5 --gen 32 --device cuda --prompts-out p.h5\n"
               "  p.jsonl, one prompt per line; {\"type\": \"image\"} is where the image goes "
               "(the same for LLaVA and Qwen2-VL), \"reference\" the answer kvsim live "
               "evaluate scores:\n"
               "  {\"name\": \"000000\", \"messages\": [{\"role\": \"user\", \"content\": "
               "[{\"type\": \"image\"}, {\"type\": \"text\", \"text\": \"What animal is "
               "this? Answer in one word.\"}]}], \"images\": [\"cat.jpg\"], \"reference\": "
               "\"cat\"}",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="checkpoint directory")
    ap.add_argument("--prompts", required=True, help="JSON lines, one prompt each")
    ap.add_argument("--out", required=True, help="kvtrace v1 file to write")
    ap.add_argument("--force", action="store_true",
                    help="replace an existing kvtrace (and --prompts-out prompt) file")
    ap.add_argument("--gen", type=int, default=32, help="decode steps recorded per prompt")
    ap.add_argument("--device", default="cpu", help="torch device (cpu, cuda, cuda:1, ...)")
    ap.add_argument("--model-dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--dtype", default="float16", choices=["float16", "float32"],
                    help="stored element type")
    ap.add_argument("--prompts-out", help="also write the prompts as a kvprompt file (token ids, "
                                          "the language model's input embeddings at the image "
                                          "positions, M-RoPE position ids) for kvsim live")
    ap.add_argument("--reference-field", default="reference", metavar="FIELD",
                    help="the prompts' field holding the reference answer (a dataset's answer "
                         "column; the first of a list), written with --prompts-out for kvsim "
                         "live evaluate's accuracy and ΔNLL (default: reference)")
    ap.add_argument("--references", metavar="FILE",
                    help="reference answers beside the prompts: one line per prompt, in order")
    ap.add_argument("--compact", type=int, metavar="WINDOW", default=0,
                    help="write a compact trace: each layer's prompt statistics computed as the "
                         "model runs, only the query rows windows of up to WINDOW prompt rows read kept (kvsim compact; "
                         "64 serves every policy at its defaults)")
    ap.add_argument("--no-entropies", action="store_true",
                    help="with --compact: leave out MEDA's prompt entropies")
    ap.add_argument("--stats-on-device", action="store_true",
                    help="with --compact: compute the statistics with torch on --device (a GPU), "
                         "the prompt's queries never copied to the host; equal to float32 "
                         "rounding, not bit for bit; implies --no-entropies")
    ap.add_argument("-j", "--threads", type=int, default=0, metavar="N",
                    help="with --compact: host threads for the statistics (default 0: every "
                         "core, as kvsim compact; the file does not depend on it)")
    return ap


def main(argv=None):
    ap = _parser()
    a = ap.parse_args(argv)
    if a.stats_on_device and not a.compact:
        ap.error("--stats-on-device needs --compact WINDOW")
    if a.threads < 0:
        ap.error(f"--threads {a.threads}: 0 (every core) or more")
    missing = missing_modules(("torch", "transformers"))
    if missing:
        sys.exit(f"python -m kvsim.capture needs {' and '.join(missing)}, which this interpreter "
                 f"({sys.executable}) lacks; neither torch nor transformers is a dependency of "
                 f"kvsim itself")
    from kvsim._kvsim import check_outputs

    from .hf import capture_pretrained

    try:  # before the model loads: an output in the way is named at once
        check_outputs([(a.out, "--out", "trace"), (a.prompts_out or "", "--prompts-out", "prompts")],
                      [(a.model, "model"), (a.prompts, "prompts"), (a.references or "", "references")],
                      force=a.force)
    except OSError as e:
        sys.exit(f"python -m kvsim.capture: {e}")
    model, processor = load(a.model, a.device, a.model_dtype)
    prompts = read_prompts(a.prompts, a.references, a.reference_field)
    capture_pretrained(model, processor, prompts, a.out, gen=a.gen, dtype=a.dtype,
                       prompts_out=a.prompts_out, compact_window=a.compact or None,
                       compact_entropies=not (a.no_entropies or a.stats_on_device),
                       compact_on_device=a.stats_on_device, compact_threads=a.threads,
                       reference_field=a.reference_field, force=a.force,
                       progress=lambda i, n: print(f"\rcapture: {i}/{n} prompts", end="",
                                                   file=sys.stderr))
    print(f"\nwrote {a.out}: {len(prompts)} prompt(s)", file=sys.stderr)


if __name__ == "__main__":
    main()
