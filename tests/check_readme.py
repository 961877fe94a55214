#!/usr/bin/env python3
"""Runs the README's quickstart as written: every code block after a `<!-- readme-check: sh -->`
or `<!-- readme-check: python -->` marker, in a fresh directory where `build/` is this build, and
checks that the plain block following a shell block (its printed output) is what it printed.

Usage: check_readme.py README.md BUILD_DIR
"""
import os
import re
import subprocess
import sys
import tempfile

FENCE = re.compile(r"^```(\w*)\s*$")


def blocks(text):
    """(marker kind or None, language, body) for every fenced block, in order."""
    out, marker, lines, i = [], None, text.split("\n"), 0
    while i < len(lines):
        m = re.match(r"<!-- readme-check: (\w+) -->", lines[i])
        if m:
            marker = m.group(1)
        f = FENCE.match(lines[i])
        if f:
            j = i + 1
            while j < len(lines) and not FENCE.match(lines[j]):
                j += 1
            if j == len(lines):
                sys.exit(f"line {i + 1}: a code block is never closed")
            out.append((marker, f.group(1), "\n".join(lines[i + 1:j])))
            marker, i = None, j
        i += 1
    return out


def main():
    readme, build = sys.argv[1], os.path.abspath(sys.argv[2])
    found = blocks(open(readme, encoding="utf-8").read())
    checked = 0
    with tempfile.TemporaryDirectory() as work:
        os.symlink(build, os.path.join(work, "build"))
        for n, (kind, _, body) in enumerate(found):
            if kind is None:
                continue
            cmd = ["bash", "-euo", "pipefail", "-c", body] if kind == "sh" else [sys.executable, "-c", body]
            r = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"{readme}: the {kind} block #{n} failed ({r.returncode}):\n{body}\n"
                         f"--- output ---\n{r.stdout}{r.stderr}")
            checked += 1
            following = found[n + 1] if n + 1 < len(found) else None
            if kind == "sh" and following and following[0] is None and following[1] == "":
                printed = [l.rstrip() for l in r.stdout.split("\n")]
                for line in following[2].split("\n"):
                    if line.strip() and line.rstrip() not in printed:
                        sys.exit(f"{readme}: the output shown after block #{n} has a line the "
                                 f"command did not print:\n{line}\n--- it printed ---\n{r.stdout}")
    if checked == 0:
        sys.exit(f"{readme}: no readme-check block found")
    print(f"{readme}: {checked} block(s) ran as written")


if __name__ == "__main__":
    main()
