#!/usr/bin/env bash
# Bundles what tools/gpu_suite.sh runs, chosen by ctest's labels (no hand list):
#   tools/gpu_bundle.sh BUILD_DIR BUNDLE
# Every test program with a test labelled `gpu` or `multigpu`, the programs
# those tests start (flotilla, flotilla-coordinator, flotilla-worker,
# flotillactl), the suite's benchmarks and share/ go through tools/bundle.sh;
# BUNDLE/gpu_tests.txt gets a line per program: its name, its labels (comma
# separated) and its arguments, where @BIN@ stands for BUNDLE/bin.
set -euo pipefail
build="${1:?usage: gpu_bundle.sh BUILD_DIR BUNDLE}"
bundle="${2:?usage: gpu_bundle.sh BUILD_DIR BUNDLE}"
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "$build" && pwd)"
mkdir -p "$bundle/bin"
manifest="$bundle/gpu_tests.txt"

ctest --test-dir "$build" -L 'gpu|multigpu' --show-only=json-v1 2> /dev/null |
  python3 -c '
import json, sys
build_bin = sys.argv[1] + "/bin"
programs = {}
for test in json.load(sys.stdin)["tests"]:
    command = test.get("command") or []
    if not command:
        continue
    labels = next((p["value"] for p in test.get("properties", []) if p["name"] == "LABELS"), [])
    # A gtest program runs whole (all its tests carry its labels); a script
    # keeps its arguments, the build bin directory becoming the bundle one.
    args = [] if "--gtest_filter" in " ".join(command) else command[1:]
    args = ["@BIN@" if a == build_bin else a for a in args]
    entry = programs.setdefault(command[0], [set(), args])
    entry[0].update(labels)
for path, (labels, args) in programs.items():
    print(path, ",".join(sorted(labels)), *args, sep="\t")
' "$build" > "$manifest.paths"
[[ -s "$manifest.paths" ]] || { echo "gpu_bundle.sh: ctest lists no gpu test in $build" >&2; exit 1; }

elf=()
while IFS=$'\t' read -r path labels args; do
  if file -L "$path" | grep -q ELF; then elf+=("$path"); else cp -f "$path" "$bundle/bin/"; fi
done < "$manifest.paths"
for extra in flotilla flotilla-coordinator flotilla-worker flotillactl; do
  [[ -x "$build/bin/$extra" ]] && elf+=("$build/bin/$extra")
done
for bench in moe_cuda_bench attention_cuda_bench ops_cuda_bench engine_cuda_bench; do
  [[ -x "$build/tools/$bench" ]] && elf+=("$build/tools/$bench")
done
"$root/tools/bundle.sh" "$bundle" "${elf[@]}"
[[ -d "$build/share" ]] && cp -rf "$build/share" "$bundle/"
# Names only: the paths were this machine's.
awk -F'\t' 'BEGIN { OFS = "\t" } { n = split($1, part, "/"); $1 = part[n]; print }' \
  "$manifest.paths" > "$manifest"
rm -f "$manifest.paths"
echo "gpu tests: $(wc -l < "$manifest") programs listed in $manifest"
