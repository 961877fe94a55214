#!/usr/bin/env python3
"""The folders show the dependency order; includes only point down (docs/architecture.md):

    sim/cli -> sim/live -> sim/replay -> policies -> sim/core -> traces
                                    \\-> analysis ----^
    gpu (the CUDA backend, a plugin loaded by sim/live) -> sim/live's backend interface

Each layer may include its own files and those of the layers it names below. Usage:
check_layers.py REPO_ROOT
"""
import os
import re
import sys

# layer -> the layers its files may include (itself included)
ALLOWED = {
    "traces": {"traces"},
    "sim/core": {"sim/core", "traces"},
    "analysis": {"analysis", "sim/core", "traces"},
    "policies": {"policies", "sim/core", "traces"},
    "sim/replay": {"sim/replay", "policies", "analysis", "sim/core", "traces"},
    "sim/live": {"sim/live", "sim/replay", "policies", "analysis", "sim/core", "traces"},
    "gpu": {"gpu", "sim/live", "sim/replay", "policies", "analysis", "sim/core", "traces"},
    "sim/cli": {"sim/cli", "sim/live", "sim/replay", "policies", "analysis", "sim/core", "traces"},
}
ORDER = sorted(ALLOWED, key=len, reverse=True)  # "sim/core" before "sim"


def layer_of(path):
    for layer in ORDER:
        if path == layer or path.startswith(layer + "/"):
            return layer
    return None


def main():
    root = sys.argv[1]
    bad = []
    include = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
    for layer in ALLOWED:
        for dirpath, _, files in os.walk(os.path.join(root, layer)):
            for name in files:
                if not name.endswith((".cpp", ".hpp", ".cu", ".cuh", ".h")):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                if layer_of(rel) != layer:
                    continue  # a deeper layer's folder (sim/core inside sim/...)
                for n, line in enumerate(open(path, encoding="utf-8"), 1):
                    m = include.match(line)
                    if not m or "/" not in m.group(1):
                        continue
                    target = layer_of(m.group(1))
                    if target is not None and target not in ALLOWED[layer]:
                        bad.append(f"{rel}:{n}: {layer} includes {m.group(1)} ({target})")
    if bad:
        sys.exit("includes pointing up:\n" + "\n".join(bad))
    print("layers: every include points down")


if __name__ == "__main__":
    main()
