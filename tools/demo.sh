#!/usr/bin/env bash
# The main job, run by `tools/dev demo` after a build: a local cluster
# (coordinator + 2 workers over UCX) serving the demo model, a tiny gpt-oss
# trained by the project (tools/demo_model/, built into the programs as
# `synthetic:demo`), answers a question sent through the client SDK
# (`flotilla chat --prompt`): the server renders it with Harmony, generates
# through the cluster and streams the reply back parsed into reasoning and
# answer. Then a tool-call round trip through the OpenAI-compatible HTTP API:
# the model calls add on its own, gets a result and answers with it.
# Then the cluster stops and no process of it is left. DEMO_MODEL=DIR runs the
# same on other weights (a Hugging Face gpt-oss checkpoint directory).
set -euo pipefail
build_dir="${1:?usage: demo.sh BUILD_DIR}"
model="${DEMO_MODEL:-synthetic:demo}"
bin="$build_dir/bin"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="$(mktemp -d)"
cluster_pid=""
cleanup() {
  if [[ -n "$cluster_pid" ]] && kill -0 "$cluster_pid" 2>/dev/null; then
    kill -TERM "$cluster_pid"
    wait "$cluster_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

echo "== starting a local cluster: 1 coordinator, 2 workers (TP 2, EP 2)"
# Its own session, so that every process it starts can be accounted for at the end.
setsid "$bin/flotilla" up --workers 2 --model "$model" --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 \
  --log-dir "$work/logs" >"$work/up.txt" 2>&1 &
cluster_pid=$!
for _ in $(seq 1 600); do
  grep -q 'serving' "$work/up.txt" 2>/dev/null && break
  kill -0 "$cluster_pid" 2>/dev/null || { cat "$work/up.txt"; exit 1; }
  sleep 0.1
done
cat "$work/up.txt"
addr="$(grep -o '127\.0\.0\.1:[0-9]*' "$work/up.txt" | head -1)"
[[ -n "$addr" ]] || { echo "cluster did not start"; exit 1; }
echo "== processes of the cluster: $(pgrep -s "$cluster_pid" | wc -l)"

system="You are a helpful assistant."
question="What is the capital of France?"
echo "== chat request through the SDK: flotilla chat --coordinator $addr --prompt \"$question\""
echo "   the reply the server parsed from the completion: reasoning and answer, each on its own channel"
"$bin/flotilla" chat --coordinator "$addr" --system "$system" --prompt "$question" \
  --reasoning-effort low --max-tokens 64 --temperature 0

http="$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$work/up.txt" | head -1)"
echo "== tool call through the OpenAI-compatible API: POST $http/v1/chat/completions"
node "$root/tools/demo_tool_call.js" "$http/v1" "$model"

echo "== stopping the cluster"
kill -TERM "$cluster_pid"
wait "$cluster_pid" || true
tail -n 1 "$work/up.txt"
left="$(pgrep -s "$cluster_pid" || true)"
if [[ -n "$left" ]]; then
  echo "processes left behind:"; ps -o pid,args -p "$(tr '\n' ',' <<<"$left" | sed 's/,$//')"
  exit 1
fi
cluster_pid=""
echo "== stopped: no process of the cluster is left"
