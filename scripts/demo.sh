#!/usr/bin/env bash
# `make demo`: runs the main example. Until the daemon and the digits
# trainer land (issues 3 and 4), the main example is the engine's mesh tour
# on the CPU backend with 4 simulated devices.
set -euo pipefail
BUILD=${1:-build}
"$BUILD/mesh_tour" --devices 4
