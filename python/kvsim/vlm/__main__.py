"""python -m kvsim.vlm: build (or find in the cache) the assembled VLM and print where it is."""
import argparse
import json
import os
import sys

from kvsim.models import default_models


HELPS = {"build": "build or find the model",
         "build-multi": "build or find the model (eight boxes, a question about one)",
         "train-multi": "train the eight-box weights here and write them to --out"}


def _parser(kinds, cache_root):
    ap = argparse.ArgumentParser(
        prog="python -m kvsim.vlm",
        description="Build the assembled VLM (MobileNetV2 -> trained projector -> stories260K, on "
                    "Fashion-MNIST; an assembled toy, not a production VLM), or find it in the "
                    "cache, and print its directory on the last line. `build` is the single-image "
                    "task with a frozen decoder; `build-multi` the eight-box task (a question about "
                    "one of eight images; --set task=count: how many boxes hold a class), with "
                    "the decoder fine-tuned; `train-multi` trains "
                    "the eight-box weights only and writes them to a folder `build-multi "
                    "--weights` reads.",
        epilog="examples:\n"
               "  python -m kvsim.vlm build --models ~/models   # after kvsim.models fetch\n"
               "  python -m kvsim.vlm build --small            # the CI setting (~9 s; at chance)\n"
               "  python -m kvsim.vlm build --set epochs=8 --set train_per_class=300\n"
               "  python -m kvsim.vlm build-multi --set seed=1\n"
               "  python -m kvsim.vlm build-multi --weights experiments/weights/vlm_multi/"
               "base-seed0\n"
               "  python -m kvsim.vlm train-multi --set seed=0 --set steps=4000 --out w/base-seed0\n"
               "  python -m kvsim.vlm train-multi --set task=count --set steps=4000 "
               "--out w/count-seed0\n"
               "outputs (in the directory printed): model/ (a LlamaForCausalLM checkpoint for "
               "kvsim live), prompts.h5 and the controls' prompts_*.h5, projector.safetensors, "
               "build.json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    for name, (_, defaults, _) in kinds.items():
        b = sub.add_parser(name, help=HELPS[name])
        b.add_argument("--models", default=default_models(),
                       help="folder holding mobilenet_v2/ and stories260K/ (default: "
                            "$KVSIM_MODELS, else the checkout's models/; `python -m kvsim.models "
                            "fetch` puts them there)")
        b.add_argument("--small", action="store_true", help="the small CI setting")
        b.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help=f"a build setting (repeatable); keys: {', '.join(defaults)}")
        if name == "train-multi":
            b.add_argument("--out", required=True,
                           help="folder to write the weights to (must not exist)")
            b.add_argument("--quiet", action="store_true", help="print only the folder")
            continue
        b.add_argument("--out", help="directory to write (default: the cache, "
                                     f"{cache_root}/<key>)")
        b.add_argument("--force", action="store_true", help="rebuild even when cached")
        if name == "build-multi":
            b.add_argument("--weights", metavar="DIR",
                           help="weights trained elsewhere (experiments/vlm_multi_gpu.py): "
                                "evaluate them here and write the prompts, with the settings "
                                "of DIR/training.json")
        b.add_argument("--quiet", action="store_true", help="print only the directory")
    return ap


def _settings(ap, a, defaults, small):
    """The build's settings: the small setting or none, those of --weights' training.json, then
    every --set (each checked against the defaults' keys and types)."""
    settings = dict(small if a.small else {})
    weights = getattr(a, "weights", None)
    if weights:
        try:
            with open(os.path.join(weights, "training.json"), encoding="utf-8") as f:
                settings = json.load(f)["settings"]
        except (OSError, ValueError, KeyError) as e:
            ap.error(f"--weights {weights}: no readable training.json with settings ({e})")
    for item in a.set:
        key, _, value = item.partition("=")
        if key not in defaults or not value:
            ap.error(f"--set {item!r}: expected KEY=VALUE with KEY one of {list(defaults)}")
        try:
            settings[key] = type(defaults[key])(value)
        except ValueError:
            ap.error(f"--set {item!r}: {value!r} is not a {type(defaults[key]).__name__}")
    return settings


def _print_accuracy(out):
    with open(os.path.join(out, "build.json"), encoding="utf-8") as f:
        r = json.load(f)
    n = r.get("test_images", r.get("test_items"))
    controls = ", ".join(f"{c.replace('_', ' ')} {r[c]['accuracy']:.3f}"
                         for c in ("no_image", "swapped", "shuffled") if c in r)
    print(f"held-out accuracy {r['full']['accuracy']:.3f} over {n} items; controls: "
          f"{controls}", file=sys.stderr)


def main(argv=None):
    from kvsim.vlm import assemble, multi

    kinds = {"build": (assemble.build, assemble.DEFAULTS, assemble.SMALL),
             "build-multi": (multi.build_multi, multi.MULTI_DEFAULTS, multi.MULTI_SMALL),
             "train-multi": (multi.train_multi, multi.MULTI_DEFAULTS, multi.MULTI_SMALL)}
    ap = _parser(kinds, assemble.cache_root())
    a = ap.parse_args(argv)
    build, defaults, small = kinds[a.command]
    if not os.path.isdir(a.models):
        ap.error(f"no models folder {a.models} (python -m kvsim.models fetch --models "
                 f"{a.models}, or set KVSIM_MODELS)")
    settings = _settings(ap, a, defaults, small)
    weights = getattr(a, "weights", None)
    log = (lambda *_: None) if a.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    try:
        if a.command == "train-multi":
            out = build(a.models, settings, out=a.out, log=log)
        else:
            extra = {"weights": weights} if weights else {}
            out = build(a.models, settings, out=a.out, log=log, force=a.force, **extra)
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"python -m kvsim.vlm: {e}")
    if not a.quiet and a.command != "train-multi":
        _print_accuracy(out)
    print(out)


if __name__ == "__main__":
    main()
