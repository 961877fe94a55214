#!/usr/bin/env python3
"""Runs the command blocks of the README and docs/ as written.

Every ```sh, ```bash or ```python block must follow a marker comment saying what to do with it:
  <!-- readme-check: sh -->          run it with bash -euo pipefail
  <!-- readme-check: python -->      run it with this interpreter
  <!-- readme-check: skip: REASON --> not run here (a ten-minute fuzz run, a system install, ...)
A block after `<!-- readme-check: file NAME -->` (any language) is written to NAME, and
`<!-- readme-check: setup: COMMAND -->` runs COMMAND unseen (small stand-ins for the demo trace).
Each document runs in a fresh directory where `build/` is this build, with `build` on PATH (as
`kvsim`), `python3` being this interpreter, and `build/python` on PYTHONPATH; a plain block right after a checked shell block is
its printed output, and each of its lines must have been printed.

Usage: check_docs.py BUILD_DIR FILE.md...
"""
import os
import re
import subprocess
import sys
import tempfile

FENCE = re.compile(r"^```(\w*)\s*$")
MARKER = re.compile(r"^<!-- readme-check: (sh|python|skip|file|setup)(?::?\s*(.*?))? -->\s*$")
COMMAND_LANGUAGES = {"sh", "bash", "python"}


def items(path, text):
    """The document in order: ("setup", command), ("block", marker, argument, language, body)."""
    out, pending, lines, i = [], None, text.split("\n"), 0
    while i < len(lines):
        m = MARKER.match(lines[i])
        if m and m.group(1) == "setup":
            out.append(("setup", m.group(2), i + 1))
        elif m:
            pending = (m.group(1), m.group(2) or "")
        f = FENCE.match(lines[i])
        if f:
            j = i + 1
            while j < len(lines) and not FENCE.match(lines[j]):
                j += 1
            if j == len(lines):
                sys.exit(f"{path}:{i + 1}: a code block is never closed")
            kind, argument = pending or (None, "")
            if kind is None and f.group(1) in COMMAND_LANGUAGES:
                sys.exit(f"{path}:{i + 1}: a {f.group(1)} block without a readme-check marker "
                         "(sh, python, or skip: REASON)")
            if kind == "skip" and not argument:
                sys.exit(f"{path}:{i + 1}: 'skip' needs a reason")
            out.append(("block", kind, argument, f.group(1), "\n".join(lines[i + 1:j]), i + 1))
            pending, i = None, j
        i += 1
    return out


def run(cmd, work, env, what, body):
    r = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{what} failed ({r.returncode}):\n{body}\n--- output ---\n{r.stdout}{r.stderr}")
    return r


def check(path, build):
    found = items(path, open(path, encoding="utf-8").read())
    checked = skipped = 0
    with tempfile.TemporaryDirectory() as work:
        os.symlink(build, os.path.join(work, "build"))
        # `python3` in a block is the interpreter kvsim was built for (this one), whatever else
        # the PATH holds.
        shims = os.path.join(work, ".bin")
        os.mkdir(shims)
        os.symlink(sys.executable, os.path.join(shims, "python3"))
        env = dict(os.environ, PATH=os.pathsep.join([shims, build, os.environ["PATH"]]),
                   MPLBACKEND="Agg",
                   PYTHONPATH=os.path.join(build, "python"))
        for n, item in enumerate(found):
            if item[0] == "setup":
                run(["bash", "-euo", "pipefail", "-c", item[1]], work, env,
                    f"{path}:{item[2]}: setup", item[1])
                continue
            _, kind, argument, _, body, line = item
            if kind == "file":
                with open(os.path.join(work, argument), "w", encoding="utf-8") as f:
                    f.write(body + "\n")
                continue
            if kind == "skip":
                skipped += 1
            if kind not in ("sh", "python"):
                continue
            cmd = ["bash", "-euo", "pipefail", "-c", body] if kind == "sh" else [sys.executable, "-c", body]
            r = run(cmd, work, env, f"{path}:{line}: the {kind} block", body)
            checked += 1
            following = found[n + 1] if n + 1 < len(found) else None
            if kind == "sh" and following and following[0] == "block" and following[1] is None \
                    and following[3] == "":
                printed = [l.rstrip() for l in r.stdout.split("\n")]
                for shown in following[4].split("\n"):
                    if shown.strip() and shown.rstrip() not in printed:
                        sys.exit(f"{path}:{following[5]}: the output shown has a line the command "
                                 f"did not print:\n{shown}\n--- it printed ---\n{r.stdout}")
    print(f"{path}: {checked} block(s) ran as written, {skipped} skipped with a reason")


def check_setup_builds_the_module(readme):
    """The README's Python quickstart runs after its set-up alone: when a block imports kvsim,
    the set-up script (experiments/demo.sh) must build the module (the _kvsim target) as well as
    the command, or a new user's first `import kvsim` fails."""
    blocks = [i for i in items(readme, open(readme, encoding="utf-8").read()) if i[0] == "block"]
    if not any(b[1] == "python" and "import kvsim" in b[4] for b in blocks):
        return
    demo = os.path.join(os.path.dirname(readme), "experiments", "demo.sh")
    targets = [l for l in open(demo, encoding="utf-8") if "cmake --build" in l and "--target" in l]
    if not targets or not all("_kvsim" in l for l in targets):
        built = " ".join(targets[0].split("--target", 1)[1].split()) if targets else "nothing"
        sys.exit(f"{readme}: its Python blocks import kvsim, but {demo} builds only {built}: "
                 f"add the _kvsim target")
    print(f"{readme}: the set-up builds the module its Python blocks import")


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    build = os.path.abspath(sys.argv[1])
    for path in sys.argv[2:]:
        if os.path.basename(path) == "README.md":
            check_setup_builds_the_module(path)
        check(path, build)


if __name__ == "__main__":
    main()
