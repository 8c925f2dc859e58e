#!/usr/bin/env bash
# Served figures of several `flotilla up --device cuda` layouts in one run, so
# they can stand beside each other (and beside tests/cluster/two_node_test.sh's
# figures over NCCL's socket transport): for each layout, start it, serve one
# greedy request, then `flotilla bench serve` at each concurrency (prompt 1024,
# output 512, end tokens ignored), then stop it. From a bundle (tools/bundle.sh
# of flotilla, flotilla-coordinator and flotilla-worker):
#   tools/gpu_serve_layouts.sh BUNDLE OUT [MODEL]
# Environment: SERVE_LAYOUTS (default below: name=flags;...), SERVE_CONCURRENCY
# (default 1,64), SERVE_SECONDS (default 30). Keep NCCL_NVLS_ENABLE=0 on
# machines whose NVLink multicast must not be used.
set -u
bundle="${1:?usage: gpu_serve_layouts.sh BUNDLE OUT [MODEL]}"
out="${2:?usage: gpu_serve_layouts.sh BUNDLE OUT [MODEL]}"
model="${3:-synthetic:120b}"
export LD_LIBRARY_PATH="$bundle/lib:${LD_LIBRARY_PATH:-}"
bin="$bundle/bin"
mkdir -p "$out"
layouts="${SERVE_LAYOUTS:-1gpu=--workers 1;tp1_ep2_ipc=--workers 2 --tp 1 --device-transport cuda-ipc;tp1_ep2_nccl=--workers 2 --tp 1 --device-transport nccl}"
status=0

run_layout() {  # NAME FLAGS...
  local name="$1"; shift
  "$bin/flotilla" up --device cuda --model "$model" --listen 127.0.0.1:0 --http-listen "" \
      --log-dir "$out/$name" "$@" > "$out/$name.txt" 2>&1 &
  local up=$!
  for _ in $(seq 1 300); do grep -q "serving" "$out/$name.txt" && break
    kill -0 "$up" 2> /dev/null || break; sleep 1; done
  local address
  address=$(grep -o 'at [0-9.]*:[0-9]*' "$out/$name.txt" | head -1 | cut -c4-)
  if [[ -z "$address" ]]; then
    echo "$name: did not serve"; tail -20 "$out/$name.txt"; status=1
    kill -INT "$up" 2> /dev/null; wait "$up"; return
  fi
  echo "$name ($*): greedy $("$bin/flotilla" generate --coordinator "$address" \
      --prompt-ids 200,300,400,500,600 --max-tokens 16 --temperature 0 --json)"
  local concurrency="${SERVE_CONCURRENCY:-1,64}"
  for c in ${concurrency//,/ }; do
    echo -n "$name c=$c: "
    "$bin/flotilla" bench serve --coordinator "$address" --concurrency "$c" \
        --duration "${SERVE_SECONDS:-30}" --prompt-len 1024 1024 --output-len 512 512 \
        --ignore-eos --engine-compare "${SERVE_ENGINE_COMPARE:-auto}" || status=1
  done
  kill -INT "$up"; wait "$up"
}

IFS=';' read -ra entries <<< "$layouts"
for entry in "${entries[@]}"; do
  # shellcheck disable=SC2086  # the flags are words
  run_layout "${entry%%=*}" ${entry#*=}
done
exit $status
