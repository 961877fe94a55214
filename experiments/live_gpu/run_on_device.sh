#!/bin/sh
# Every GPU figure of the live path, from a prebuilt bundle, on the GPU machine of the `device`
# tool (it has CUDA, PyTorch, transformers and h5py, but not kvsim's C++ libraries, so kvsim is
# built here and carried: ../shared/tools/device-bundle.sh writes .gpu/bundle.tar.xz). Run from the
# repository root there:
#
#   mkdir -p /tmp/kvgpu && tar -xJf .gpu/bundle.tar.xz -C /tmp/kvgpu &&
#   OUT=$OUT experiments/live_gpu/run_on_device.sh
#
# Writes to ${OUT:-gpu_results}/: device.csv and date.txt; gpu_tests.txt/.json (the GPU tests, which
# must run, not skip); decode_attention_{gqa,mha}.csv (kvsim_gpu_bench, 1k/4k/16k tokens, against
# the device's read bandwidth measured in the same run); sdpa_{gqa,mha}.csv (PyTorch SDPA on the same
# shapes, float32 and bf16, native GQA); step.csv/.json (the whole decode step of an 8-layer
# LLaMA-7B-width bf16 model with a 2k prompt against transformers on the same checkpoint, and the
# cost of h2o, tova and streamingllm in the loop); compare_transformers.json (logits against
# transformers); replay_scaling.csv (replay with -j 1, 4 and 16 on one- and four-sample
# traces of 2,048-token prompts); capture_compact.json (capture at 8k and 32k tokens with the
# compact statistics on the GPU); tables.md (all of it as the tables of docs/live.md); steps.csv (which
# step failed). A failing step does not stop the others; the exit status says whether any failed.
set -u
out=${OUT:-gpu_results}
build=${KVSIM_BUILD:-/tmp/kvgpu/build}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)  # absolute: the tests run from the build directory
export LD_LIBRARY_PATH="/tmp/kvgpu/lib:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
if [ ! -x "$build/kvsim" ]; then
  echo "run_on_device.sh: no kvsim in $build (unpack the bundle of ../shared/tools/device-bundle.sh" \
    "into /tmp/kvgpu, or set KVSIM_BUILD)" >&2
  exit 2
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/device.csv" 2>&1
date -u +%Y-%m-%d > "$out/date.txt"
echo "step,status,seconds" > "$out/steps.csv"
failed=0

# step NAME COMMAND...: runs it, logs to NAME.log, records ok/failed and its time.
step() {
  name=$1
  shift
  echo "== $name"
  start=$(date +%s)
  if "$@" > "$out/$name.log" 2>&1; then status=ok; else status=failed; failed=1; fi
  echo "$name,$status,$(($(date +%s) - start))" >> "$out/steps.csv"
  tail -5 "$out/$name.log"
}

gpu_tests() {
  (cd "$build" && ./kvsim_tests --gtest_filter='Gpu*' --gtest_output="json:$out/gpu_tests.json") \
    > "$out/gpu_tests.txt" 2>&1
  rc=$?
  cat "$out/gpu_tests.txt"
  # A device is visible here, so no GPU test may skip.
  if grep -q '^\[  SKIPPED \]' "$out/gpu_tests.txt"; then
    echo "GPU tests skipped on a machine with a device"
    return 1
  fi
  return $rc
}

step gpu_tests gpu_tests
# to_file FILE COMMAND...: the command's standard output into FILE, its status kept.
to_file() {
  file=$1
  shift
  "$@" > "$file" && cat "$file"
}

step decode_attention_gqa to_file "$out/decode_attention_gqa.csv" "$build/kvsim_gpu_bench" --kv-heads 8
step decode_attention_mha to_file "$out/decode_attention_mha.csv" "$build/kvsim_gpu_bench" --kv-heads 32
step sdpa_gqa to_file "$out/sdpa_gqa.csv" python3 "$here/bench_sdpa.py" --kv-heads 8
step sdpa_mha to_file "$out/sdpa_mha.csv" python3 "$here/bench_sdpa.py" --kv-heads 32
step whole_step python3 "$here/bench_step.py" --kvsim "$build/kvsim" --backend cuda --out "$out"
step compare_transformers python3 "$here/compare_transformers.py" --kvsim "$build/kvsim" \
  --backend cuda --out "$out/compare_transformers.json"
# kvsim.capture.hf on real transformers classes (tiny random Llama, LLaVA, Qwen2-VL), and kvsim
# live on their saved checkpoints and captured prompts against transformers' logits.
step check_hf_capture env PYTHONPATH="$here/../../python${PYTHONPATH:+:$PYTHONPATH}" \
  python3 "$here/check_hf_capture.py" --device cuda --kvsim "$build/kvsim" --backend cuda \
  --out "$out/check_hf_capture.json"
# Capture at 8k and 32k tokens with the compact statistics computed on the GPU, against a full
# capture and `kvsim compact` of it on the host's cores (docs/performance.md).
step capture_compact env PYTHONPATH="$here/../../python${PYTHONPATH:+:$PYTHONPATH}" \
  python3 "$here/capture_compact_gpu.py" --kvsim "$build/kvsim" --out "$out/capture_compact.json"
# Replay's thread scaling on the machine's cores (replay is CPU work; the GPU machine has 16).
step replay_scaling "$here/../replay_scaling.sh" "$build/kvsim" "$out" "1 4 16" 1
step tables python3 "$here/summarize.py" "$out"
cat "$out/steps.csv"
exit $failed
