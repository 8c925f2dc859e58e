#!/usr/bin/env bash
# Lays out the image's files under ROOT from a build tree, as the Dockerfile's
# build stages do and as the k8s multi-host and image staging tests run them:
#   ROOT/opt/flotilla/bin/                 flotilla-coordinator, flotilla-worker,
#                                          flotilla, flotillactl, flotilla-pod-workers
#   ROOT/opt/flotilla/share/flotilla/      o200k_base.ranks (the tokenizer data,
#                                          found from bin/../share/flotilla)
#   ROOT/opt/flotilla/runtime-packages     the Debian packages holding the shared
#                                          libraries the programs load (with
#                                          --packages; the runtime stage installs them)
# Nothing else: no test or benchmark program is copied.
# Usage: stage.sh ROOT BUILD_DIR [--packages]
#        stage.sh --targets   (the CMake targets to build first, one line)
set -euo pipefail
programs=(flotilla-coordinator flotilla-worker flotilla flotillactl)
if [[ "${1:-}" == --targets ]]; then
  echo "${programs[*]} flotilla_tokenizer_ranks"
  exit 0
fi
root="${1:?usage: stage.sh ROOT BUILD_DIR [--packages]}"
build="${2:?usage: stage.sh ROOT BUILD_DIR [--packages]}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dest="$root/opt/flotilla"

mkdir -p "$dest/bin" "$dest/share/flotilla"
for p in "${programs[@]}"; do
  [[ -x "$build/bin/$p" ]] || { echo "stage.sh: $build/bin/$p is missing; build it first" >&2; exit 1; }
  cp -f "$build/bin/$p" "$dest/bin/"
done
cp -f "$here/flotilla-pod-workers" "$dest/bin/"
ranks="$build/share/flotilla/o200k_base.ranks"
[[ -f "$ranks" ]] || { echo "stage.sh: $ranks is missing (target flotilla_tokenizer_ranks)" >&2; exit 1; }
cp -f "$ranks" "$dest/share/flotilla/"

[[ "${3:-}" == --packages ]] || exit 0
# glibc, the C++ runtime and the GPU driver come with every base image.
skip='^(libc6|libstdc\+\+6|libgcc-s1)$'
# Each library once (the programs share most), then the package owning it.
for p in "${programs[@]}"; do
  ldd "$build/bin/$p" | awk '/=> \// {print $3}'
done | sort -u | while read -r lib; do
  real="$(readlink -f "$lib")"
  # Merged /usr: dpkg may know the file under either name.
  dpkg -S "$lib" 2>/dev/null || dpkg -S "$real" 2>/dev/null || dpkg -S "/usr$lib" 2>/dev/null || true
done | cut -d: -f1 | sort -u | grep -Ev "$skip" >"$dest/runtime-packages"
echo "stage.sh: $(wc -l <"$dest/runtime-packages") runtime packages"
