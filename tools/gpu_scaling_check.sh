#!/usr/bin/env bash
# Does a second GPU make serving faster? `flotilla bench serve` (prompt
# PROMPT, output OUTPUT tokens, closed loop) against `flotilla up --device
# cuda` on one GPU and on two GPUs in the layouts LAYOUTS, each run printing
# its served JSON line and, with --engine-compare on, the engine's figures on
# the same GPUs beside it. From a bundle (tools/bundle.sh of flotilla,
# flotilla-coordinator, flotilla-worker):
#   tools/gpu_scaling_check.sh BUNDLE OUT [MODEL]
# Environment: LAYOUTS (space-separated NAME:FLAGS, flags comma-separated;
# default: one GPU, TP 2 with the tensor-parallel MoE, TP 2 with the
# expert-parallel MoE), CONCURRENCY_1GPU (default "1 32 128"),
# CONCURRENCY_2GPU ("1 64 256"), SECONDS_PER_RUN (30), PROMPT (1024), OUTPUT
# (512), ENGINE_COMPARE (on).
# Keep NCCL_NVLS_ENABLE=0 where NVLink multicast must not be used.
set -u
bundle="${1:?usage: gpu_scaling_check.sh BUNDLE OUT [MODEL]}"
out="${2:?usage: gpu_scaling_check.sh BUNDLE OUT [MODEL]}"
model="${3:-synthetic:120b}"
export LD_LIBRARY_PATH="$bundle/lib:${LD_LIBRARY_PATH:-}"
bin="$bundle/bin"
mkdir -p "$out"
status=0
layouts="${LAYOUTS:-one_gpu:--workers,1,--gpus,0 tp2_moe_tp:--workers,2,--tp,2,--gpus,0,1,--moe-parallel,tp tp2_moe_ep:--workers,2,--tp,2,--gpus,0,1,--moe-parallel,ep}"

for layout in $layouts; do
  name="${layout%%:*}"
  IFS=, read -r -a flags <<< "${layout#*:}"
  "$bin/flotilla" up --device cuda --model "$model" --listen 127.0.0.1:0 --http-listen "" \
      --log-dir "$out/$name" "${flags[@]}" > "$out/$name.txt" 2>&1 &
  up_pid=$!
  # The banner with the address comes once it serves.
  for _ in $(seq 1 300); do grep -q 'at [0-9.]*:[0-9]*' "$out/$name.txt" && break
    kill -0 "$up_pid" 2> /dev/null || break; sleep 1; done
  address=$(grep -o 'at [0-9.]*:[0-9]*' "$out/$name.txt" | head -1 | cut -c4-)
  if [[ -z "$address" ]]; then
    echo "$name: did not serve"; tail -20 "$out/$name.txt"; status=1; continue
  fi
  if [[ "$name" == one_gpu* ]]; then levels="${CONCURRENCY_1GPU:-1 32 128}"
  else levels="${CONCURRENCY_2GPU:-1 64 256}"; fi
  for c in $levels; do
    echo -n "$name c=$c: "
    "$bin/flotilla" bench serve --coordinator "$address" --concurrency "$c" \
        --duration "${SECONDS_PER_RUN:-30}" --prompt-tokens "${PROMPT:-1024}" \
        --output-tokens "${OUTPUT:-512}" --engine-compare "${ENGINE_COMPARE:-on}" \
        --engine-steps 16 || status=1
  done
  kill -INT "$up_pid" 2> /dev/null; wait "$up_pid" 2> /dev/null
done
exit $status
