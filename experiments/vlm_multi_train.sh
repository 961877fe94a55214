#!/bin/sh
# Trains the eight-box VLM's weights (the projector and the fine-tuned stories260K decoder) for
# every seed on this machine's CPU, as the committed ones in experiments/weights/vlm_multi/ were
# made: `python -m kvsim.vlm train-multi --set seed=K --set steps=4000` into OUT_DIR/base-seedK
# (decoder.safetensors, projector.safetensors, training.json with the settings, every step's
# loss, the machine, the libraries and the git commit), then OUT_DIR/SHA256SUMS; with
# VLM_MULTI_TASK=count the counting form's (--set task=count) into OUT_DIR/count-seedK. A seed whose
# folder exists is kept (a rerun resumes; an interrupted seed starts again). About 15 minutes a
# seed on 2 cores (0.23 s a step); the bytes equal the committed ones only on a machine whose
# kernels match (training.json's "machine"), see experiments/weights/vlm_multi/README.md.
# Usage: experiments/vlm_multi_train.sh OUT_DIR [MODELS_DIR] [BUILD_DIR]
#   OUT_DIR    where to write; never the committed folder (compare with it instead)
#   MODELS_DIR default $KVSIM_MODELS, else the repository's models/ (python3 -m kvsim.models fetch)
#   BUILD_DIR  default the repository's build/
# Environment: VLM_MULTI_SEEDS ("0 1 2 3 4"), VLM_MULTI_STEPS (4000), VLM_MULTI_TASK (lookup or
# count).
set -eu
repo=$(cd "$(dirname "$0")/.." && pwd)
[ $# -ge 1 ] || { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
out=$1
. "$repo/experiments/models_dir.sh"
models=${2:-$(models_dir)}
build=${3:-$repo/build}
name=vlm_multi_train
. "$repo/experiments/vlm_setup.sh"
seeds=${VLM_MULTI_SEEDS:-0 1 2 3 4}
steps=${VLM_MULTI_STEPS:-4000}
task=${VLM_MULTI_TASK:-lookup}
case $task in
  lookup) prefix=base ;;
  count) prefix=count ;;
  *) echo "$name: VLM_MULTI_TASK is '$task': lookup or count" >&2; exit 2 ;;
esac
mkdir -p "$out"
for s in $seeds; do
  if [ -e "$out/$prefix-seed$s/training.json" ]; then
    echo "$name: seed $s: $out/$prefix-seed$s exists, kept" >&2
    continue
  fi
  echo "$name: seed $s: training $steps steps (about $((steps * 23 / 6000)) minutes on 2 cores)" >&2
  "$py" -m kvsim.vlm train-multi --models "$models" --set seed="$s" --set steps="$steps" \
    --set task="$task" --out "$out/$prefix-seed$s" >/dev/null
done
(cd "$out" && find . -name '*.safetensors' | LC_ALL=C sort | sed 's|^\./||' |
  xargs sha256sum > SHA256SUMS.partial && mv SHA256SUMS.partial SHA256SUMS)
echo "$name: weights in $out (SHA256SUMS written)" >&2
