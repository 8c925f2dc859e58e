#!/usr/bin/env bash
# Copies programs and the shared libraries they need (except glibc, the C++
# runtime and the GPU driver, which every Linux GPU machine has) into DIR, so
# they run on a machine that has neither the build tools nor the Debian -dev
# packages, e.g. a GPU machine with only the driver and CUDA:
#   tools/bundle.sh DIR build/bin/flotilla build/tests/kernels/kernels_cuda_convert_test
#   # there: LD_LIBRARY_PATH=DIR/lib DIR/bin/flotilla info
# The data the programs find beside their directory (share/flotilla: the
# tokenizer's ranks, which the coordinator needs) goes to DIR/share too.
set -euo pipefail
dir="${1:?usage: bundle.sh DIR PROGRAM...}"
shift
mkdir -p "$dir/bin" "$dir/lib"
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|librt\.so|libpthread\.so|libstdc\+\+|libgcc_s|libcuda\.so|libnvidia)'
for prog in "$@"; do
  cp -f "$prog" "$dir/bin/"
  share="$(dirname "$prog")/../share/flotilla"
  if [[ -d "$share" ]]; then mkdir -p "$dir/share" && cp -rfL "$share" "$dir/share/"; fi
  ldd "$prog" | awk '/=> \// {print $1, $3}' | while read -r name path; do
    [[ "$name" =~ $skip ]] && continue
    [[ -e "$dir/lib/$name" ]] || cp -fL "$path" "$dir/lib/$name"
  done
done
du -sh "$dir" | cut -f1 | sed 's/^/bundle size: /'
