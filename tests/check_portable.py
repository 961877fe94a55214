#!/usr/bin/env python3
"""Checks that a kvsim binary runs on any x86-64 CPU: instructions beyond the x86-64 baseline
(VEX/EVEX-encoded AVX, AVX2, FMA, AVX-512, and BMI/LZCNT/POPCNT/MOVBE) may appear only in the
functions dispatched at run time (core/kernels/ instantiated for an AVX set, and the F16C
conversions of traces/half.cpp), and must appear there (else the dispatch would be pointless).

    check_portable.py BINARY
Exit 0 when portable, 1 with the offending functions listed, 77 (skipped) without objdump."""
import re
import shutil
import subprocess
import sys

BEYOND_BASELINE = re.compile(
    r"^(v[a-z0-9]+|andn|bextr|blsi|blsmsk|blsr|bzhi|pdep|pext|rorx|sarx|shlx|shrx|lzcnt|tzcnt|"
    r"popcnt|movbe|kmov[bwdq]|kand[a-z]*|kor[a-z]*)$")
# Functions allowed to use them: kernels templated on an xsimd AVX architecture (and xsimd's own
# internals instantiated for one), the kernel tables' initialisers and the F16C converters.
ALLOWED = re.compile(r"xsimd::(fma3<xsimd::)?avx|table_avx|_f16c\b|_f16c\(")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    if not shutil.which("objdump"):
        print("objdump not found: skipped")
        return 77
    out = subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", sys.argv[1]],
                         check=True, capture_output=True, text=True).stdout
    function, offending, dispatched = None, {}, set()
    for line in out.splitlines():
        header = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if header:
            function = header.group(1)
            continue
        parts = line.split("\t")
        if function is None or len(parts) < 2:
            continue
        mnemonic = parts[1].split()[0] if parts[1].split() else ""
        if not BEYOND_BASELINE.match(mnemonic):
            continue
        if ALLOWED.search(function):
            dispatched.add(function)
        else:
            offending.setdefault(function, mnemonic)
    if offending:
        print(f"{sys.argv[1]}: {len(offending)} function(s) use instructions beyond x86-64 "
              "outside the run-time dispatched kernels:")
        for f, m in sorted(offending.items())[:40]:
            print(f"  {m:10s} {f}")
        return 1
    if not any("avx" in f for f in dispatched):
        print(f"{sys.argv[1]}: no AVX kernel found: the dispatched kernels were not built")
        return 1
    print(f"{sys.argv[1]}: portable; {len(dispatched)} dispatched function(s) use wider sets")
    return 0


if __name__ == "__main__":
    sys.exit(main())
