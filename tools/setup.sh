#!/usr/bin/env bash
# Installs everything Flotilla needs on a fresh Debian machine, with no prompts.
# Idempotent: when every package is present and the npm cache matches the lock
# file, it changes nothing and prints one line.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# Runs a step quietly; when it fails, prints what it printed and its status,
# so the cause (a network error, a missing package) is on the screen.
quiet() {
  local log status=0
  log="$(mktemp)"
  "$@" >"$log" 2>&1 || status=$?
  if ((status != 0)); then
    echo "setup: '$*' failed with status $status; its output:" >&2
    cat "$log" >&2
    rm -f "$log"
    return "$status"
  fi
  rm -f "$log"
}

# Debian packages the build and the tests use. Keep sorted; one line each says why.
packages=(
  clang                   # libFuzzer targets (tools/fuzz.sh); clang's -fsanitize=fuzzer
  clang-format            # .ci/check_format.py: changed lines against .clang-format
  cmake                   # build system
  curl                    # tests run the curl "try:" line flotilla up prints
  g++                     # compiler (g++ 12 is what nvcc 13 accepts as host compiler)
  git                     # tests clone the tree
  iproute2                # k8s multi-host test: network namespaces, veths, ss
  libabsl-dev             # absl::Status, flags helpers, synchronization
  libboost-dev            # Boost.Beast and Asio: the coordinator's HTTP server (event-driven)
  libclang-rt-dev         # clang's runtimes: libFuzzer, ASan, UBSan (tools/fuzz.sh)
  libcli11-dev            # command-line parsing for every binary
  libcpp-httplib-dev      # HTTP clients of the CLI and the tests
  libfmt-dev              # formatting (spdlog's backend)
  libgmock-dev            # gmock
  libgrpc++-dev           # gRPC C++ (client API, cluster control, admin)
  libgtest-dev            # GoogleTest
  libpcre2-dev            # o200k pre-tokenizer regex (needs negative lookahead)
  libprotobuf-dev         # Protobuf runtime
  libspdlog-dev           # logging
  libssl-dev              # OpenSSL: TLS for gRPC/HTTPS, certificate and key checks
  libucx-dev              # UCX host-memory communicator
  libyaml-cpp-dev         # --config FILE (YAML) of every program
  ninja-build             # build tool
  nlohmann-json3-dev      # JSON (configs, safetensors headers, HTTP bodies)
  nodejs                  # independent test clients and tokenizer data
  npm                     # fetches the node packages below
  openssl                 # tests make throw-away CAs and certificates
  pkg-config              # finds UCX
  prometheus              # promtool: tests lint /metrics (promtool check metrics)
  protobuf-compiler       # protoc
  protobuf-compiler-grpc  # grpc_cpp_plugin, grpc_python_plugin (Python SDK stubs)
  python3-grpcio          # Python SDK (sdk/python) and its cluster test
  python3-protobuf        # Python SDK: generated messages, reflection descriptors
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    # node and npm may come from the machine image rather than Debian.
    case "$p" in
      nodejs) command -v node >/dev/null && continue ;;
      npm) command -v npm >/dev/null && continue ;;
    esac
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  quiet "${sudo_cmd[@]}" apt-get update -qq
  quiet "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# npm packages into a git-ignored cache, pinned by the committed lock file.
node_src="$root/tools/node"
node_dir="$root/.cache/node"
stamp="$node_dir/.lock.sha256"
want="$(sha256sum "$node_src/package-lock.json" | cut -d' ' -f1)"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" || ! -d "$node_dir/node_modules" ]]; then
  echo "setup: installing node packages into .cache/node"
  mkdir -p "$node_dir"
  cp "$node_src/package.json" "$node_src/package-lock.json" "$node_dir/"
  quiet npm ci --prefix "$node_dir" --no-audit --no-fund --loglevel=error
  echo "$want" >"$stamp"
fi

echo "setup: ok"
