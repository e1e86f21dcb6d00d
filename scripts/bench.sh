#!/usr/bin/env bash
# `make bench`: runs every benchmark in BENCHES against the build in BUILDDIR.
# Each prints a table and appends JSON lines to BUILDDIR/bench-results.jsonl
# (format: DESIGN.md, "Benchmark output"); the previous run's file is kept as
# bench-results.jsonl.prev. Benchmarks are not tests: nothing here pass/fails
# on a number, only on a benchmark that crashed or reported an error.
#
# Usage: scripts/bench.sh [BUILDDIR] [--quick]
#   --quick (or PARADEV_BENCH_QUICK=1) asks each benchmark for a short run.
set -uo pipefail

build=${1:-build}
shift || true
args=("$@")

# The benchmarks, in order: binary name (built from bench/<name>.c).
BENCHES=(
  bench_engine
  bench_dispatch
  bench_rpc
  bench_train
)

if [ ! -d "$build" ]; then
  echo "bench: build directory $build not found (run make build first)" >&2
  exit 1
fi
results="$build/bench-results.jsonl"
if [ -f "$results" ]; then
  mv -f "$results" "$results.prev"
fi
export PARADEV_BENCH_RESULTS
PARADEV_BENCH_RESULTS=$(cd "$build" && pwd)/bench-results.jsonl

failed=()
for b in "${BENCHES[@]}"; do
  exe="$build/$b"
  if [ ! -x "$exe" ]; then
    echo "bench: $exe not built" >&2
    failed+=("$b")
    continue
  fi
  echo "=== $b"
  if ! "$exe" "${args[@]}"; then
    failed+=("$b")
  fi
  echo
done

echo "bench: results in $PARADEV_BENCH_RESULTS"
if [ ${#failed[@]} -ne 0 ]; then
  echo "bench: failed: ${failed[*]}" >&2
  exit 1
fi
