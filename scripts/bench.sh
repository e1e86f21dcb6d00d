#!/usr/bin/env bash
# `make bench`: runs every benchmark in BENCHES against the build in BUILDDIR.
# Each prints a table and appends JSON lines to BUILDDIR/bench-results.jsonl
# (format: bench/benchutil.h); the previous run's file is kept as
# bench-results.jsonl.prev. Benchmarks are not tests: nothing here pass/fails
# on a number, only on a benchmark that crashed or reported an error.
# bench/python_bench.py (the Python package beside the C client) runs last.
# bench_gpu (the CUDA backend; built when it is) runs too where it was built:
# its exit status 77 (no GPU here) counts as skipped, not failed.
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
  bench_sched
  bench_rpc
  bench_train
  bench_fn_call
  bench_checkpoint
  bench_auth
  bench_placement
  bench_mesh
)
# Optional: run when built (bench_gpu needs the CUDA backend), never missed.
OPTIONAL_BENCHES=(
  bench_gpu
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
skipped=()
for b in "${BENCHES[@]}" "${OPTIONAL_BENCHES[@]}"; do
  exe="$build/$b"
  if [ ! -x "$exe" ]; then
    case " ${OPTIONAL_BENCHES[*]} " in
      *" $b "*) continue ;;
    esac
    echo "bench: $exe not built" >&2
    failed+=("$b")
    continue
  fi
  echo "=== $b"
  "$exe" "${args[@]}"
  rc=$?
  if [ "$rc" -eq 77 ]; then
    skipped+=("$b")
  elif [ "$rc" -ne 0 ]; then
    failed+=("$b")
  fi
  echo
done

# The Python package beside the C client (bench/python_bench.py; it needs
# Debian's python3-numpy and python3-cffi, and pyclient_baseline built).
if [ -x "$build/pyclient_baseline" ] && [ -x /usr/bin/python3 ] &&
  /usr/bin/python3 -c "import numpy, cffi" 2>/dev/null; then
  echo "=== python_bench"
  if ! /usr/bin/python3 "$(dirname "$0")/../bench/python_bench.py" \
    --build "$build" "${args[@]}"; then
    failed+=("python_bench")
  fi
  echo
else
  skipped+=("python_bench")
fi

echo "bench: results in $PARADEV_BENCH_RESULTS"
if [ ${#skipped[@]} -ne 0 ]; then
  echo "bench: skipped (exit 77: cannot run here): ${skipped[*]}"
fi
if [ ${#failed[@]} -ne 0 ]; then
  echo "bench: failed: ${failed[*]}" >&2
  exit 1
fi
