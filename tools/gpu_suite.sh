#!/usr/bin/env bash
# Runs every GPU test and benchmark of a bundle (tools/bundle.sh) on a GPU
# machine that lacks the build tools, writing logs and JSON lines to OUT:
#   tools/gpu_suite.sh BUNDLE OUT [--quick]
# (OUT gets tests.log, benches.jsonl and benches.err.)
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
for t in kernels_cuda_convert_test kernels_ops_cuda_test kernels_sampling_cuda_test \
         kernels_attention_cuda_test kernels_moe_cuda_test kernels_small_shapes_cuda_test \
         kernels_norm_qkv_rope_cuda_test cuda_synthetic_test \
         cuda_engine_test parallel_device_topology_test parallel_device_context_test \
         device_report_cuda_test cuda_cluster_test kernels_expert_count_cuda_test \
         cuda_expert_balancing_test; do
  [[ -x "$bundle/bin/$t" ]] || { echo "$t: not in the bundle"; status=1; continue; }
  log="$out/tests.log"
  echo "==== $t" >> "$log"
  if timeout 600 "$bundle/bin/$t" > "$out/current.log" 2>&1; then
    echo "$t: $(grep -E '^\[  PASSED  \]' "$out/current.log")"
  else
    echo "$t: FAILED"; grep -E "FAILED|Failure" "$out/current.log" | head -20; status=1
  fi
  cat "$out/current.log" >> "$log"; rm -f "$out/current.log"
done
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
