"""Trains the eight-box VLM (kvsim.vlm.multi) for several seeds and recipes at once on one GPU,
and measures a validation accuracy at milestones, so that the number of steps a recipe needs is
read off one run: the learning rate is constant, so the weights after step n are those of a
build of n steps.

Each (recipe, seed) runs in its own process on the GPU. At every milestone it greedily answers
`--val-items` items built from training-split images outside its training pool (never the
held-out test images) and keeps the weights. At the end, for each recipe, the smallest milestone
at which every seed answers at least `--target` of its validation items (else the last one) is
chosen, and those weights are packed into OUT/multi_weights_<recipe>.tar.gz:
    <recipe>-seed<k>/{decoder,projector}.safetensors, training.json   (kvsim.vlm.multi.save_weights)
and OUT/results.json holds every milestone's validation accuracy, per recipe and seed.
Back on any machine, the build evaluates them on the held-out items and writes its prompts:
    python -m kvsim.vlm build-multi --weights DIR/<recipe>-seed<k>
(the settings, and so the cache key, are those of its training.json). Each process holds up to
~10 GiB of GPU memory: five fit an 80 GB H100, ten did not.

    python3 experiments/vlm_multi_gpu.py --models shared-models --out $OUT \\
        --recipe base: --recipe fast:decoder_lr=0.001 --seeds 0-4 --seconds 300
"""
import argparse
import json
import multiprocessing as mp
import os
import sys
import tarfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
# The source tree's package only where no built one is importable (on the CPU the attention
# needs the built C++ module: PYTHONPATH=build/python).
sys.path.append(os.path.join(HERE, "..", "python"))


def parse_recipe(text, defaults):
    """'name:key=value,key=value' -> (name, {key: value}) typed as the defaults."""
    name, _, rest = text.partition(":")
    out = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        if key not in defaults:
            raise SystemExit(f"--recipe {text!r}: unknown setting {key!r}")
        out[key] = type(defaults[key])(value)
    return name, out


def validation(settings, encoder, task, count, rng_seed=12345):
    """Items of training-split images outside the training pool: (features, labels, items)."""
    from kvsim.vlm import data, multi
    from kvsim.vlm.assemble import image_tokens

    train_x, train_y = data.read_fashion_mnist("train")
    pool = set(data.balanced_subset(train_y, settings["train_per_class"], settings["seed"]))
    rng = np.random.default_rng(rng_seed)
    chosen = []
    for c in range(10):
        outside = [i for i in np.flatnonzero(train_y == c) if i not in pool]
        chosen += list(rng.choice(outside, size=settings["test_per_class"], replace=False))
    chosen = np.array(sorted(chosen))
    labels = train_y[chosen].astype(int)
    items = multi._draw_items(rng, labels, count, task.images, kind=task.kind)
    return image_tokens(encoder, train_x[chosen]), labels, items


def run_one(args):
    name, seed, recipe, opts = args
    import torch

    from kvsim.vlm import multi

    # multi.setup makes a CUDA run deterministic (cuBLAS workspace, deterministic algorithms,
    # no TF32): two runs of one recipe and seed on one GPU give the same weights.
    settings = dict(recipe, seed=seed, device=opts["device"], threads=opts["threads"],
                    steps=opts["milestones"][-1])
    settings, encoder, dec, vocab, task, _ = multi.setup(opts["models"], settings)
    log_path = os.path.join(opts["work"], f"{name}-seed{seed}.log")
    log_file = open(log_path, "w", encoding="utf-8")

    def log(msg):
        print(msg, file=log_file, flush=True)

    t0 = time.time()
    train_f, train_labels, _, _ = multi.image_pools(settings, encoder, log)
    val_f, val_labels, val_items = validation(settings, encoder, task, opts["val_items"])
    at = dec.params["model.embed_tokens.weight"].device
    val_t = torch.from_numpy(val_f).to(at)
    t_encode = time.time() - t0
    record = {"recipe": name, "seed": seed, "milestones": [], "encode_seconds": t_encode}
    start = time.time()

    class Stop(Exception):
        pass

    def milestone(step, proj, losses):
        if step not in opts["milestones"]:
            if time.time() - start > opts["seconds"]:
                raise Stop()
            return
        with torch.no_grad():
            rows = proj(val_t)
        answers = multi._greedy(dec, task, val_items, lambda idx: rows[torch.as_tensor(
            idx, device=at)], settings["max_answer_tokens"], batch=64)
        truth = np.array([task.answer(t, idx, val_labels) for t, idx in val_items])
        _, right, _ = multi._accuracy(vocab, answers, truth, task.words)
        seconds = time.time() - start
        entry = {"step": step, "val_accuracy": float(right.mean()), "seconds": round(seconds, 1)}
        record["milestones"].append(entry)
        log(json.dumps(entry))
        keep = dict(settings, steps=step)
        multi.save_weights(os.path.join(opts["work"], f"{name}-seed{seed}-{step}"), dec, proj, {
            "settings": keep, "losses": list(losses), "seconds": round(seconds, 1),
            "device_name": multi._device_name(settings["device"]), "torch": torch.__version__})
        if seconds > opts["seconds"]:
            raise Stop()

    try:
        # On the CPU: OpenBLAS on the threads, PyTorch on one (no effect on a GPU).
        with multi.cpu_threads(dec, settings["threads"]):
            multi._train(settings, dec, task, train_f, train_labels, log, milestone=milestone)
    except Stop:
        pass
    record["train_log"] = log_path
    with open(log_path, encoding="utf-8") as f:
        record["loss_lines"] = [line.strip() for line in f if line.startswith("step ")]
    return record


def main():
    from kvsim.vlm import multi

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--recipe", action="append", required=True,
                    help="NAME:key=value,... (settings of kvsim.vlm.multi)")
    ap.add_argument("--seeds", default="0-4")
    ap.add_argument("--milestones", default="1000,2000,3000,4000,6000,8000,10000,12000,16000")
    ap.add_argument("--seconds", type=float, default=300, help="stop at the first step past "
                    "this many seconds of training (the milestones reached by then are kept)")
    ap.add_argument("--val-items", type=int, default=200)
    ap.add_argument("--target", type=float, default=0.85)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads of each process (on the "
                    "CPU: a single seed can take every core)")
    a = ap.parse_args()
    lo, _, hi = a.seeds.partition("-")
    seeds = list(range(int(lo), int(hi or lo) + 1))
    recipes = [parse_recipe(r, multi.MULTI_DEFAULTS) for r in a.recipe]
    work = os.path.join(a.out, "work") if a.device == "cpu" else "/tmp/vlm_multi_work"
    os.makedirs(work, exist_ok=True)
    opts = {"models": a.models, "work": work, "device": a.device, "seconds": a.seconds,
            "threads": a.threads,
            "val_items": a.val_items, "milestones": [int(m) for m in a.milestones.split(",")]}
    jobs = [(name, seed, recipe, opts) for name, recipe in recipes for seed in seeds]
    t0 = time.time()
    with mp.get_context("spawn").Pool(len(jobs)) as pool:
        records = pool.map(run_one, jobs)
    results = {"seconds": round(time.time() - t0, 1), "target": a.target, "recipes": {}}
    chosen = []
    for name, recipe in recipes:
        mine = [r for r in records if r["recipe"] == name]
        common = sorted(set.intersection(*[{m["step"] for m in r["milestones"]} for r in mine]))
        pick = next((s for s in common if all(
            next(m for m in r["milestones"] if m["step"] == s)["val_accuracy"] >= a.target
            for r in mine)), common[-1] if common else None)
        results["recipes"][name] = {"settings": recipe, "chosen_steps": pick, "runs": mine}
        if pick is not None:
            chosen += [(f"{name}-seed{r['seed']}", f"{name}-seed{r['seed']}-{pick}") for r in mine]
        print(f"{name}: chosen steps {pick}; " + "; ".join(
            f"seed {r['seed']}: " + " ".join(f"{m['step']}:{m['val_accuracy']:.2f}"
                                             for m in r["milestones"]) for r in mine), flush=True)
    with open(os.path.join(a.out, "results.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    for name, _ in recipes:  # one archive per recipe: each stays small enough to carry
        with tarfile.open(os.path.join(a.out, f"multi_weights_{name}.tar.gz"), "w:gz") as tar:
            for arc, folder in chosen:
                if arc.startswith(f"{name}-seed"):
                    tar.add(os.path.join(work, folder), arcname=arc)


if __name__ == "__main__":
    main()
