"""kvsim_bench_compact --floors FULL --compact COMPACT: the compact replay's floor counts the
full-cache decode outputs only where the compact trace does not store them (one written before
they were stored recomputes them), and the window's prompt blocks only where it does not store
the window statistics. Worked out here: the outputs' product is 2·d per query head, layer, decode
step and key, G steps over T = P + G keys; the window blocks are the 64-row blocks from the
trace's first kept query row, each against the keys up to its last row.
Usage: check_compact_floor.py KVSIM KVSIM_BENCH_COMPACT WORK_DIR"""
import os
import shutil
import subprocess
import sys

import h5py

kvsim, bench, work = sys.argv[1:4]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
full, compact, old, rows = (os.path.join(work, n)
                            for n in ("full.h5", "compact.h5", "old.h5", "rows.h5"))
L, H, Hkv, d, G = 2, 4, 2, 32, 32
subprocess.run([kvsim, "synth", "-o", full, "--layers", str(L), "--heads", str(H), "--kv-heads",
                str(Hkv), "--head-dim", str(d), "--media-count", "2", "--media-tokens", "100",
                "--gen", str(G)], check=True, capture_output=True)
subprocess.run([kvsim, "compact", full, compact], check=True, capture_output=True)
shutil.copy(compact, old)
with h5py.File(old, "r+") as f:  # a compact trace from before the decode results were stored
    (sample,) = f["samples"].values()
    P = int(sample.attrs["prompt_len"])
    for layer in sample["layers"].values():
        del layer["stats/decode"]
shutil.copy(compact, rows)
with h5py.File(rows, "r+") as f:  # one from before the window statistics were stored
    del f.attrs["compact_window_widths"]
    (sample,) = f["samples"].values()
    first = int(sample.attrs["compact_first_row"])


def floors(*extra):
    # The products alone: the filter leaves the GEMM rates unmeasured (their floors empty).
    run = subprocess.run([bench, "--floors", full, *extra, "--benchmark_filter=^$"], check=True,
                         capture_output=True, text=True)
    rows = dict(line.split(",", 1) for line in run.stdout.splitlines() if "," in line)
    assert all(row.endswith(",,") for stage, row in rows.items() if stage != "stage"), rows
    return {stage: float(row.split(",")[0]) for stage, row in rows.items() if stage != "stage"}


table = floors("--compact", compact)
stored, recomputed, default = table["compact_replay"], \
    floors("--compact", old)["compact_replay"], floors()["compact_replay"]
# The full replay's products worked out: the causal prompt logits in blocks of 64 rows, each
# against the keys up to its last row, and per decode step the logits and outputs over T keys;
# the entropies every prompt row against every prompt key.
causal = sum(min(64, P - i0) * min(i0 + 64, P) for i0 in range(0, P, 64))
per_logit = 2.0 * d * H * L / 1e9
assert abs(table["full_replay"] - (causal + 2 * G * (P + G)) * per_logit) <= 1.0001e-4, table
assert abs(table["compaction_with_entropies"] - table["compaction"] - P * P * per_logit) \
    <= 2.0001e-4, table
outputs = 2.0 * d * H * L * G * (P + G) / 1e9
assert default == stored, (default, stored)
# Each floor is printed to 4 decimals: the difference is exact to 1e-4 (the outputs: ~0.005).
assert abs(recomputed - stored - outputs) <= 1.0001e-4, (recomputed, stored, outputs)
windowed = floors("--compact", rows)["compact_replay"]
blocks = sum(min(64, P - i0) * min(i0 + 64, P) for i0 in range(first, P, 64)) * per_logit
assert abs(windowed - stored - blocks) <= 1.0001e-4, (windowed, stored, blocks)
print(f"compact replay floor: {stored:.4f} GFLOP stored, {recomputed:.4f} without the decode "
      f"results (+{outputs:.4f}, the outputs' product), {windowed:.4f} without the window "
      f"statistics (+{blocks:.4f}, the window's blocks)")
