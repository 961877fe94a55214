#!/bin/sh
# Which policies keep the answer when image tokens are evicted, and which differences hold up? On
# the assembled VLM (Google's MobileNetV2 -> a projector trained here -> Karpathy's stories260K; an
# assembled toy, built and cached by `python -m kvsim.vlm build` from the parts in MODELS_DIR,
# never from the repository) and its held-out Fashion-MNIST images, for every projector seed:
# capture the full-cache answers, replay the trace and run the model live with every policy at
# several budgets at equal memory (--equal-memory: every budgeted policy holds its budget at every
# step), with the floors (random over 5 draws, downsample, text_only), the policies that size
# their caches themselves once, and the controls (no image; another image's tokens). The report
# gives accuracy with intervals over seeds and images and its spread over seeds, paired
# comparisons over seeds and images with the floors (random, text_only) and each budget's best
# (Holm-corrected), rank stability across seeds, and replay's metrics beside; a
# prediction card tests how well replay predicts the accuracy out of sample.
# Usage: experiments/vlm_eval.sh [OUT_DIR] [MODELS_DIR] [BUILD_DIR]
#   OUT_DIR    default demo/vlm (from the current directory)
#   MODELS_DIR default $KVSIM_MODELS, else the repository's models/ (python3 -m kvsim.models fetch)
#   BUILD_DIR  default the repository's build/
# Environment: VLM_EVAL_SMALL=1 builds the small CI model and evaluates two budgets and two seeds
#   (tests); VLM_EVAL_BUDGETS overrides the budgets ("10 20 40 60"), VLM_EVAL_SEEDS the projector
#   seeds ("0 1 2 3 4 5 6 7 8 9"), VLM_EVAL_DRAWS the random floor's draws (5); VLM_EVAL_POLICIES
#   the budgeted policies and presets, comma-separated (default: the baselines, the seed methods and
#   the kvpress presets; the floors random and downsample always run), VLM_EVAL_SELF_SIZING the
#   policies that size themselves (default text_only,fastv,vtw,avl,st3; empty: none), and
#   VLM_EVAL_SET settings for every run, space-separated as --set takes them
#   ("h2o.recent=25% snapkv.window=16"); VLM_EVAL_ORDER the order (compress, the default: the
#   whole prompt compressed; tail1: its last token fed after compression, `--prompt-tail 1`;
#   tailq: its question fed after compression, `--prompt-tail question`; under a tail the
#   self-sizing runs are text_only only, and three runs of one reading in these orders are taken
#   apart by experiments/reports/vlm_factorial.py); VLM_EVAL_WINDOW=N adds the random floor that
#   protects the N newest positions (`random@window`, clamped to the budget as the SnapKV family's
#   observation window is) beside the unprotected one; VLM_EVAL_DOCS=FILE writes the run's report
#   and card into the marked regions of FILE (docs/real_model.md:
#   experiments/reports/docs_tables.py).
set -eu
set -f  # no pathname expansion: settings such as '*.decode=cap' pass as written
repo=$(cd "$(dirname "$0")/.." && pwd)
reports=$repo/experiments/reports  # the experiments' own reports
out=${1:-demo/vlm}
. "$repo/experiments/models_dir.sh"
models=${2:-$(models_dir)}
build=${3:-$repo/build}
name=vlm_eval
. "$repo/experiments/vlm_setup.sh"
small=""
budgets=${VLM_EVAL_BUDGETS:-10 20 40 60}
seeds=${VLM_EVAL_SEEDS:-0 1 2 3 4 5 6 7 8 9}
if [ "${VLM_EVAL_SMALL:-0}" = 1 ]; then
  small=--small; budgets=${VLM_EVAL_BUDGETS:-20 60}; seeds=${VLM_EVAL_SEEDS:-0 1}
fi
draws=${VLM_EVAL_DRAWS:-5}
order=${VLM_EVAL_ORDER:-compress}
case $order in
  compress | tail1 | tailq) ;;
  *) echo "vlm_eval: unknown VLM_EVAL_ORDER '$order' (compress, tail1, tailq)" >&2; exit 2 ;;
esac
tail=$(prompt_tail_of "$order")
[ -z "$tail" ] || tail="--prompt-tail $tail"
mkdir -p "$out"
# Runs quietly; on failure the command's messages are shown.
quiet() { log=$1; shift; "$@" >"$log" 2>&1 || { cat "$log" >&2; exit 1; }; }
started=$(date +%s)
step() { echo "vlm_eval [$(( $(date +%s) - started ))s]: $*" >&2; }  # progress, on stderr
gen=8  # the longest answer, " sneaker." with the end token, is 8 tokens
baselines=streamingllm,h2o,snapkv,pyramidkv,adakv,tova,knorm,expected_attention
seed_methods=lookm,hae,madakv,meda
presets=snapkv:kvpress,streamingllm:kvpress,tova:kvpress,pyramidkv:kvpress,knorm:kvpress,expected_attention:kvpress,adakv:kvpress,lookm:released
floors=random,downsample
window_set="" window_floor=""
if [ -n "${VLM_EVAL_WINDOW:-}" ]; then
  window_set=random@window.window=$VLM_EVAL_WINDOW
  floors=$floors,random@window window_floor="--set $window_set"
fi
budgeted=$floors,${VLM_EVAL_POLICIES:-$baselines,$seed_methods,$presets}
# Sizing their caches themselves: one run each, not a budget.
self_sizing=${VLM_EVAL_SELF_SIZING-text_only,fastv,vtw,avl,st3}
# Under a tail the text-only floor only: its cache, every text entry, the tail's included.
[ -n "$tail" ] && self_sizing=${VLM_EVAL_SELF_SIZING-text_only}
# The user's settings that apply to the policies of a run (comma-separated), as --set options:
# an assignment NAME.key=value joins the runs that list NAME (or every run, for '*').
settings_for() {
  found=""
  for assignment in ${VLM_EVAL_SET:-}; do
    case ",$1," in *",${assignment%%.*},"*) found="$found --set $assignment" ;; esac
    [ "${assignment%%.*}" = "*" ] && found="$found --set $assignment"
  done
  echo "$found"
}
# What this run chose, beside its results.
printf 'budgeted: %s\nself-sizing: %s\nset: %s\nbudgets: %s\nseeds: %s\ndraws: %s\norder: %s\n' \
  "$budgeted" "$self_sizing" "$(echo ${VLM_EVAL_SET:-} $window_set)" "$budgets" \
  "$seeds" "$draws" "$order" \
  >"$out/settings.txt"
runs=""
for s in $seeds; do
  dir="$out/seed$s"
  mkdir -p "$dir"
  step "seed $s: the model (built, or found in the cache)"
  vlm=$("$py" -m kvsim.vlm build --models "$models" $small --set seed="$s" | tail -n 1)
  cp "$vlm/build.json" "$dir/build.json"
  model="$vlm/model"
  # The trace: the full cache's own greedy answers, teacher-forced in replay.
  quiet "$dir/capture.log" "$k" live capture -m "$model" --prompts "$vlm/prompts.h5" --gen $gen \
    --stop-at-eos --force -o "$dir/trace.h5"
  for n in $budgets; do
    step "seed $s: budget $n%: replay and live"
    # oracle (lookahead: the best set in hindsight) has no live run; replay shows the bound.
    # shellcheck disable=SC2046  # settings_for: one word per --set and assignment
    quiet "$dir/replay_$n.log" "$k" replay "$dir/trace.h5" -p "$budgeted,oracle" --budget "$n%" \
      --equal-memory $tail --seeds "$draws" --summary "$dir/replay_$n.csv" \
      --dump-decisions "$dir/decisions_$n.h5" $window_floor $(settings_for "$budgeted,oracle")
    # shellcheck disable=SC2046
    quiet "$dir/live_$n.log" "$k" live evaluate -m "$model" --prompts "$vlm/prompts.h5" \
      -p "$budgeted" --budget "$n%" --equal-memory $tail --seeds "$draws" --gen $gen \
      --stop-at-eos --no-timing --summary "$dir/live_$n.csv" $window_floor \
      $(settings_for "$budgeted")
  done
  if [ -n "$self_sizing" ]; then
    # shellcheck disable=SC2046
    quiet "$dir/replay_self.log" "$k" replay "$dir/trace.h5" -p "$self_sizing" $tail \
      --summary "$dir/replay_self.csv" --dump-decisions "$dir/decisions_self.h5" \
      $(settings_for "$self_sizing")
    # shellcheck disable=SC2046
    quiet "$dir/live_self.log" "$k" live evaluate -m "$model" --prompts "$vlm/prompts.h5" \
      -p "$self_sizing" $tail --gen $gen --stop-at-eos --no-timing \
      --summary "$dir/live_self.csv" \
      $(settings_for "$self_sizing")
  fi
  # The controls, measured by the same code path: the answer must come from the image.
  for c in noimage swapped; do
    quiet "$dir/control_$c.log" "$k" live evaluate -m "$model" --prompts "$vlm/prompts_$c.h5" \
      -p full --gen $gen --stop-at-eos --no-timing --summary "$dir/control_$c.csv"
  done
  runs="$runs $s=$dir"
done
step "the report and the prediction card"
"$py" "$reports/vlm_eval_report.py" --budgets $budgets --seed $runs --order "$order" \
  --out "$out"
# The prediction card: replay's output error -> live accuracy, tested out of sample, with the
# targets a user would want (family-left-out error <= 0.05, within-budget Spearman >= 0.8, top-1
# regret <= 0.02); none when the full cache is at chance (one of ten class words).
"$py" -m kvsim.report.prediction_card --by-image "$out/vlm_eval_by_image.csv" \
  --outcome contains --name "assembled VLM" --targets 0.05,0.8,0.02 --chance 0.1 --out "$out/card"
# The docs quote this run: its report and card written into the document's marked regions.
if [ -n "${VLM_EVAL_DOCS:-}" ]; then
  "$py" "$reports/docs_tables.py" "$VLM_EVAL_DOCS" --run vlm_eval="$out"
fi
