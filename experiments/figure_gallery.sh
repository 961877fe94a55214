#!/bin/sh
# Every kind of figure `kvsim figures` draws from replay, summary, sweep and stats files, on the
# small demo trace (12 samples) and a sweep of it: the gallery of docs/figures.md.
#   experiments/figure_gallery.sh [OUT_DIR] [BUILD_DIR] [GALLERY_DIR]   (under a minute on 2 cores)
# Writes every figure (PNG and PDF) into OUT_DIR/figures and copies the gallery's PNGs into
# GALLERY_DIR (default docs/figures/; the same bytes for the same inputs).
set -eu
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-demo/gallery}
build=${2:-$repo/build}
gallery=${3:-$repo/docs/figures}
k="$build/kvsim"
mkdir -p "$out"
[ -f "$out/small.h5" ] || "$k" synth --out "$out/small.h5" --samples 12 --layers 4 --heads 8 \
  --kv-heads 8 --head-dim 64 --media-tokens 144 --user-tokens 16 --gen 16 >/dev/null
# A seeded floor, budgeted policies and two that size their caches themselves, at equal memory.
"$k" replay "$out/small.h5" -p full,random,h2o,snapkv,tova,hae,st3,fastv --budget 20% \
  --equal-memory --seeds 3 --diagnostics -o "$out/replay.csv" --summary "$out/summary.csv" \
  >/dev/null 2>&1
"$k" sweep -t "$out/small.h5" -p h2o,tova,snapkv --grid '*.budget=10%:40%:10%' --equal-memory \
  -o "$out/sweep" >/dev/null 2>&1
"$k" stats "$out/small.h5" -o "$out/stats.h5" -s 000000 -s 000001 -s 000002 >/dev/null
rm -rf "$out/figures"
"$k" figures "$out/replay.csv" "$out/summary.csv" "$out/stats.h5" "$out/sweep" \
  --out "$out/figures" >/dev/null
mkdir -p "$gallery"
for f in replay_recall_by_layer summary_at_equal_memory stats_across_samples \
  stats_000000_sparsity stats_000000_ppci stats_000000_key_similarity \
  stats_000000_head_preference sweep/pareto; do
  cp "$out/figures/$f.png" "$gallery/$(echo "$f" | tr / _).png"
done
echo "figure_gallery: $(ls "$out/figures" | wc -l) files in $out/figures; the gallery's PNGs in $gallery"
