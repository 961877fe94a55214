#!/usr/bin/env python3
"""The folders show the dependency order; includes only point down (docs/architecture.md):

    sim/cli, python/bindings    the command line and the Python module
    sim/replay, sim/live        what runs policies: replay and sweeps; the live model
    gpu                         the CUDA backend, a plugin of sim/live (its backend interface)
    sim/run                     run plumbing: MPI, progress, result files, notes, compaction
    policies, analysis          the policies; the statistics
    core                        caches, layer attention, sample statistics, parameters, kernels,
                                hashing, parallel helpers
    traces                      the trace and prompt formats

Siblings (policies and analysis; sim/replay and sim/live) do not include each other; the table of
docs/architecture.md states ALLOWED and is checked against it. Each floor may include its own files
and those of the floors below it. An include written without a folder (or with ../) is resolved
against the including file's folder, so it cannot hide a step up. A C++ source outside every floor
(other than tests/ and experiments/) is an error too: a new folder must be given its place. Each
floor is also its own CMake object library, linked on its own against the floors below it with every
symbol resolved (kvsim_floor_check_*), so a call that points up fails to link. Usage:
check_layers.py REPO_ROOT, or check_layers.py --self-test
"""
import os
import re
import sys
import tempfile

BELOW_RUN = {"policies", "analysis", "core", "traces"}
BELOW_ENGINES = {"sim/run"} | BELOW_RUN
# floor -> the floors its files may include (itself included)
ALLOWED = {
    "traces": {"traces"},
    "core": {"core", "traces"},
    "analysis": {"analysis", "core", "traces"},
    "policies": {"policies", "core", "traces"},
    "sim/run": {"sim/run"} | BELOW_RUN,
    "sim/replay": {"sim/replay"} | BELOW_ENGINES,
    "sim/live": {"sim/live"} | BELOW_ENGINES,
    "gpu": {"gpu", "sim/live"} | BELOW_ENGINES,
    "sim/cli": {"sim/cli", "sim/live", "sim/replay"} | BELOW_ENGINES,
    "python/bindings": {"python/bindings", "sim/live", "sim/replay"} | BELOW_ENGINES,
}
# Sources here may include any floor.
FREE = ("tests", "experiments", "build")
ORDER = sorted(ALLOWED, key=len, reverse=True)  # the longest folder first
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


def unplaced(root):
    """C++ sources outside every floor and the free folders."""
    out = []
    for dirpath, dirs, files in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        top = rel_dir.split(os.sep)[0]
        if rel_dir != "." and (top in FREE or top.startswith(".")
                               or "CMakeCache.txt" in files):  # a build folder of any name
            dirs[:] = []
            continue
        for name in files:
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if name.endswith(SOURCES) and layer_of(rel) is None:
                out.append(f"{rel}: in no floor (give its folder a place in ALLOWED)")
    return out


def violations(root):
    bad = unplaced(root)
    for layer in ALLOWED:
        for dirpath, _, files in os.walk(os.path.join(root, layer)):
            for name in files:
                if not name.endswith(SOURCES):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), root)
                if layer_of(rel) != layer:
                    continue  # a deeper floor's folder
                for n, line in enumerate(open(os.path.join(root, rel), encoding="utf-8"), 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    target = layer_of(target_of(root, rel, m.group(1)))
                    if target is not None and target not in ALLOWED[layer]:
                        bad.append(f"{rel}:{n}: {layer} includes {m.group(1)} ({target})")
    return bad


def documented(root):
    """{folder: the folders it may include} from docs/architecture.md's table."""
    table = {}
    with open(os.path.join(root, "docs", "architecture.md"), encoding="utf-8") as f:
        for line in f:
            m = re.match(r"^\| `([a-z/]+)` \| (.*) \|$", line.strip())
            if m:
                table[m.group(1)] = set(re.findall(r"`([a-z/]+)`", m.group(2))) | {m.group(1)}
    return table


def doc_mismatches(root):
    """Where docs/architecture.md's table and ALLOWED disagree."""
    table = documented(root)
    out = []
    for layer in sorted(set(table) | set(ALLOWED)):
        if table.get(layer) != ALLOWED.get(layer):
            said, checked = sorted(table.get(layer, [])), sorted(ALLOWED.get(layer, []))
            out.append(f"docs/architecture.md: {layer}: the table says {said}, the check {checked}")
    return out


def self_test():
    """Violations the check must catch, and includes it must let through, in a scratch tree: an
    include pointing up planted in every floor, a relative one, a sibling's, and a source in no
    floor."""
    files = {
        "traces/t.hpp": '#include "../core/b.hpp"\n',  # up, written relatively
        "core/a.hpp": '#include "traces/t.hpp"\n#include "b.hpp"\n',  # fine
        "core/b.hpp": '#include "policies/p.hpp"\n',  # up
        "policies/p.hpp": '#include "analysis/s.hpp"\n',  # a sibling
        "analysis/s.hpp": '#include "sim/run/r.hpp"\n',  # up
        "sim/run/r.hpp": '#include "policies/p.hpp"\n#include "sim/replay/e.hpp"\n',  # fine, up
        "sim/replay/e.hpp": '#include "sim/run/r.hpp"\n#include "sim/live/l.hpp"\n',  # a sibling
        "sim/live/l.hpp": '#include "sim/cli/c.hpp"\n',  # up
        "gpu/k.cu": '#include "sim/live/l.hpp"\n#include "sim/replay/e.hpp"\n',  # fine, up
        "sim/cli/c.hpp": '#include "sim/live/l.hpp"\n#include "python/bindings/m.hpp"\n',  # up
        "python/bindings/m.hpp": '#include "sim/cli/c.hpp"\n',  # a sibling
        "sim/stray.cpp": "",  # in no floor
        "tests/t.cpp": '#include "sim/cli/c.hpp"\n',  # tests may include anything
    }
    with tempfile.TemporaryDirectory() as root:
        for path, text in files.items():
            os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
            with open(os.path.join(root, path), "w") as f:
                f.write(text)
        found = sorted(b.split(": ", 1)[0] for b in violations(root))
        # The documented table against the check: a row that allows more is caught.
        os.makedirs(os.path.join(root, "docs"))
        with open(os.path.join(root, "docs", "architecture.md"), "w") as f:
            f.write("| `traces` | nothing else |\n| `core` | `traces`, `policies` |\n")
        drift = [m.split(": ")[1] for m in doc_mismatches(root)]
    if "core" not in drift or "traces" in drift:
        sys.exit(f"check_layers self-test: the documented table's drift found in {drift}, "
                 "expected core and not traces")
    expected = sorted(["traces/t.hpp:1", "core/b.hpp:1", "policies/p.hpp:1", "analysis/s.hpp:1",
                       "sim/run/r.hpp:2", "sim/replay/e.hpp:2", "sim/live/l.hpp:1", "gpu/k.cu:2",
                       "sim/cli/c.hpp:2", "python/bindings/m.hpp:1", "sim/stray.cpp"])
    if found != expected:
        sys.exit(f"check_layers self-test: found {found}, expected {expected}")
    print("layers self-test: an upward include in every floor, relative, sibling and unplaced "
          "sources, and a documented table that drifted, caught")


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return
    bad = violations(sys.argv[1]) + doc_mismatches(sys.argv[1])
    if bad:
        sys.exit("includes pointing up:\n" + "\n".join(bad))
    print("layers: every include points down")


if __name__ == "__main__":
    main()
