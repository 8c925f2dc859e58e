#!/usr/bin/env bash
# The main job on the built-in default, run by `tools/dev demo` after a build:
# a local cluster (coordinator + 2 workers over UCX) serving a synthetic
# gpt-oss checkpoint answers one chat request, rendered with Harmony and
# tokenized with o200k_harmony, then the cluster stops cleanly. The synthetic
# weights are random, so the answer's words are noise; every stage is real.
set -euo pipefail
build_dir="${1:?usage: demo.sh BUILD_DIR}"
bin="$build_dir/bin"
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
"$bin/flotilla" up --workers 2 --listen 127.0.0.1:0 --log-dir "$work/logs" >"$work/up.txt" 2>&1 &
cluster_pid=$!
for _ in $(seq 1 600); do
  grep -q 'serving' "$work/up.txt" 2>/dev/null && break
  kill -0 "$cluster_pid" 2>/dev/null || { cat "$work/up.txt"; exit 1; }
  sleep 0.1
done
cat "$work/up.txt"
addr="$(grep -o '127\.0\.0\.1:[0-9]*' "$work/up.txt" | head -1)"
[[ -n "$addr" ]] || { echo "cluster did not start"; exit 1; }

cat >"$work/request.json" <<'JSON'
{"messages": [
  {"role": "system", "content": "You are a helpful assistant."},
  {"role": "user", "content": "What is the capital of France?"}],
 "reasoning_effort": "low"}
JSON
echo "== chat request (OpenAI format) rendered to Harmony:"
"$bin/flotilla" render --request "$work/request.json" --date 2026-01-01
echo
prompt="$("$bin/flotilla" render --request "$work/request.json" --date 2026-01-01 --tokens | tr -d '[] \n')"
echo "== $(tr ',' '\n' <<<"$prompt" | wc -l) prompt tokens sent to the cluster at $addr"
"$bin/flotilla" generate --coordinator "$addr" --prompt-ids "$prompt" --max-tokens 24 \
  --temperature 0 --json | tee "$work/out.json"
tokens="$(sed -e 's/.*"tokens":\[\([^]]*\)\].*/\1/' "$work/out.json")"
echo "== the answer parsed back from Harmony (OpenAI message):"
"$bin/flotilla" parse --tokens "$tokens" --start-role assistant --non-strict --openai
echo "== stopping the cluster"
kill -TERM "$cluster_pid"
wait "$cluster_pid" || true
cluster_pid=""
tail -n 1 "$work/up.txt"
