#!/usr/bin/env python3
"""Writes experiments' generated tables and paragraphs into a document, so that the docs quote
the runs rather than a hand copy of them.

    docs_tables.py DOC.md --run NAME=RUN_DIR [--run NAME=RUN_DIR ...] [--check]

DOC.md marks each generated region with

    <!-- generated: NAME:FILE | HEADING [| rows=PREFIX | until=TEXT] -->
    ...the region...
    <!-- end generated -->

NAME names the experiment (vlm_eval, vlm_multi) whose run directory --run gives; FILE is a report
under it (e.g. compress/vlm_eval.md). The region is the first Markdown table after the first line
holding HEADING; rows=PREFIX keeps the header and the rows that start with `| PREFIX` only;
until=TEXT takes instead the lines from the one holding HEADING up to the first later line holding
TEXT (to the end of the file when TEXT is empty), without trailing blank lines: a paragraph, a
list, or several. A figure is marked on the line before its image,

    <!-- generated figure: NAME:FILE -->
    ![alt text](PATH)

and FILE (a PNG of the run) is copied to PATH, resolved against the document's folder. Regions
of experiments not given are left as they are. --check writes nothing and gives each region and
figure a verdict: equal; equal within tolerance (kvsim.report.tolerance: the numbers of a run on
another CPU, each within float32 rounding or one unit of its last printed digit, a few moved by
near-ties; a figure with at most 2% of its pixels changed); or different, with the first
difference. It exits 1 when any region or figure differs (the docs drifted from the run). Errors
name the document, the marker's line and what is missing.

Numbers in the hand-written prose are checked too: each number with a decimal point outside the
regions and code spans must be one that a region of the same document holds, rounded to the
prose's digits, so that a hand copy of a run's number cannot outlive the run. After writing, the
numbers that fail are named as warnings (the prose is then the author's to bring to the run);
--prose checks only that and exits 1 when any fails (the committed pages' test).

    docs_tables.py DOC.md --prose
"""
import argparse
import os
import re
import shutil
import sys
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal

from kvsim.report import tolerance

BEGIN = re.compile(r"^<!-- generated: (.+?) -->\s*$")
END = "<!-- end generated -->"
FIGURE = re.compile(r"^<!-- generated figure: ([^:]+):(.+?) -->\s*$")
IMAGE = re.compile(r"^!\[[^\]]*\]\(([^)]+)\)\s*$")
USAGE = "<!-- generated: NAME:FILE | HEADING [| rows=PREFIX | until=TEXT] -->"


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


def lines_until(text, heading, until, where):
    """The lines from the first one holding `heading` up to the first later one holding `until`
    (the end when `until` is empty), trailing blank lines dropped."""
    lines = text.split("\n")
    start = next((i for i, line in enumerate(lines) if heading in line), None)
    if start is None:
        raise ValueError(f"{where}: no line holds {heading!r}")
    stop = len(lines)
    if until:
        stop = next((i for i in range(start + 1, len(lines)) if until in lines[i]), None)
        if stop is None:
            raise ValueError(f"{where}: no line after {heading!r} holds {until!r}")
    block = lines[start:stop]
    while block and not block[-1].strip():
        block.pop()
    return block


def region(runs, spec, where):
    """The lines a marker's `spec` (NAME:FILE | HEADING [| option]) stands for; None when its
    experiment was not given."""
    parts = [p.strip() for p in spec.split("|")]
    if len(parts) not in (2, 3) or ":" not in parts[0]:
        raise ValueError(f"{where}: expected {USAGE}")
    name, file = parts[0].split(":", 1)
    if name not in runs:
        return None
    source = os.path.join(runs[name], file)
    if not os.path.exists(source):
        raise ValueError(f"{where}: {source} does not exist")
    with open(source, encoding="utf-8") as f:
        text = f.read()
    where = f"{where} ({source})"
    if len(parts) == 2:
        return table_after(text, parts[1], where)
    option = parts[2]
    if option.startswith("rows="):
        return keep_rows(table_after(text, parts[1], where), option[len("rows="):])
    if option.startswith("until="):
        return lines_until(text, parts[1], option[len("until="):], where)
    raise ValueError(f"{where}: the third field must be rows=PREFIX or until=TEXT")


def figure(runs, doc_path, lines, i):
    """For a figure marker on line i: (run's file, the image's path), or None when its
    experiment was not given."""
    where = f"{doc_path}:{i + 1}"
    name, file = FIGURE.match(lines[i]).groups()
    image = IMAGE.match(lines[i + 1]) if i + 1 < len(lines) else None
    if image is None:
        raise ValueError(f"{where}: the figure marker is not followed by an image line "
                         "![...](PATH)")
    if name not in runs:
        return None
    source = os.path.join(runs[name], file.strip())
    if not os.path.exists(source):
        raise ValueError(f"{where}: {source} does not exist")
    return source, os.path.join(os.path.dirname(os.path.abspath(doc_path)), image.group(1))


FIGURE_PIXELS = 0.02  # the share of a figure's pixels another CPU's numbers may change


def same_bytes(a, b):
    if not os.path.exists(b):
        return False
    with open(a, "rb") as x, open(b, "rb") as y:
        return x.read() == y.read()


def compare_figures(run_file, doc_file):
    """tolerance.Verdict of the document's figure against the run's."""
    if same_bytes(run_file, doc_file):
        return tolerance.Verdict(tolerance.EQUAL)
    if not os.path.exists(doc_file):
        return tolerance.Verdict(tolerance.DIFFERENT, differences=[f"{doc_file} does not exist"])
    import matplotlib.image

    a, b = matplotlib.image.imread(run_file), matplotlib.image.imread(doc_file)
    if a.shape != b.shape:
        return tolerance.Verdict(tolerance.DIFFERENT,
                                 differences=[f"{b.shape[1]}x{b.shape[0]} pixels against the "
                                              f"run's {a.shape[1]}x{a.shape[0]}"])
    changed = float((abs(a - b).max(axis=-1) > 1 / 255).mean())
    if changed <= FIGURE_PIXELS:
        return tolerance.Verdict(tolerance.WITHIN,
                                 note=f"{100 * changed:.2f}% of the pixels differ")
    return tolerance.Verdict(tolerance.DIFFERENT,
                             differences=[f"{100 * changed:.1f}% of the pixels differ"])


def regenerate(runs, doc_path):
    """The document with the regions of the experiments in `runs` (name -> run directory)
    replaced; each region's and figure's (place, tolerance.Verdict against the run, or None for
    another experiment's), how many were written, and the figures to copy (run's file,
    destination)."""
    with open(doc_path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    out, verdicts, written, figures, i = [], [], 0, [], 0
    while i < len(lines):
        m = BEGIN.match(lines[i])
        out.append(lines[i])
        if FIGURE.match(lines[i]):
            copy = figure(runs, doc_path, lines, i)
            if copy is None:
                verdicts.append((f"{doc_path}:{i + 1} (figure)", None))
            else:
                written += 1
                figures.append(copy)
                verdicts.append((f"{doc_path}:{i + 1} (figure {copy[1]})",
                                 compare_figures(*copy)))
        if not m:
            i += 1
            continue
        where = f"{doc_path}:{i + 1}"
        end = next((j for j in range(i + 1, len(lines)) if lines[j] == END), None)
        if end is None:
            raise ValueError(f"{where}: no {END!r} after the marker")
        block = region(runs, m.group(1), where)
        if block is None:
            block = lines[i + 1:end]  # another experiment's region: as it is
            verdicts.append((f"{where} ({m.group(1)})", None))
        else:
            written += 1
            verdicts.append((f"{where} ({m.group(1)})",
                             tolerance.compare_text(lines[i + 1:end], block)))
        out += block + [END]
        i = end + 1
    return "\n".join(out), verdicts, written, figures


# A number as prose prints it: a decimal point and at least two digits after it, signed or not,
# not part of a version (0.3.21), a name or a code span.
PROSE_NUMBER = re.compile(r"(?<![\w.+\-−])[-+−]?\d*\.\d{2,}(?![\w.])")
CODE_SPAN = re.compile(r"`[^`]*`")


def decimal_of(token):
    return Decimal(token.replace("−", "-").lstrip("+"))


def rounds_to(value, digits, target):
    """Whether `value`, printed to `digits` decimals (half up or half even), reads `target`."""
    step = Decimal(1).scaleb(-digits)
    return any(abs(value.quantize(step, rounding)) == target
               for rounding in (ROUND_HALF_UP, ROUND_HALF_EVEN))


def loose_numbers(text):
    """The numbers of the hand-written prose that no generated region of the same document holds
    (line, number): a region's number, rounded to the prose's digits, must read the prose's
    (sign aside: "a 0.031 gap" quotes "-0.031"). A number copied by hand from a run therefore
    fails here once the regions are regenerated from another run; a prose number with nothing
    to quote belongs in a code span or in the report that writes a region."""
    hand, generated, inside = [], [], False
    for n, line in enumerate(text.split("\n"), 1):
        if BEGIN.match(line):
            inside = True
        elif line == END:
            inside = False
        elif not line.startswith("<!--"):
            (generated if inside else hand).append((n, line))
    quoted = {}
    for _, line in generated:
        for token in PROSE_NUMBER.findall(line):
            value = decimal_of(token)
            quoted.setdefault(-value.as_tuple().exponent, set()).add(value)
    loose = []
    for n, line in hand:
        for token in PROSE_NUMBER.findall(CODE_SPAN.sub("", line)):
            target = abs(decimal_of(token))
            digits = -target.as_tuple().exponent
            if not any(rounds_to(v, digits, target)
                       for more, values in quoted.items() if more >= digits for v in values):
                loose.append((n, token))
    return loose


def check_prose(doc):
    """Prints each loose number of `doc` (loose_numbers) on stderr; 0 when there is none."""
    with open(doc, encoding="utf-8") as f:
        loose = loose_numbers(f.read())
    for n, token in loose:
        print(f"docs_tables: {doc}:{n}: {token} is quoted by hand and no generated region holds "
              "it (generate it, or quote a region's number)", file=sys.stderr)
    return 1 if loose else 0


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("doc")
    ap.add_argument("--run", action="append", default=[], metavar="NAME=RUN_DIR",
                    help="an experiment's run directory (vlm_eval=demo/vlm); repeatable")
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 naming the regions that differ from the runs")
    ap.add_argument("--prose", action="store_true",
                    help="only check the hand-written prose: exit 1 naming each number with a "
                         "decimal point that no generated region holds at the prose's digits")
    a = ap.parse_args(argv)
    if a.prose:
        return check_prose(a.doc)
    if not a.run:
        ap.error("--run NAME=RUN_DIR is required (or --prose)")
    runs = {}
    for r in a.run:
        name, sep, path = r.partition("=")
        if not sep or not name or not path:
            print(f"docs_tables: --run {r}: expected NAME=RUN_DIR", file=sys.stderr)
            return 2
        runs[name] = path
    try:
        text, verdicts, written, figures = regenerate(runs, a.doc)
    except (OSError, ValueError) as e:
        print(f"docs_tables: {e}", file=sys.stderr)
        return 2
    if written == 0:
        print(f"docs_tables: {a.doc} marks no region of {', '.join(sorted(runs))}",
              file=sys.stderr)
        return 2
    if a.check:
        for place, verdict in verdicts:
            if verdict is None:
                print(f"{place}: not checked (its experiment's run was not given)")
            elif verdict:
                print(f"{place}: {verdict}")
            else:
                print(f"docs_tables: differs from the run: {place}: {verdict}", file=sys.stderr)
        return 0 if all(v is None or v for _, v in verdicts) else 1
    changed = [place for place, verdict in verdicts
               if verdict is not None and verdict.kind != tolerance.EQUAL]
    with open(a.doc, "w", encoding="utf-8") as f:
        f.write(text)
    for source, destination in figures:
        os.makedirs(os.path.dirname(destination), exist_ok=True)
        shutil.copyfile(source, destination)
    print(f"docs_tables: {len(changed)} of {written} region(s) rewritten in {a.doc}")
    # The regions written, the hand-written numbers that no longer read them are named (a
    # warning: the prose is the author's to bring to the new run; --prose fails on them).
    check_prose(a.doc)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
