#!/usr/bin/env bash
# Several instances on GPUs, as a user would run them: for each router, the
# multi-tenant prefix workload (`bench serve --workload prefix-tenants`) on
# INSTANCES instances of one GPU each and on one GPU alone (the hit ratio and
# TTFT to compare), then `bench soak` killing a GPU worker (kill -9) every
# KILL_EVERY seconds under load, which must fail no request. From a bundle
# (tools/bundle.sh of flotilla, flotilla-coordinator, flotilla-worker):
#   tools/gpu_instances_check.sh BUNDLE OUT [MODEL]
# Environment: INSTANCES (default 2), ROUTERS (default
# cache-aware,least-loaded,round-robin), BENCH_SECONDS (45), CONCURRENCY
# (64), KILL_EVERY (20), SOAK_SECONDS (60; 0: no soak), SKIP_ONE_GPU (set: no
# one-GPU run). Keep NCCL_NVLS_ENABLE=0 where NVLink multicast must not be used.
set -u
bundle="${1:?usage: gpu_instances_check.sh BUNDLE OUT [MODEL]}"
out="${2:?usage: gpu_instances_check.sh BUNDLE OUT [MODEL]}"
model="${3:-synthetic:120b}"
export LD_LIBRARY_PATH="$bundle/lib:${LD_LIBRARY_PATH:-}"
bin="$bundle/bin"
instances="${INSTANCES:-2}"
mkdir -p "$out"
status=0
up_pid=""
address=""
http=""

start() {  # NAME FLAGS...: starts `flotilla up`, sets address/http/up_pid
  local name="$1"; shift
  "$bin/flotilla" up --device cuda --model "$model" --listen 127.0.0.1:0 \
      --http-listen 127.0.0.1:0 --log-dir "$out/$name" "$@" > "$out/$name.txt" 2>&1 &
  up_pid=$!
  # The banner with the address comes once it serves (progress lines before
  # it may say "serving" too).
  for _ in $(seq 1 300); do grep -q 'at [0-9.]*:[0-9]*' "$out/$name.txt" && break
    kill -0 "$up_pid" 2> /dev/null || break; sleep 1; done
  address=$(grep -o 'at [0-9.]*:[0-9]*' "$out/$name.txt" | head -1 | cut -c4-)
  http=$(grep -o 'http://[0-9.]*:[0-9]*' "$out/$name.txt" | head -1)
  if [[ -z "$address" ]]; then
    echo "$name: did not serve"; tail -20 "$out/$name.txt"; status=1
  fi
}

stop() { kill -INT "$up_pid" 2> /dev/null; wait "$up_pid" 2> /dev/null; }

tenants() {  # NAME: the prefix workload against the running cluster
  echo -n "$1: "
  "$bin/flotilla" bench serve --coordinator "$address" --metrics-url "$http/metrics" \
      --workload prefix-tenants --concurrency "${CONCURRENCY:-64}" \
      --duration "${BENCH_SECONDS:-45}" --output-tokens 128 --engine-compare off || status=1
}

gpus=$(seq -s, 0 $((instances - 1)))
if [[ -z "${SKIP_ONE_GPU:-}" ]]; then
  start one_gpu --workers 1 --gpus 0
  [[ -n "$address" ]] && tenants one_gpu
  stop
fi
routers="${ROUTERS:-cache-aware,least-loaded,round-robin}"
for router in ${routers//,/ }; do
  start "instances_$router" --workers "$instances" --instances "$instances" --gpus "$gpus" \
      --router "$router"
  [[ -n "$address" ]] && tenants "instances_$router"
  stop
done

[[ "${SOAK_SECONDS:-60}" == 0 ]] && exit $status
start soak --workers "$instances" --instances "$instances" --gpus "$gpus"
if [[ -n "$address" ]]; then
  echo "soak (kill -9 of a GPU worker every ${KILL_EVERY:-20} s):"
  "$bin/flotilla" bench soak --coordinator "$address" --up-pid "$up_pid" \
      --kill-every "${KILL_EVERY:-20}" --duration "${SOAK_SECONDS:-60}" --concurrency 16 \
      --max-tokens 256 --report-every 20 || status=1
  grep -h "leaves instance" "$out"/soak/coordinator.log | head -5
fi
stop
exit $status
