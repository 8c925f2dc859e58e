#!/usr/bin/env bash
# `flotilla up --device cuda` on a GPU machine, from a bundle (tools/bundle.sh
# of flotilla, flotilla-coordinator and flotilla-worker, with
# share/flotilla/o200k_base.ranks beside bin/):
#   tools/gpu_up_check.sh BUNDLE OUT
# Checks that one worker serves, and that the layouts which cannot start stop
# at once with their reason: a GPU that is not there, no visible GPU, 120b on
# four workers (tp 1) sharing one 80 GB GPU. Each child's log lands in OUT/<case>/.
set -u
bundle="${1:?usage: gpu_up_check.sh BUNDLE OUT}"
out="${2:?usage: gpu_up_check.sh BUNDLE OUT}"
export LD_LIBRARY_PATH="$bundle/lib:${LD_LIBRARY_PATH:-}"
bin="$bundle/bin"
mkdir -p "$out"
nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv,noheader
status=0

# A case that must fail: prints its time and message; fails the check if it
# started or took longer than `limit` seconds.
refused() {
  local name="$1" limit="$2"; shift 2
  local start=$(date +%s)
  if timeout 300 "$bin/flotilla" up --listen 127.0.0.1:0 --http-listen "" \
       --log-dir "$out/$name" "$@" > "$out/$name.txt" 2>&1; then
    echo "$name: started, but should have been refused"; status=1
  fi
  local took=$(( $(date +%s) - start ))
  echo "$name: refused in ${took} s: $(grep 'flotilla up:' "$out/$name.txt" | head -1)"
  (( took <= limit )) || { echo "$name: took over ${limit} s"; status=1; }
}
refused missing_gpu 5 --device cuda --workers 2 --gpus 0,64 --model synthetic:tiny:3
CUDA_VISIBLE_DEVICES= refused no_gpu 5 --device cuda --workers 1 --model synthetic:tiny:3
memory=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0)
if (( memory < 100000 )); then  # MiB: 120b over four workers needs an H200
  refused four_workers_120b 60 --device cuda --workers 4 --tp 1 --model synthetic:120b
fi

# One worker on GPU 0 serves a request, then stops on SIGINT.
"$bin/flotilla" up --device cuda --workers 1 --model synthetic:tiny:3 --listen 127.0.0.1:0 \
    --http-listen "" --log-dir "$out/one_worker" > "$out/one_worker.txt" 2>&1 &
up=$!
for _ in $(seq 1 120); do grep -q "serving" "$out/one_worker.txt" && break; sleep 1; done
address=$(grep -o 'at [0-9.]*:[0-9]*' "$out/one_worker.txt" | head -1 | cut -c4-)
if [[ -n "$address" ]] &&
   "$bin/flotilla" generate --coordinator "$address" --prompt-ids 1,2,3 --max-tokens 8 --json; then
  echo "one_worker: served at $address"
else
  echo "one_worker: did not serve"; cat "$out/one_worker.txt"; status=1
fi
kill -INT "$up"; wait "$up"
grep -h "registered from" "$out/one_worker/coordinator.log"
exit $status
