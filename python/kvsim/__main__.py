"""`python -m kvsim ARGS` and the `kvsim` command of a pip installation: the kvsim command line
(`kvsim --help`), run from the binary installed inside the package, with `kvsim figures` using
this interpreter and the figures code installed beside it."""
import os
import shutil
import sys


def binary():
    here = os.path.dirname(os.path.abspath(__file__))
    inside = os.path.join(here, "bin", "kvsim")
    if os.path.exists(inside):
        return inside, os.path.join(here, "analysis")
    found = os.environ.get("KVSIM_BINARY") or shutil.which("kvsim")
    if found and os.path.realpath(found) != os.path.realpath(sys.argv[0]):
        return found, None
    sys.exit("kvsim: the kvsim command is not installed with this package (build it with "
             "`pip install .` or CMake; KVSIM_BINARY may name it)")


def main():
    path, analysis = binary()
    env = dict(os.environ)
    env.setdefault("KVSIM_PYTHON", sys.executable)
    if analysis:
        env.setdefault("KVSIM_ANALYSIS_DIR", analysis)
    os.execve(path, [path] + sys.argv[1:], env)


if __name__ == "__main__":
    main()
