#!/usr/bin/env bash
# The main job on the built-in default, run by `tools/dev demo` after a build.
# Grows with the product: it always runs the fullest demo there is.
set -euo pipefail
build_dir="${1:?usage: demo.sh BUILD_DIR}"
"$build_dir/bin/flotilla" info
