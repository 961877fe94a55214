#!/usr/bin/env python3
"""Compares a result table with the one committed for it, within the tolerances that separate
another machine's arithmetic from a change of the code.

    tolerance.py EXPECTED.csv PRODUCED.csv --keys budget,policy [--subset]

compare_files/compare_rows compare result tables; compare_text compares the text of a report (the
numbers in it, each against the unit of its last printed digit too: a value printed to three
decimals may move by one unit in the third); experiments/reports/docs_tables.py --check uses it.

On one machine kvsim's results are the same bytes whatever the thread count; across machines
they are not, because OpenBLAS, PyTorch and oneDNN pick their kernels by the CPU
(`OPENBLAS_CORETYPE`, `ATEN_CPU_CAPABILITY`, `ONEDNN_MAX_CPU_ISA`) and each kernel sums in its own
order. Two kinds of difference follow, and only these are accepted:

- rounding: float32 sums in another order. A value computed through a trained projector, a
  decoder and a replay moves by a few hundred float32 epsilons at most (largest seen across four
  kernel choices on one machine, rows whose decisions agree: 4.4e-4 relative); ROUNDING_RTOL is
  twice that, rounded up, plus half a unit of the sixth printed digit.
- a near-tie decided the other way: two scores equal to rounding, ordered otherwise, change one
  policy's kept entries on a few heads and steps and move that row's means further (largest seen:
  2.4% relative, `knorm` at 60% with SSE kernels). A row may move up to DECISION_RTOL relative
  (DECISION_ATOL absolute, for values near zero) when at most MAX_DECISION_SHARE of the rows do.

Anything else is a difference: a row missing or added, a label, a value past those bounds, or too
many rows past the rounding bound (an edited policy or metric moves every row it touches by far
more: the suite shows a changed rule failing this check). Exits 0 when the tables agree, 1 naming
the first differences.
"""
import argparse
import csv
import gzip
import math
import re
import sys

ROUNDING_RTOL = 1e-3
PRINT_ATOL = 5e-7          # half a unit of the 6th significant digit of a value near 1 (%.6g)
DECISION_RTOL = 0.05
DECISION_ATOL = 1e-3
MAX_DECISION_SHARE = 0.1   # of the rows compared (at least one row)

EQUAL, WITHIN, DIFFERENT = "equal", "equal within tolerance", "different"


def _number(text):
    try:
        return float(text)
    except ValueError:
        return None


def _off(a, b):
    """How far apart two printed values are, relative to their size."""
    return abs(a - b) / max(abs(a), abs(b), 1e-300)


def compare_values(expected, produced):
    """EQUAL, WITHIN (rounding), 'decision' (a near-tie's size) or DIFFERENT for two printed
    values; text that is not a number must be identical."""
    if expected == produced:
        return EQUAL
    a, b = _number(expected), _number(produced)
    if a is None or b is None or math.isnan(a) != math.isnan(b):
        return DIFFERENT
    gap = abs(a - b)
    if gap <= ROUNDING_RTOL * max(abs(a), abs(b)) + PRINT_ATOL:
        return WITHIN
    if gap <= DECISION_RTOL * max(abs(a), abs(b)) + DECISION_ATOL:
        return "decision"
    return DIFFERENT


class Verdict:
    """The outcome of a comparison: `kind` (EQUAL, WITHIN or DIFFERENT), the largest relative
    difference seen, the rows a near-tie moved and, when different, the first differences."""

    def __init__(self, kind, largest=0.0, decided=(), differences=(), note=None):
        self.kind, self.largest, self.note = kind, largest, note
        self.decided, self.differences = list(decided), list(differences)

    def __bool__(self):
        return self.kind != DIFFERENT

    def __str__(self):
        if self.kind == EQUAL:
            return EQUAL
        if self.kind == WITHIN and self.note:
            return f"{WITHIN} ({self.note})"
        if self.kind == WITHIN:
            moved = (f"; {len(self.decided)} moved by a near-tie: "
                     f"{', '.join(self.decided[:4])}" if self.decided else "")
            return f"{WITHIN} (largest relative difference {self.largest:.2g}{moved})"
        return f"{DIFFERENT}: " + "; ".join(self.differences[:4])


def compare_rows(expected, produced, keys, subset=False):
    """Compares two lists of dict rows (csv.DictReader's) matched on `keys`. With `subset`, the
    produced rows may be fewer (a run of one seed against the committed seeds), never others."""
    def index(rows, what):
        out = {}
        for r in rows:
            key = tuple(r.get(k) for k in keys)
            if key in out:
                raise ValueError(f"{what}: row {dict(zip(keys, key))} appears twice")
            out[key] = r
        return out

    exp, got = index(expected, "expected"), index(produced, "produced")
    differences = [f"row {dict(zip(keys, k))} not in the expected table"
                   for k in got if k not in exp]
    if not subset:
        differences += [f"row {dict(zip(keys, k))} missing" for k in exp if k not in got]
    if expected and produced and list(expected[0]) != list(produced[0]):
        differences.append(f"columns {list(produced[0])} against {list(expected[0])}")
    kind, largest, decided = EQUAL, 0.0, []
    for key, row in got.items():
        if key not in exp:
            continue
        name = "/".join(key)
        row_kind = EQUAL
        for column, value in row.items():
            if column in keys:
                continue
            verdict = compare_values(exp[key].get(column, ""), value)
            if verdict == DIFFERENT:
                differences.append(f"{name} {column}: {value} against {exp[key].get(column)}")
            elif verdict != EQUAL:
                largest = max(largest, _off(float(exp[key][column]), float(value)))
                if verdict == "decision" or row_kind == EQUAL:
                    row_kind = verdict
        if row_kind == "decision":
            decided.append(name)
        if row_kind != EQUAL:
            kind = WITHIN
    compared = sum(k in exp for k in got)
    allowed = max(1, int(MAX_DECISION_SHARE * compared))
    if len(decided) > allowed:
        differences.append(f"{len(decided)} of {compared} rows past the rounding tolerance "
                           f"(at most {allowed} may be moved by near-ties): "
                           f"{', '.join(decided[:6])}")
    if differences:
        return Verdict(DIFFERENT, largest, decided, differences)
    return Verdict(kind, largest, decided)


NUMBER = re.compile(r"(?<![\w.])[-+\u2212]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def compare_printed(expected, produced):
    """compare_values for two numbers as a report prints them: the unit of the expected value's
    last printed digit is added to both bounds (a value near a rounding boundary prints either
    way)."""
    a, b = (float(x.replace("\u2212", "-")) for x in (expected, produced))
    digits = expected.lstrip("+-\u2212")
    unit = 0.0 if "e" in digits.lower() or "." not in digits else 10.0 ** -len(digits.split(".")[1])
    gap, size = abs(a - b), max(abs(a), abs(b))
    if gap == 0 and expected == produced:
        return EQUAL
    if gap <= 1.0001 * unit + ROUNDING_RTOL * size + PRINT_ATOL:
        return WITHIN
    if gap <= 1.0001 * unit + DECISION_RTOL * size + DECISION_ATOL:
        return "decision"
    return DIFFERENT


def compare_text(expected, produced):
    """Compares two texts (lists of lines) that should say the same: the words must be equal,
    the numbers within the tolerances (at most MAX_DECISION_SHARE of them moved by near-ties)."""
    if expected == produced:
        return Verdict(EQUAL)
    if len(expected) != len(produced):
        return Verdict(DIFFERENT, differences=[f"{len(produced)} lines against {len(expected)}"])
    kind, largest, decided, numbers = EQUAL, 0.0, [], 0
    for line, (want, got) in enumerate(zip(expected, produced), 1):
        if want == got:
            numbers += len(NUMBER.findall(want))
            continue
        w_words, g_words = NUMBER.split(want), NUMBER.split(got)
        w_nums, g_nums = NUMBER.findall(want), NUMBER.findall(got)
        first = f"line {line}: {got.strip()[:160]!r} against {want.strip()[:160]!r}"
        if w_words != g_words or len(w_nums) != len(g_nums):
            return Verdict(DIFFERENT, largest, decided, [first])
        numbers += len(w_nums)
        for a, b in zip(w_nums, g_nums):
            verdict = compare_printed(a, b)
            if verdict == DIFFERENT:
                return Verdict(DIFFERENT, largest, decided, [first])
            if verdict != EQUAL:
                kind = WITHIN
                x, y = (float(v.replace("\u2212", "-")) for v in (a, b))
                largest = max(largest, _off(x, y))
            if verdict == "decision":
                decided.append(f"line {line}: {b} against {a}")
    allowed = max(1, int(MAX_DECISION_SHARE * numbers))
    if len(decided) > allowed:
        return Verdict(DIFFERENT, largest, decided,
                       [f"{len(decided)} of {numbers} numbers past the rounding tolerance (at most "
                        f"{allowed} may be moved by near-ties): {'; '.join(decided[:3])}"])
    return Verdict(kind, largest, decided)


def read_csv(path):
    """The rows of a CSV file, gzip-compressed when its name ends in .gz."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def compare_files(expected, produced, keys, subset=False):
    return compare_rows(read_csv(expected), read_csv(produced), keys, subset)


def kernels_differ(made_with):
    """Why numbers made with kvsim's `made_with` kernel set ("avx512", "avx2", "baseline") are
    not required to hold here, or "" when this machine runs the same set (or it is not known).
    kvsim's own kernels (softmax, sums, the VLM's attention rows) sum in their own order per set,
    and the image experiments' near-ties are decided by it: docs/testing.md."""
    if not made_with:
        return ""
    try:
        from .. import _kvsim
        here = _kvsim.simd()
    except ImportError:
        return ""
    if here == made_with:
        return ""
    return (f"shown, not required: the expected numbers were made with kvsim's {made_with} "
            f"kernels, this machine runs {here} (docs/testing.md)")


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("expected")
    ap.add_argument("produced")
    ap.add_argument("--keys", required=True, help="the columns that name a row, comma-separated")
    ap.add_argument("--subset", action="store_true",
                    help="the produced table may hold fewer rows than the expected one")
    ap.add_argument("--made-with-simd", default="",
                    help="kvsim's kernel set the expected numbers were made with: on a machine "
                         "that runs another, the verdict is printed and not required")
    a = ap.parse_args(argv)
    try:
        verdict = compare_files(a.expected, a.produced, a.keys.split(","), a.subset)
    except (OSError, ValueError) as e:
        print(f"tolerance.py: {e}", file=sys.stderr)
        return 2
    print(f"{a.produced} against {a.expected}: {verdict}")
    why = kernels_differ(a.made_with_simd)
    if not verdict and why:
        print(f"tolerance.py: {why}")
        return 0
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
