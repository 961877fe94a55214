#!/bin/sh
# experiments/figure_gallery.sh runs end to end into a temporary folder, draws every figure
# docs/figures.md shows and no other, and draws the same bytes when run again.
# Usage: check_figure_gallery.sh BUILD_DIR
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail() { echo "check_figure_gallery: $1"; exit 1; }
"$here/experiments/figure_gallery.sh" "$out/run" "$1" "$out/gallery" > /dev/null
shown=$(grep -o 'figures/[a-z0-9_]*\.png' "$here/docs/figures.md" | sed 's|figures/||' | sort -u)
drawn=$(ls "$out/gallery" | sort)
committed=$(ls "$here/docs/figures" | sort)
[ "$shown" = "$drawn" ] || fail "docs/figures.md shows [$shown] but the gallery draws [$drawn]"
[ "$committed" = "$drawn" ] || fail "docs/figures/ holds [$committed], the gallery draws [$drawn]"
mv "$out/gallery" "$out/first"
"$here/experiments/figure_gallery.sh" "$out/run" "$1" "$out/gallery" > /dev/null
for f in $drawn; do
  cmp -s "$out/first/$f" "$out/gallery/$f" || fail "$f differs between two runs"
done
echo "check_figure_gallery: $(echo "$drawn" | wc -l) figures, the same bytes twice"
