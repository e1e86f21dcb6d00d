#!/usr/bin/env bash
# Installs the Debian packages paradev needs to build, test and run its demo,
# if they are missing. Says what it installs. Non-interactive.
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config
  libcmocka-dev          # unit tests
  libopenblas-dev        # CBLAS for matrix products on the CPU backend
  python3-numpy          # independent oracle in tests
  libgrpc-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler grpc-proto
  python3-grpcio         # second client implementation in tests
  libinih-dev libmicrohttpd-dev libsystemd-dev
  gnuplot-nox
  zlib1g-dev             # reading the examples' gzip data; .npz members
  libjson-c-dev          # safetensors headers; JSON the CLI and benches print
  libcurl4-openssl-dev   # HTTP range reads of checkpoints
  libssl-dev             # SHA-256 of bearer tokens (libcrypto's EVP)
  python3-cffi python3-pytest  # the Python client and its tests
  python3-venv           # a venv for what Debian lacks (safetensors)
  libgloo-dev            # collectives across machines (a mesh of daemons, CPU backend)
)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all required Debian packages are installed"
  exit 0
fi

echo "setup: installing missing Debian packages: ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "setup: not root and no sudo; install these packages and re-run: ${missing[*]}" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup: done"
