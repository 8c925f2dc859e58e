#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang (ASan + UBSan +
# libFuzzer, in their own build dir) and runs each for a bounded time, one
# process each, FLOTILLA_JOBS of them at once. Exits non-zero when any target
# crashes, leaks, times out on an input or breaks a property; the input that
# did it is kept in <build>/fuzz-artifacts/ (add it to
# tests/fuzz/corpus/<target>/ once fixed).
#   tools/fuzz.sh [TARGET...]      default: every target
# Environment:
#   FLOTILLA_FUZZ_SECONDS    seconds per target (default 30; 0: build only)
#   FLOTILLA_FUZZ_BUILD_DIR  build dir (default <repo>/build-fuzz)
#   FLOTILLA_JOBS            build jobs, and targets fuzzed at once (default: nproc)
# New inputs the fuzzer finds go to <build>/fuzz-corpus/<target>/ (kept
# between runs, never written into the checked-in seeds).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${FLOTILLA_FUZZ_BUILD_DIR:-$root/build-fuzz}"
seconds="${FLOTILLA_FUZZ_SECONDS:-30}"
jobs="${FLOTILLA_JOBS:-$(nproc)}"
all_targets=(http_request harmony_parser tokenizer safetensors proto_request json_schema)
targets=("$@")
((${#targets[@]})) || targets=("${all_targets[@]}")

for t in "${targets[@]}"; do
  [[ " ${all_targets[*]} " == *" $t "* ]] || { echo "fuzz: unknown target '$t' (known: ${all_targets[*]})" >&2; exit 2; }
done
command -v clang++ >/dev/null || { echo "fuzz: clang++ not found; run tools/setup.sh" >&2; exit 1; }

# -O1 with line tables only (libFuzzer's advice is -O1 or -O2): the stack
# traces keep their files and lines, and a source takes about 7% less to
# compile (coordinator/http/http_transport.cc: 55.7 -> 51.6 s of CPU).
CC=clang CXX=clang++ cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG" \
  -DFLOTILLA_FUZZ=ON -DFLOTILLA_SANITIZE=ON -DFLOTILLA_WERROR=OFF -DFLOTILLA_CUDA=OFF >/dev/null
cmake --build "$build_dir" -j "$jobs" --target flotilla_fuzzers

[[ "$seconds" == 0 ]] && exit 0

export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
artifacts="$build_dir/fuzz-artifacts"
mkdir -p "$artifacts"
# Fuzzes target $1: every checked-in input once, then new ones for `seconds`.
# Prints what it found; fails when the target does.
fuzz_one() {
  local t="$1"
  local work="$build_dir/fuzz-corpus/$t" log="$build_dir/fuzz-$t.log"
  mkdir -p "$work"
  # First every checked-in input once, whatever its size (some crash inputs
  # are larger than the fuzzing runs' -max_len).
  if ! "$build_dir/tests/fuzz/${t}_fuzzer" -rss_limit_mb=2048 "$root/tests/fuzz/corpus/$t"/* >"$log" 2>&1; then
    echo "fuzz: $t FAILED on a checked-in input; the end of $log:"
    tail -n 40 "$log"
    return 1
  fi
  local args=(-max_total_time="$seconds" -max_len=4096 -timeout=30 -rss_limit_mb=2048
              -print_final_stats=1 -artifact_prefix="$artifacts/$t-")
  [[ -f "$root/tests/fuzz/dict/$t.dict" ]] && args+=(-dict="$root/tests/fuzz/dict/$t.dict")
  echo "fuzz: $t for ${seconds}s"
  if "$build_dir/tests/fuzz/${t}_fuzzer" "${args[@]}" "$work" "$root/tests/fuzz/corpus/$t" >>"$log" 2>&1; then
    grep -E '^stat::number_of_executed_runs|^#[0-9]+.*DONE' "$log" | tail -2 | sed 's/^/  /'
  else
    echo "fuzz: $t FAILED; the end of $log:"
    tail -n 40 "$log"
    return 1
  fi
}

# Each fuzzer is one process: `jobs` targets run at once, each for its full
# `seconds`; their reports are printed in order once all are done.
declare -A pid_of
for t in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
  fuzz_one "$t" >"$build_dir/fuzz-$t.out" 2>&1 &
  pid_of[$t]=$!
done
failed=()
for t in "${targets[@]}"; do
  if wait "${pid_of[$t]}"; then
    cat "$build_dir/fuzz-$t.out"
  else
    cat "$build_dir/fuzz-$t.out" >&2
    failed+=("$t")
  fi
done
if ((${#failed[@]})); then
  echo "fuzz: failures in ${failed[*]}; inputs in $artifacts" >&2
  exit 1
fi
echo "fuzz: ok (${#targets[@]} targets, ${seconds}s each)"
