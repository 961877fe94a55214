"""`python -m kvsim ARGS` and the `kvsim` command of a pip installation: the kvsim command line
(`kvsim --help`), run from the binary installed inside the package, with `kvsim figures` using
this interpreter, which imports this package's figures module (kvsim.report.figures)."""
import os
import shutil
import sys


def binary():
    here = os.path.dirname(os.path.abspath(__file__))
    inside = os.path.join(here, "bin", "kvsim")
    if os.path.exists(inside):
        return inside
    found = os.environ.get("KVSIM_BINARY") or shutil.which("kvsim")
    if found and os.path.realpath(found) != os.path.realpath(sys.argv[0]):
        return found
    sys.exit("kvsim: the kvsim command is not installed with this package (build it with "
             "`pip install .` or CMake; KVSIM_BINARY may name it)")


def main():
    path = binary()
    env = dict(os.environ)
    env.setdefault("KVSIM_PYTHON", sys.executable)
    os.execve(path, [path] + sys.argv[1:], env)


if __name__ == "__main__":
    main()
