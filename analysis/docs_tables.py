#!/usr/bin/env python3
"""Writes an experiment's generated tables into a document, so that the docs quote the run
rather than a hand copy of it.

    docs_tables.py RUN_DIR DOC.md [--check]

DOC.md marks each generated table with

    <!-- generated: FILE | HEADING [| rows=PREFIX] -->
    ...the table...
    <!-- end generated -->

FILE is a report under RUN_DIR (e.g. compress/vlm_eval.md), HEADING the text its table follows
(the first Markdown table after the first line holding it), rows=PREFIX keeps the header and the
rows that start with `| PREFIX` only. Every marked region is replaced by the table as the run
wrote it. --check writes nothing and exits 1 naming the regions that differ (the docs drifted
from the run). Errors name the document, the marker's line and what is missing.
"""
import argparse
import os
import re
import sys

BEGIN = re.compile(r"^<!-- generated: (.+?) -->\s*$")
END = "<!-- end generated -->"


def table_after(text, heading, where):
    """The first Markdown table after the first line holding `heading`."""
    lines = text.split("\n")
    start = next((i for i, line in enumerate(lines) if heading in line), None)
    if start is None:
        raise ValueError(f"{where}: no line holds {heading!r}")
    first = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("|")), None)
    if first is None:
        raise ValueError(f"{where}: no table after {heading!r}")
    last = first
    while last < len(lines) and lines[last].startswith("|"):
        last += 1
    return lines[first:last]


def keep_rows(table, prefix):
    return table[:2] + [row for row in table[2:] if row.startswith(f"| {prefix}")]


def regenerate(run_dir, doc_path):
    """The document with every marked region replaced; and the regions that changed."""
    with open(doc_path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    out, changed, i = [], [], 0
    while i < len(lines):
        m = BEGIN.match(lines[i])
        out.append(lines[i])
        if not m:
            i += 1
            continue
        where = f"{doc_path}:{i + 1}"
        parts = [p.strip() for p in m.group(1).split("|")]
        if len(parts) not in (2, 3):
            raise ValueError(f"{where}: expected <!-- generated: FILE | HEADING [| rows=PREFIX] -->")
        source = os.path.join(run_dir, parts[0])
        if not os.path.exists(source):
            raise ValueError(f"{where}: {source} does not exist")
        with open(source, encoding="utf-8") as f:
            table = table_after(f.read(), parts[1], f"{where} ({source})")
        if len(parts) == 3:
            if not parts[2].startswith("rows="):
                raise ValueError(f"{where}: the third field must be rows=PREFIX")
            table = keep_rows(table, parts[2][len("rows="):])
        end = next((j for j in range(i + 1, len(lines)) if lines[j] == END), None)
        if end is None:
            raise ValueError(f"{where}: no {END!r} after the marker")
        if lines[i + 1:end] != table:
            changed.append(f"{where} ({parts[0]}: {parts[1]})")
        out += table + [END]
        i = end + 1
    return "\n".join(out), changed


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("doc")
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 naming the regions that differ from the run")
    a = ap.parse_args(argv)
    try:
        text, changed = regenerate(a.run_dir, a.doc)
    except (OSError, ValueError) as e:
        print(f"docs_tables: {e}", file=sys.stderr)
        return 2
    if a.check:
        for c in changed:
            print(f"docs_tables: differs from the run: {c}", file=sys.stderr)
        return 1 if changed else 0
    with open(a.doc, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"docs_tables: {len(changed)} table(s) rewritten in {a.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
