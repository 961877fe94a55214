#!/usr/bin/env python3
"""The GPU tables of docs/live.md from the files run_on_device.sh writes (any subset of them).

    summarize.py RESULTS_DIR        # writes RESULTS_DIR/tables.md and prints it

Decode attention: kvsim's kernel and PyTorch SDPA side by side, per shape and dtype, in GB/s and
as a share of the device's read bandwidth measured by kvsim_gpu_bench in the same run. Whole
step: ms/token of kvsim and transformers, and each policy's cost against the full cache. Logits:
the relative errors compare_transformers.py found. Replay thread scaling on the machine's cores.
Missing files leave their table out.
"""
import csv
import json
import sys
from pathlib import Path


def read_csv_table(path: Path, header_starts: str):
    """Key-value preamble lines, then the rows after the line starting with header_starts."""
    lines = path.read_text().splitlines()
    meta, rows = {}, []
    for i, line in enumerate(lines):
        if line.startswith(header_starts):
            rows = list(csv.DictReader(lines[i:]))
            break
        cells = line.split(",")
        for k in range(0, len(cells) - 1, 2):
            meta[cells[k]] = cells[k + 1]
    return meta, rows


def markdown_table(caption: str, header: list, rows: list) -> list:
    """A caption, then a Markdown table of `header` and `rows` (cells already formatted)."""
    return (["", caption, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)] +
            ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def attention_table(out: Path) -> list:
    rows, caption = [], None
    for shape, kv in (("gqa", "32/8"), ("mha", "32/32")):
        kvsim_file, sdpa_file = out / f"decode_attention_{shape}.csv", out / f"sdpa_{shape}.csv"
        if not kvsim_file.exists():
            continue
        meta, ours = read_csv_table(kvsim_file, "tokens,")
        if not ours:
            continue  # the benchmark failed: its log says why
        read = float(meta.get("measured_read_gbs", "nan"))
        theirs = {}
        if sdpa_file.exists():
            _, sdpa_rows = read_csv_table(sdpa_file, "dtype,")
            for r in sdpa_rows:
                if r["gqa"] == "native":
                    theirs[(r["dtype"], int(r["tokens"]))] = float(r["gbs"])
        caption = caption or (f"Decode attention at batch 1, d = 128, {meta.get('device', '?')}; "
                              f"read bandwidth measured in the same run: {read:.0f} GB/s.")
        by_tokens = {}
        for r in ours:
            by_tokens.setdefault(int(r["tokens"]), {})[r["probs"]] = float(r["gbs"])
        dtype = meta.get("kv_dtype", "float32")
        for n, g in sorted(by_tokens.items()):
            plain, probs = g.get("0", float("nan")), g.get("1", float("nan"))
            sdpa = theirs.get((dtype, n))
            rows.append([kv, dtype, n, f"{plain:.0f}", f"{100 * plain / read:.0f}%",
                         f"{probs:.0f}", "" if sdpa is None else f"{sdpa:.0f}"])
        # Dtypes only SDPA was measured in (kvsim's KV cache is float32 so far): "—" for kvsim.
        for (dt, n), gbs in sorted(theirs.items()):
            if dt != dtype:
                rows.append([kv, dt, n, "—", "—", "—", f"{gbs:.0f}"])
    if caption is None:
        return []
    return markdown_table(caption, ["heads (Q/KV)", "KV dtype", "tokens", "kvsim GB/s",
                                    "% of read", "with probs GB/s",
                                    "SDPA GB/s (same dtype, native GQA)"], rows)


def step_table(out: Path) -> list:
    path = out / "step.json"
    if not path.exists():
        return []
    report = json.loads(path.read_text())
    s = report["shape"]
    caption = (f"Whole decode step, random {s['layers']}-layer model (hidden {s['hidden']}, "
               f"{s['heads']}/{s['kv_heads']} heads, bf16 checkpoint by {report['checkpoint']}), "
               f"{s['prompt_len']}-token prompt, {s['gen']} greedy steps; policies at "
               f"{s['budget']}:")
    rows = [[f"{r['implementation']} ({r['backend']})", r["attention"], r["policy"],
             f"{r['ms_per_token']:.2f}", f"{r['relative_to_full_cache']:.2f}"]
            for r in report["rows"]]
    return markdown_table(caption, ["implementation", "attention", "policy", "ms/token",
                                    "× full cache"], rows)


def compare_table(out: Path) -> list:
    path = out / "compare_transformers.json"
    if not path.exists():
        return []
    rows = [[r["model"], r["backend"], r.get("rel_error_vs_float32", ""),
             r.get("rel_error_vs_bfloat16", "")] for r in json.loads(path.read_text())]
    return markdown_table(
        "Logits against transformers (max |Δ| / max |logit|, prefill and greedy steps):",
        ["model", "backend", "vs transformers float32", "vs transformers bfloat16"], rows)


def scaling_table(out: Path) -> list:
    path = out / "replay_scaling.csv"
    if not path.exists():
        return []
    rows = list(csv.DictReader(path.read_text().splitlines()))
    if not rows:
        return []
    return markdown_table(
        "Replay thread scaling, five baselines at 20% on synthetic traces "
        "(replay_scaling.sh's default shape: 8 layers x 32 heads, d = 128, 2,048-token prompts, "
        "64 generated tokens):", ["samples", "threads", "seconds", "speed-up"],
        [[r["samples"], r["threads"], f"{float(r['seconds']):.2f}",
          f"{float(r['speedup_over_one_thread']):.2f}×"] for r in rows])


def tests_line(out: Path) -> list:
    path = out / "gpu_tests.json"
    if not path.exists():
        return []
    report = json.loads(path.read_text())
    cases = [c for suite in report.get("testsuites", []) for c in suite.get("testsuite", [])]
    skipped = sum(c.get("result") == "SKIPPED" for c in cases)
    failed = sum(bool(c.get("failures")) for c in cases)
    return ["", f"GPU tests: {len(cases) - skipped - failed} of {len(cases)} passed, "
            f"{failed} failed, {skipped} skipped."]


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = Path(sys.argv[1])
    date = (out / "date.txt").read_text().strip() if (out / "date.txt").exists() else "?"
    lines = [f"Measured {date}."]
    lines += attention_table(out) + step_table(out) + compare_table(out) + scaling_table(out)
    lines += tests_line(out)
    text = "\n".join(lines) + "\n"
    (out / "tables.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
