#!/usr/bin/env bash
# Runs every GPU test and benchmark of a bundle on a GPU machine that lacks
# the build tools, writing logs and JSON lines to OUT:
#   tools/gpu_bundle.sh build BUNDLE     # here: bundles by ctest's labels
#   tools/gpu_suite.sh BUNDLE OUT [--quick]
# (OUT gets tests.log, benches.jsonl and benches.err.)
# The tests are the programs BUNDLE/gpu_tests.txt lists: every one holding a
# test labelled `gpu` or `multigpu`, the same set as `ctest -L 'gpu|multigpu'`.
# A multi-GPU test on a machine with one GPU skips itself and is reported as
# skipped, not passed; a script's exit 77 is a skip too.
# BUNDLE holds bin/ and lib/ (the toolkit's lib64 is added for cuBLASLt);
# the golden fixtures are taken from the source tree next to this script.
set -u
bundle="${1:?usage: gpu_suite.sh BUNDLE OUT [--quick]}"
out="${2:?usage: gpu_suite.sh BUNDLE OUT [--quick]}"
quick="${3:-}"
root="$(cd "$(dirname "$0")/.." && pwd)"
export LD_LIBRARY_PATH="$bundle/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export FLOTILLA_GOLDEN_DIR="$root/tests/data/golden"
# cuda_cluster_test and cuda_expert_balancing_test start the bundle's
# flotilla-coordinator and -worker (and flotillactl).
export FLOTILLA_BIN_DIR="$bundle/bin"
# Tests that run several ranks as processes on one GPU want the MPS daemon
# (without it they time-slice: correct, but each exchange waits for a slice).
mps_started=0
if command -v nvidia-cuda-mps-control > /dev/null && [[ -z "${CUDA_MPS_PIPE_DIRECTORY:-}" ]]; then
  export CUDA_MPS_PIPE_DIRECTORY="$out/mps-pipe" CUDA_MPS_LOG_DIRECTORY="$out/mps-log"
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d && mps_started=1
fi
stop_mps() { [[ $mps_started == 1 ]] && echo quit | nvidia-cuda-mps-control; mps_started=0; }
trap stop_mps EXIT
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
status=0
manifest="$bundle/gpu_tests.txt"
[[ -s "$manifest" ]] || { echo "gpu_suite.sh: $manifest missing (tools/gpu_bundle.sh writes it)"; exit 2; }
log="$out/tests.log"
# One program: PASSED/SKIPPED counts from gtest's summary, or the script's
# exit status (77 = skipped).
run_test() {
  local name="$1" labels="$2"; shift 2
  [[ -x "$bundle/bin/$name" ]] || { echo "$name: not in the bundle"; status=1; return; }
  echo "==== $name ($labels)" >> "$log"
  local rc=0
  timeout 1800 "$bundle/bin/$name" "$@" < /dev/null > "$out/current.log" 2>&1 || rc=$?
  local passed skipped
  passed=$(grep -oE '^\[  PASSED  \] [0-9]+' "$out/current.log" | grep -oE '[0-9]+$' || echo 0)
  skipped=$(grep -oE '^\[  SKIPPED \] [0-9]+' "$out/current.log" | grep -oE '[0-9]+$' || echo 0)
  if [[ $rc == 77 ]]; then
    echo "$name: skipped ($(grep -m1 SKIP "$out/current.log"))"
  elif [[ $rc == 0 ]]; then
    echo "$name: ${passed:-0} passed, ${skipped:-0} skipped"
  else
    echo "$name: FAILED (exit $rc)"; grep -E "FAILED|Failure|FAIL:" "$out/current.log" | head -20; status=1
  fi
  cat "$out/current.log" >> "$log"; rm -f "$out/current.log"
}
gpus=$(nvidia-smi --list-gpus 2> /dev/null | wc -l)
echo "GPUs: $gpus"
while IFS=$'\t' read -r name labels args; do
  # shellcheck disable=SC2086  # the manifest's arguments are words
  run_test "$name" "$labels" ${args//@BIN@/$bundle/bin}
  if [[ $gpus -lt 2 && ",$labels," == *,multigpu,* ]]; then echo "$name: multigpu on $gpus GPU(s): its multi-GPU cases skip"; fi
done < "$manifest"
[[ "$quick" == --quick ]] && exit $status
run_bench() {
  local name="$1"; shift
  [[ -x "$bundle/bin/$name" ]] || { echo "$name: not in the bundle"; return; }
  timeout 600 "$bundle/bin/$name" "$@" > "$out/current.jsonl" 2>> "$out/benches.err" || status=1
  cat "$out/current.jsonl" | tee -a "$out/benches.jsonl"; rm -f "$out/current.jsonl"
}
run_bench moe_cuda_bench --variant tc
run_bench attention_cuda_bench
run_bench ops_cuda_bench
run_bench engine_cuda_bench --batches 1,8,64,256 --context 1024 --prefill 2048,8192 --steps 32
exit $status
