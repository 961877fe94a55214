#!/bin/sh
# Which policies keep the answer when image tokens are evicted? On the assembled VLM (Google's
# MobileNetV2 -> a projector trained here -> Karpathy's stories260K; an assembled toy, built and
# cached by `python -m kvsim.vlm build` from the parts in MODELS_DIR, never from the repository)
# and its held-out Fashion-MNIST images: capture the full-cache answers, replay the trace and run
# the model live with every policy that applies at several budgets (policies with a `decode`
# parameter hold their budget while decoding, decode=cap, so that all hold comparable memory),
# measure the controls (no image; another image's tokens), and report answer accuracy and ΔNLL per
# policy and budget beside replay's metrics, with their rank correlations.
# Usage: experiments/vlm_eval.sh [OUT_DIR] [MODELS_DIR] [BUILD_DIR]
#   OUT_DIR    default demo/vlm (from the current directory)
#   MODELS_DIR default $KVSIM_MODELS, else the shared/models folder next to the repository
#   BUILD_DIR  default the repository's build/
# Environment: VLM_EVAL_SMALL=1 builds the small CI model and evaluates two budgets (tests);
#   VLM_EVAL_BUDGETS overrides the budgets ("10 20 40 60").
set -eu
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-demo/vlm}
models=${2:-${KVSIM_MODELS:-$repo/../shared/models}}
build=${3:-$repo/build}
for part in mobilenet_v2/graph.json stories260K/config.json; do
  [ -f "$models/$part" ] || { echo "vlm_eval: no $models/$part (set KVSIM_MODELS)" >&2; exit 1; }
done
[ -x "$build/kvsim" ] || { cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release && cmake --build "$build" -j"$(nproc)"; }
k="$build/kvsim"
py=/usr/bin/python3
[ -x "$py" ] || py=python3
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
small=""
budgets=${VLM_EVAL_BUDGETS:-10 20 40 60}
if [ "${VLM_EVAL_SMALL:-0}" = 1 ]; then small=--small; budgets=${VLM_EVAL_BUDGETS:-20 60}; fi
mkdir -p "$out"
# Runs quietly; on failure the command's messages are shown.
quiet() { log=$1; shift; "$@" >"$log" 2>&1 || { cat "$log" >&2; exit 1; }; }
vlm=$("$py" -m kvsim.vlm build --models "$models" $small | tail -n 1)
model="$vlm/model"
gen=8  # the longest answer (" sweater." and the end token) is 6 tokens
# The trace: the full cache's own greedy answers, teacher-forced in replay.
quiet "$out/capture.log" "$k" live capture -m "$model" --prompts "$vlm/prompts.h5" --gen $gen \
  --stop-at-eos -o "$out/trace.h5"
baselines=full,streamingllm,h2o,snapkv,pyramidkv,adakv,tova,knorm,expected_attention
vision=fastv,vtw,lookm,hae,madakv,avl,st3,meda
presets=snapkv:kvpress,streamingllm:kvpress,tova:kvpress,pyramidkv:kvpress,knorm:kvpress,expected_attention:kvpress,adakv:kvpress,lookm:released
policies=$baselines,$vision,$presets
caps=""
for p in snapkv pyramidkv adakv knorm expected_attention lookm madakv meda snapkv:kvpress \
         pyramidkv:kvpress knorm:kvpress expected_attention:kvpress adakv:kvpress lookm:released; do
  caps="$caps --set $p.decode=cap"
done
# kvpress's pipeline compresses the context and appends the question uncompressed
# (question=append), which only replay can do; here its presets compress the whole prompt, in replay
# and live alike, so that both run the same configuration.
for p in snapkv:kvpress streamingllm:kvpress tova:kvpress pyramidkv:kvpress knorm:kvpress \
         expected_attention:kvpress adakv:kvpress; do
  caps="$caps --set $p.question=compress"
done
replays="" lives="" decisions=""
for n in $budgets; do
  # oracle (lookahead: the best set in hindsight) has no live run; replay shows the bound.
  quiet "$out/replay_$n.log" "$k" replay "$out/trace.h5" -p "$policies,oracle" --budget "$n%" $caps \
    --summary "$out/replay_$n.csv" --dump-decisions "$out/decisions_$n.h5"
  quiet "$out/live_$n.log" "$k" live evaluate -m "$model" --prompts "$vlm/prompts.h5" -p "$policies" \
    --budget "$n%" $caps --gen $gen --stop-at-eos --no-timing --summary "$out/live_$n.csv"
  replays="$replays $n%=$out/replay_$n.csv"
  lives="$lives $n%=$out/live_$n.csv"
  decisions="$decisions $n%=$out/decisions_$n.h5"
done
# The controls, measured by the same code path: the answer must come from the image.
for c in noimage swapped; do
  quiet "$out/control_$c.log" "$k" live evaluate -m "$model" --prompts "$vlm/prompts_$c.h5" -p full \
    --gen $gen --stop-at-eos --no-timing --summary "$out/control_$c.csv"
done
"$py" "$repo/analysis/vlm_eval_report.py" --trace "$out/trace.h5" --replay $replays --live $lives \
  --decisions $decisions --control no_image="$out/control_noimage.csv" \
  --control swapped="$out/control_swapped.csv" --build "$vlm/build.json" --out "$out"
