#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang (ASan + UBSan +
# libFuzzer, in their own build dir) and runs each for a bounded time, one
# process each. Exits non-zero when any target crashes, leaks, times out on an
# input or breaks a property; the input that did it is kept in
# <build>/fuzz-artifacts/ (add it to tests/fuzz/corpus/<target>/ once fixed).
#   tools/fuzz.sh [TARGET...]      default: every target
# Environment:
#   FLOTILLA_FUZZ_SECONDS    seconds per target (default 30; 0: build only)
#   FLOTILLA_FUZZ_BUILD_DIR  build dir (default <repo>/build-fuzz)
#   FLOTILLA_JOBS            build jobs (default: nproc)
# New inputs the fuzzer finds go to <build>/fuzz-corpus/<target>/ (kept
# between runs, never written into the checked-in seeds).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${FLOTILLA_FUZZ_BUILD_DIR:-$root/build-fuzz}"
seconds="${FLOTILLA_FUZZ_SECONDS:-30}"
jobs="${FLOTILLA_JOBS:-$(nproc)}"
all_targets=(http_request harmony_parser tokenizer safetensors proto_request)
targets=("$@")
((${#targets[@]})) || targets=("${all_targets[@]}")

for t in "${targets[@]}"; do
  [[ " ${all_targets[*]} " == *" $t "* ]] || { echo "fuzz: unknown target '$t' (known: ${all_targets[*]})" >&2; exit 2; }
done
command -v clang++ >/dev/null || { echo "fuzz: clang++ not found; run tools/setup.sh" >&2; exit 1; }

CC=clang CXX=clang++ cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DFLOTILLA_FUZZ=ON -DFLOTILLA_SANITIZE=ON -DFLOTILLA_WERROR=OFF -DFLOTILLA_CUDA=OFF >/dev/null
cmake --build "$build_dir" -j "$jobs" --target flotilla_fuzzers

[[ "$seconds" == 0 ]] && exit 0

export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
artifacts="$build_dir/fuzz-artifacts"
mkdir -p "$artifacts"
failed=()
for t in "${targets[@]}"; do
  work="$build_dir/fuzz-corpus/$t"
  mkdir -p "$work"
  log="$build_dir/fuzz-$t.log"
  # First every checked-in input once, whatever its size (some crash inputs
  # are larger than the fuzzing runs' -max_len).
  if ! "$build_dir/tests/fuzz/${t}_fuzzer" -rss_limit_mb=2048 "$root/tests/fuzz/corpus/$t"/* >"$log" 2>&1; then
    echo "fuzz: $t FAILED on a checked-in input; the end of $log:" >&2
    tail -n 40 "$log" >&2
    failed+=("$t")
    continue
  fi
  args=(-max_total_time="$seconds" -max_len=4096 -timeout=30 -rss_limit_mb=2048 -print_final_stats=1
        -artifact_prefix="$artifacts/$t-")
  [[ -f "$root/tests/fuzz/dict/$t.dict" ]] && args+=(-dict="$root/tests/fuzz/dict/$t.dict")
  echo "fuzz: $t for ${seconds}s"
  if "$build_dir/tests/fuzz/${t}_fuzzer" "${args[@]}" "$work" "$root/tests/fuzz/corpus/$t" >>"$log" 2>&1; then
    grep -E '^stat::number_of_executed_runs|^#[0-9]+.*DONE' "$log" | tail -2 | sed 's/^/  /'
  else
    echo "fuzz: $t FAILED; the end of $log:" >&2
    tail -n 40 "$log" >&2
    failed+=("$t")
  fi
done
if ((${#failed[@]})); then
  echo "fuzz: failures in ${failed[*]}; inputs in $artifacts" >&2
  exit 1
fi
echo "fuzz: ok (${#targets[@]} targets, ${seconds}s each)"
