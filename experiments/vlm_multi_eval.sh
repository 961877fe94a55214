#!/bin/sh
# Which policies keep the answer when most of a long prompt is images, and does it matter whether
# the question comes before or after compression? On the assembled VLM's eight-box task (eight
# Fashion-MNIST images in numbered boxes, 392 of ~480 prompt positions, a question about one box;
# `python -m kvsim.vlm build-multi` from the committed weights), for every training seed:
# capture the full-cache answers, then replay the trace and run the model live with every policy
# at several budgets at equal memory, in four orders:
#   compress  the whole prompt, question included, is compressed (query-aware: SnapKV's window
#             sees the question), `--equal-memory`, every budgeted policy and the seed methods;
#   tail1     as compress, but the prompt's last token is fed after compression
#             (`--prompt-tail 1`): the first answer token comes from the compressed cache
#   tailq     as compress, but the whole question is fed after compression (`--prompt-tail
#             question`): the scorers do not see it, and no answer token is free
#             (these three share one reading and the same entries at every step: a factorial,
#             experiments/reports/vlm_factorial.py, takes the free first token and the scorer
#             seeing the question apart)
#   append    the context is compressed before the question is read (kvpress's pipeline), the
#             question and answer appended: the policies with a `question` parameter, each
#             compressing once to the same ceil(budget x context) entries (equal memory by
#             construction: every policy holds the same rows at every step);
# with the floors (random over several draws, unprotected and with SnapKV's 32-position recent
# window, `random@window`, in the three orders of one reading; text_only; downsample), the
# controls (no images; the asked image swapped for another class; the images shuffled among the
# boxes) and, in the append order, several questions on one compressed context
# (prompts_shared.h5: every box of 40 contexts asked in turn). The reports
# (experiments/reports/): vlm_eval_report.py reports each order and kvsim.report.prediction_card
# tests how well replay predicts its accuracy out of sample; vlm_orders.py compares the compress
# and append orders (and the single-image task, if its report is given).
# Usage: experiments/vlm_multi_eval.sh [OUT_DIR] [MODELS_DIR] [BUILD_DIR]
#   OUT_DIR    default demo/vlm_multi (from the current directory)
#   MODELS_DIR default $KVSIM_MODELS, else the repository's models/ (python3 -m kvsim.models fetch)
#   BUILD_DIR  default the repository's build/
# Environment: VLM_MULTI_WEIGHTS=DIR the trained weights (DIR/base-seedK, as
#   experiments/vlm_multi_train.sh and experiments/vlm_multi_gpu.py write them; default the
#   committed experiments/weights/vlm_multi; empty: each seed is trained here with steps=4000,
#   about 15 minutes a seed on 2 cores); VLM_MULTI_BUDGETS ("10 20 40"), VLM_MULTI_SEEDS
#   ("0 1 2 3 4"), VLM_MULTI_DRAWS (the random floor's draws, 3), VLM_MULTI_SHARED (the budget of
#   the several-questions run, 20); VLM_MULTI_SINGLE=DIR adds the single-image task's report
#   (vlm_eval.sh's OUT_DIR) to the comparison; VLM_MULTI_REPORT=0 runs without reporting (seeds
#   split over processes); VLM_MULTI_ORDERS ("compress tail1 tailq append") the orders run;
#   VLM_MULTI_POLICIES=LIST runs only these budgeted policies (a floor added to a kept run: join
#   the reports with vlm_eval_report.py --from-results A B); VLM_MULTI_EXTRAS=0
#   leaves out the self-sizing policies and the several-questions run (with one order, or
#   without them, the orders are not compared: reproduce.sh --quick); VLM_MULTI_SMALL=1 builds
#   the small CI model and evaluates one seed and two budgets (tests); VLM_MULTI_DOCS=FILE writes
#   the run's tables into the marked regions of FILE (docs/real_model.md:
#   experiments/reports/docs_tables.py); VLM_MULTI_TASK=count runs the counting form ("How many
#   boxes had a bag?", `--set task=count`: weights DIR/count-seedK, its own controls, chance one
#   count in five) instead of the lookup (the default, VLM_MULTI_TASK=lookup).
set -eu
repo=$(cd "$(dirname "$0")/.." && pwd)
reports=$repo/experiments/reports  # the experiments' own reports
out=${1:-demo/vlm_multi}
. "$repo/experiments/models_dir.sh"
models=${2:-$(models_dir)}
build=${3:-$repo/build}
name=vlm_multi_eval
. "$repo/experiments/vlm_setup.sh"
budgets=${VLM_MULTI_BUDGETS:-10 20 40}
seeds=${VLM_MULTI_SEEDS:-0 1 2 3 4}
weights=${VLM_MULTI_WEIGHTS-$repo/experiments/weights/vlm_multi}
draws=${VLM_MULTI_DRAWS:-3}
shared_budget=${VLM_MULTI_SHARED:-20}
orders=${VLM_MULTI_ORDERS:-compress tail1 tailq append}
extras=${VLM_MULTI_EXTRAS:-1}
task=${VLM_MULTI_TASK:-lookup}
case $task in
  lookup) weights_prefix=base task_set="" chance=0.1 ;;  # a guess: one of ten classes
  count) weights_prefix=count task_set="--set task=count" chance=0.2 ;;  # one of five counts
  *) echo "vlm_multi_eval: unknown task '$task' (lookup or count)" >&2; exit 2 ;;
esac
runs_order() { case " $orders " in *" $1 "*) return 0 ;; esac; return 1; }
for order in $orders; do
  case $order in
    compress | append | tail1 | tailq) ;;
    *) echo "vlm_multi_eval: unknown order '$order' (compress, append, tail1, tailq)" >&2; exit 2 ;;
  esac
done
small=""
if [ "${VLM_MULTI_SMALL:-0}" = 1 ]; then
  small=--small; budgets=${VLM_MULTI_BUDGETS:-20 60}; seeds=${VLM_MULTI_SEEDS:-0}; draws=2
fi
# Every seed's weights before any work (none for the counting form are committed).
if [ -z "$small" ] && [ -n "$weights" ]; then
  for s in $seeds; do
    [ -d "$weights/$weights_prefix-seed$s" ] || {
      echo "vlm_multi_eval: no $task weights for seed $s: $weights/$weights_prefix-seed$s is" \
        "not there (train them: VLM_MULTI_TASK=$task experiments/vlm_multi_train.sh DIR, then" \
        "VLM_MULTI_WEIGHTS=DIR; or VLM_MULTI_WEIGHTS= to train each seed here)" >&2
      exit 2
    }
  done
fi
mkdir -p "$out"
# Runs quietly unless it fails; a step whose output exists is done (a rerun resumes).
once() {
  done_file=$1; log=$2; shift 2
  [ -e "$done_file" ] && return 0
  "$@" >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
}
gen=8  # the longest answer, " sneaker." with the end token, is 8 tokens
floors=random,downsample
baselines=streamingllm,h2o,snapkv,pyramidkv,adakv,tova,knorm,expected_attention
seed_methods=lookm,hae,madakv,meda
self_sizing=text_only,fastv,vtw,avl,st3
# The random floor with the recent window the SnapKV family protects (its 32 newest positions,
# sliding while decoding), beside the unprotected one, in the orders compressed at equal memory.
window_floor=random@window
compressed="$floors,$window_floor,$baselines,$seed_methods"
oracle=,oracle
if [ -n "${VLM_MULTI_POLICIES:-}" ]; then
  compressed=$VLM_MULTI_POLICIES oracle=""
fi
wset=""
case ",$compressed," in *",$window_floor,"*) wset="--set $window_floor.window=32" ;; esac
# The policies that can compress the context before the question (a `question` parameter), and
# the settings that make each compress once, to ceil(budget x context) entries, then append.
appended=${VLM_MULTI_POLICIES:-$floors,$baselines}
set -- --set '*.question=append' --set '*.decode=grow' --set '*.compress=prefill' \
  --set h2o.mode=oneshot --set '*.budget_rounding=ceil'
runs_c="" runs_a="" runs_tail1="" runs_tailq=""
for s in $seeds; do
  # shellcheck disable=SC2086
  if [ -n "$small" ]; then
    vlm=$("$py" -m kvsim.vlm build-multi --models "$models" --small --set seed="$s" $task_set \
      --quiet)
  elif [ -n "$weights" ]; then
    vlm=$("$py" -m kvsim.vlm build-multi --models "$models" \
      --weights "$weights/$weights_prefix-seed$s" --quiet)
  else
    vlm=$("$py" -m kvsim.vlm build-multi --models "$models" --set seed="$s" --set steps=4000 \
      $task_set --quiet)
  fi
  model="$vlm/model"
  c="$out/compress/seed$s" a="$out/append/seed$s" q="$out/shared/seed$s"
  mkdir -p "$c" "$a" "$q"
  for d in "$c" "$a" "$q"; do cp "$vlm/build.json" "$d/build.json"; done
  once "$c/trace.h5" "$c/capture.log" "$k" live capture -m "$model" --prompts "$vlm/prompts.h5" --gen $gen \
    --stop-at-eos -o "$c/trace.h5"
  ln -sf "$(cd "$c" && pwd)/trace.h5" "$a/trace.h5"
  for order in tail1 tailq; do
    runs_order $order || continue
    t="$out/$order/seed$s" tail=$(prompt_tail_of $order)
    mkdir -p "$t"
    cp "$vlm/build.json" "$t/build.json"
    ln -sf "$(cd "$c" && pwd)/trace.h5" "$t/trace.h5"
    for n in $budgets; do
      once "$t/replay_$n.csv" "$t/replay_$n.log" "$k" replay "$t/trace.h5" \
        -p "$compressed$oracle" $wset --budget "$n%" --equal-memory --prompt-tail $tail \
        --seeds "$draws" --summary "$t/replay_$n.csv" --dump-decisions "$t/decisions_$n.h5"
      once "$t/live_$n.csv" "$t/live_$n.log" "$k" live evaluate -m "$model" \
        --prompts "$vlm/prompts.h5" -p "$compressed" $wset --budget "$n%" --equal-memory \
        --prompt-tail $tail --seeds "$draws" --gen $gen --stop-at-eos --no-timing \
        --summary "$t/live_$n.csv"
    done
    # The text-only floor in this order too (its cache: every text entry, the tail's included).
    once "$t/replay_self.csv" "$t/replay_self.log" "$k" replay "$t/trace.h5" -p text_only \
      --prompt-tail $tail --summary "$t/replay_self.csv" --dump-decisions "$t/decisions_self.h5"
    once "$t/live_self.csv" "$t/live_self.log" "$k" live evaluate -m "$model" \
      --prompts "$vlm/prompts.h5" -p text_only --prompt-tail $tail --gen $gen --stop-at-eos \
      --no-timing --summary "$t/live_self.csv"
    eval "runs_$order=\"\$runs_$order $s=$t\""
  done
  for n in $budgets; do
    if runs_order compress; then
      once "$c/replay_$n.csv" "$c/replay_$n.log" "$k" replay "$c/trace.h5" \
        -p "$compressed$oracle" $wset --budget "$n%" --equal-memory --seeds "$draws" \
        --summary "$c/replay_$n.csv" --dump-decisions "$c/decisions_$n.h5"
      once "$c/live_$n.csv" "$c/live_$n.log" "$k" live evaluate -m "$model" \
        --prompts "$vlm/prompts.h5" -p "$compressed" $wset --budget "$n%" --equal-memory \
        --seeds "$draws" --gen $gen --stop-at-eos --no-timing --summary "$c/live_$n.csv"
    fi
    if runs_order append; then
      once "$a/replay_$n.csv" "$a/replay_$n.log" "$k" replay "$a/trace.h5" -p "$appended" \
        --budget "$n%" "$@" --seeds "$draws" --summary "$a/replay_$n.csv" \
        --dump-decisions "$a/decisions_$n.h5"
      once "$a/live_$n.csv" "$a/live_$n.log" "$k" live evaluate -m "$model" \
        --prompts "$vlm/prompts.h5" -p "$appended" --budget "$n%" "$@" --seeds "$draws" \
        --gen $gen --stop-at-eos --no-timing --summary "$a/live_$n.csv"
    fi
  done
  if [ "$extras" = 1 ] && runs_order compress; then
    once "$c/replay_self.csv" "$c/replay_self.log" "$k" replay "$c/trace.h5" -p "$self_sizing" \
      --summary "$c/replay_self.csv" --dump-decisions "$c/decisions_self.h5"
    once "$c/live_self.csv" "$c/live_self.log" "$k" live evaluate -m "$model" \
      --prompts "$vlm/prompts.h5" -p "$self_sizing" --gen $gen --stop-at-eos --no-timing \
      --summary "$c/live_self.csv"
  fi
  for control in noimage swapped shuffled; do
    once "$c/control_$control.csv" "$c/control_$control.log" "$k" live evaluate -m "$model" \
      --prompts "$vlm/prompts_$control.h5" -p full --gen $gen --stop-at-eos --no-timing \
      --summary "$c/control_$control.csv"
    cp "$c/control_$control.csv" "$a/"
    for order in tail1 tailq; do
      if runs_order $order; then cp "$c/control_$control.csv" "$out/$order/seed$s/"; fi
    done
  done
  # Several questions on one compressed context: each context compressed once, asked every box.
  if [ "$extras" = 1 ] && runs_order append; then
    once "$q/live_$shared_budget.csv" "$q/live_$shared_budget.log" "$k" live evaluate -m "$model" \
      --prompts "$vlm/prompts_shared.h5" -p "$appended" --budget "$shared_budget%" "$@" \
      --seeds "$draws" --gen $gen --stop-at-eos --no-timing --summary "$q/live_$shared_budget.csv"
  fi
  runs_c="$runs_c $s=$c" runs_a="$runs_a $s=$a"
done
# VLM_MULTI_REPORT=0: the runs only (seeds split over processes, reported once all are done).
[ "${VLM_MULTI_REPORT:-1}" = 0 ] && exit 0
# Each order's report and prediction card (replay's output error -> live accuracy, tested out of
# sample).
for order in $orders; do
  case $order in
    compress) set -- $runs_c ;;
    append) set -- $runs_a ;;
    tail1) set -- $runs_tail1 ;;
    tailq) set -- $runs_tailq ;;
  esac
  "$py" "$reports/vlm_eval_report.py" --budgets $budgets --seed "$@" --unit item \
    --order "$order" --chance $chance --out "$out/$order"
  "$py" -m kvsim.report.prediction_card --by-image "$out/$order/vlm_eval_by_image.csv" \
    --outcome contains --name "eight-box VLM, question $order" --targets 0.05,0.8,0.02 \
    --chance $chance --out "$out/$order/card"
done
# The three orders of one reading taken apart: one change at a time.
if runs_order compress && runs_order tail1 && runs_order tailq; then
  "$py" "$reports/vlm_factorial.py" --compress "$out/compress" --tail1 "$out/tail1" \
    --tailq "$out/tailq" --out "$out" >/dev/null
fi
runs_order compress && runs_order append && [ "$extras" = 1 ] || exit 0
single=""
[ -n "${VLM_MULTI_SINGLE:-}" ] && single="--single ${VLM_MULTI_SINGLE}"
# shellcheck disable=SC2086
"$py" "$reports/vlm_orders.py" --compress "$out/compress" --append "$out/append" \
  --shared "$out/shared" --shared-budget "$shared_budget" $single --out "$out"
# The docs quote this run: its tables written into the document's marked regions.
if [ -n "${VLM_MULTI_DOCS:-}" ]; then
  "$py" "$reports/docs_tables.py" "$VLM_MULTI_DOCS" --run vlm_multi="$out" \
    --run factorial="$out"
fi
