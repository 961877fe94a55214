#!/bin/sh
# Does replay predict what eviction does to a real model? On stories260K (a trained TinyStories
# LLaMA-2, read from MODEL_DIR, never from the repository) and the 24 stories of
# experiments/data/stories.jsonl (prompt = the start of a story, reference = its continuation):
# capture the trace of every story with its reference teacher-forced, replay it and run the model
# live at budgets 10-50% with the baselines and the seed methods that apply to text, and report
# replay's metrics beside the live perplexity of the references, with their rank correlations.
# Usage: experiments/stories_eval.sh [OUT_DIR] [MODEL_DIR] [BUILD_DIR]
#   OUT_DIR   default demo/stories (from the current directory)
#   MODEL_DIR default $KVSIM_MODELS/stories260K ($KVSIM_MODELS: the repository's models/, where
#             python3 -m kvsim.models fetch puts them)
#   BUILD_DIR default the repository's build/
set -eu
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-demo/stories}
. "$repo/experiments/models_dir.sh"
model=${2:-$(models_dir)/stories260K}
build=${3:-$repo/build}
[ -f "$model/config.json" ] || {
  echo "stories_eval: no checkpoint at $model (python3 -m kvsim.models fetch --model stories260K)" >&2
  exit 1
}
[ -x "$build/kvsim" ] || { cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release && cmake --build "$build" -j"$(nproc)"; }
k="$build/kvsim"
py=/usr/bin/python3
[ -x "$py" ] || py=python3
mkdir -p "$out"
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"  # the kvsim module: prompts, intervals
"$py" -m kvsim.prompts --vocab "$model" \
  --jsonl "$repo/experiments/data/stories.jsonl" -o "$out/stories.h5" --force
"$k" live capture -m "$model" --prompts "$out/stories.h5" --force-reference --force -o "$out/trace.h5"
# Text-only prompts: the methods that need image tokens (fastv, vtw, avl, st3, lookm, madakv,
# meda) have nothing to act on, and oracle has no live run.
policies=full,streamingllm,h2o,snapkv,pyramidkv,adakv,tova,knorm,hae
replays="" lives=""
for b in 10% 20% 30% 50%; do
  n=${b%\%}
  "$k" replay "$out/trace.h5" -p $policies --budget "$b" --summary "$out/replay_$n.csv" >/dev/null
  "$k" live evaluate -m "$model" --prompts "$out/stories.h5" -p $policies --budget "$b" --gen 16 \
    --no-timing --summary "$out/live_$n.csv" >/dev/null
  replays="$replays $b=$out/replay_$n.csv"
  lives="$lives $b=$out/live_$n.csv"
done
"$py" -m kvsim.report.replay_vs_live --replay $replays --live $lives --out "$out"
# The prediction card: replay's output error -> the live ΔNLL, tested out of sample.
"$py" -m kvsim.report.prediction_card --by-image "$out/by_image.csv" --outcome dnll \
  --name stories260K --out "$out/card"
