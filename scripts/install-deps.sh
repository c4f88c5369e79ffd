#!/usr/bin/env bash
# Installs hyflow's build and test dependencies from Debian 12 packages.
# Idempotent: when everything is present it only checks (well under a second).
# Usage: scripts/install-deps.sh        (as root, or with sudo available)
set -euo pipefail

packages=(
  g++ cmake ninja-build ccache pkg-config git
  libtorch-dev            # LibTorch 1.13 (CPU) with c10d + gloo
  libcaf-dev              # C++ Actor Framework 0.17.6 (core, io, openssl)
  libcereal-dev           # DataProto wire format
  catch2                  # test framework (v2)
  libboost-program-options-dev
  libboost-dev            # Boost.Multiprecision: exact rationals of the agents' calculator tool
  libyaml-cpp-dev         # YAML: config override lists (['console','jsonl']), verl's tool/interaction files
  zlib1g-dev libsnappy-dev libzstd-dev  # GZIP, SNAPPY and ZSTD pages of Parquet datasets (trainer/src/parquet.cpp)
  nlohmann-json3-dev
  libicu-dev              # Unicode normalization (NFC, NFKC, ...) of the BPE tokenizer
  libgloo-dev
  protobuf-compiler libprotobuf-dev  # TensorBoard event files of the tensorboard tracker (protoc at build time)
  libssl-dev openssl      # HMAC for node access control; certificates for TLS
  python3-torch           # Python/PyTorch peers measured by bench/ in the same run
  python3-protobuf        # test_tensorboard_python reads the event files with Python's protobuf
  python3-matplotlib      # scripts/hyflow-plot: the panels of a run (PNG, SVG) for /usr/bin/python3
  libcpp-httplib-dev      # hyflow::serve's HTTP server (chunked streaming, keep-alive, a thread pool)
  prometheus              # promtool and the server the metrics tests check the /metrics endpoints with
  bubblewrap              # bwrap: the sandbox of the code-execution tool (agents/src/sandbox.cpp)
)

# node and npm for tests/serve/openai_npm.sh (the official `openai` client against hyflow-serve);
# Debian's when the machine has none (a NodeSource nodejs already carries npm).
if ! command -v npm >/dev/null; then
  packages+=(nodejs npm)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install ${missing[*]}" >&2; exit 1; }
  sudo=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install-deps: done"
