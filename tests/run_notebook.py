#!/usr/bin/env python3
"""Executes a notebook of the repository top to bottom with Jupyter's nbclient, in a kernel of
this interpreter, and fails on the first cell that raises. The repository keeps notebooks
without outputs: one that holds outputs fails too (clear them before committing).

Usage: run_notebook.py NOTEBOOK.ipynb OUT_DIR   (OUT_DIR/NAME.executed.ipynb: the run)
"""
import json
import os
import sys
import tempfile

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError


def main():
    path, out = sys.argv[1], sys.argv[2]
    nb = nbformat.read(path, as_version=4)
    kept = [i for i, c in enumerate(nb.cells)
            if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count"))]
    if kept:
        sys.exit(f"{path}: cells {kept} hold outputs; the repository keeps notebooks without "
                 "them (Kernel > Restart & Clear Output, or jupyter nbconvert --clear-output)")
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory() as specs:
        # A kernel spec for this very interpreter: the `python3` one on a machine may be another.
        spec = os.path.join(specs, "kernels", "kvsim-python")
        os.makedirs(spec)
        with open(os.path.join(spec, "kernel.json"), "w") as f:
            json.dump({"argv": [sys.executable, "-m", "ipykernel_launcher", "-f",
                                "{connection_file}"],
                       "display_name": "kvsim", "language": "python"}, f)
        os.environ["JUPYTER_PATH"] = specs
        # The kernel runs in OUT_DIR: paths given relative to here must still lead there.
        for name in ("PYTHONPATH", "KVSIM_BINARY"):
            if os.environ.get(name):
                os.environ[name] = os.pathsep.join(
                    os.path.abspath(p) for p in os.environ[name].split(os.pathsep))
        os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
        os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # ipykernel's debugger
        client = NotebookClient(nb, timeout=600, kernel_name="kvsim-python",
                                resources={"metadata": {"path": out}})
        try:
            client.execute()
        except CellExecutionError as e:
            sys.exit(f"{path}: a cell failed:\n{e}")
        finally:
            executed = os.path.join(out, os.path.basename(path).replace(".ipynb", ".executed.ipynb"))
            nbformat.write(nb, executed)
    images = sum(1 for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                 if "image/png" in o.get("data", {}))
    expected = sum(1 for c in nb.cells if c.cell_type == "code" and
                   c.source.strip().split("\n")[-1].startswith("kvsim.plot."))
    if images < expected:
        sys.exit(f"{path}: {expected} cells end in a kvsim.plot figure, but {images} showed one")
    print(f"{path}: {len(nb.cells)} cells ran; {images} figure(s) shown; {executed}")


if __name__ == "__main__":
    main()
