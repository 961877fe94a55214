#!/usr/bin/env python3
"""The folders show the dependency order; includes only point down (docs/architecture.md):

    sim/cli, python/bindings -> sim/live, sim/replay -> policies, analysis -> sim/core -> traces
    gpu (the CUDA backend, a plugin loaded by sim/live) -> sim/live's backend interface

sim/live and sim/replay are siblings: neither includes the other. Each layer may include its own
files and those of the layers it names below. An include written without a folder (or with ../)
is resolved against the including file's folder, so it cannot hide a step up. Usage:
check_layers.py REPO_ROOT, or check_layers.py --self-test
"""
import os
import re
import sys
import tempfile

BELOW_ENGINES = {"policies", "analysis", "sim/core", "traces"}
# layer -> the layers its files may include (itself included)
ALLOWED = {
    "traces": {"traces"},
    "sim/core": {"sim/core", "traces"},
    "analysis": {"analysis", "sim/core", "traces"},
    "policies": {"policies", "sim/core", "traces"},
    "sim/replay": {"sim/replay"} | BELOW_ENGINES,
    "sim/live": {"sim/live"} | BELOW_ENGINES,
    "gpu": {"gpu", "sim/live"} | BELOW_ENGINES,
    "sim/cli": {"sim/cli", "sim/live", "sim/replay"} | BELOW_ENGINES,
    "python/bindings": {"python/bindings", "sim/live", "sim/replay"} | BELOW_ENGINES,
}
ORDER = sorted(ALLOWED, key=len, reverse=True)  # "sim/core" before "sim"
SOURCES = (".cpp", ".hpp", ".cu", ".cuh", ".h")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def layer_of(path):
    for layer in ORDER:
        if path == layer or path.startswith(layer + "/"):
            return layer
    return None


def target_of(root, rel, included):
    """The repository path an include names: relative to the including file's folder when it is
    written without a folder or with ./ or ../ (and exists there), else from the root."""
    if "/" not in included or included.startswith("."):
        local = os.path.normpath(os.path.join(os.path.dirname(rel), included))
        if os.path.exists(os.path.join(root, local)):
            return local
    return os.path.normpath(included)


def violations(root):
    bad = []
    for layer in ALLOWED:
        for dirpath, _, files in os.walk(os.path.join(root, layer)):
            for name in files:
                if not name.endswith(SOURCES):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), root)
                if layer_of(rel) != layer:
                    continue  # a deeper layer's folder (sim/core inside sim/...)
                for n, line in enumerate(open(os.path.join(root, rel), encoding="utf-8"), 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    target = layer_of(target_of(root, rel, m.group(1)))
                    if target is not None and target not in ALLOWED[layer]:
                        bad.append(f"{rel}:{n}: {layer} includes {m.group(1)} ({target})")
    return bad


def self_test():
    """Violations the check must catch, and includes it must let through, in a scratch tree."""
    files = {
        "sim/core/a.hpp": '#include "traces/t.hpp"\n#include "b.hpp"\n',  # fine
        "sim/core/b.hpp": "",
        "traces/t.hpp": '#include "../sim/core/b.hpp"\n',  # up, written relatively
        "sim/live/l.cpp": '#include "sim/replay/r.hpp"\n',  # a sibling
        "sim/replay/r.hpp": '#include "policies/p.hpp"\n',  # fine
        "policies/p.hpp": "",
        "python/bindings/m.cpp": '#include "sim/cli/c.hpp"\n#include "sim/live/l.hpp"\n',
        "sim/cli/c.hpp": "",
        "sim/live/l.hpp": "",
    }
    with tempfile.TemporaryDirectory() as root:
        for path, text in files.items():
            os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
            with open(os.path.join(root, path), "w") as f:
                f.write(text)
        found = sorted(b.split(": ", 1)[0] for b in violations(root))
    expected = ["python/bindings/m.cpp:1", "sim/live/l.cpp:1", "traces/t.hpp:1"]
    if found != expected:
        sys.exit(f"check_layers self-test: found {found}, expected {expected}")
    print("layers self-test: relative, sibling and bindings includes caught")


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return
    bad = violations(sys.argv[1])
    if bad:
        sys.exit("includes pointing up:\n" + "\n".join(bad))
    print("layers: every include points down")


if __name__ == "__main__":
    main()
