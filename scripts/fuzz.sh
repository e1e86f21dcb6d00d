#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz/ with clang (ASan + UBSan) in
# their own build directory and runs each one (tests/fuzz/README.md).
#
#   scripts/fuzz.sh [--smoke] [--build DIR] [TARGET...]
#
# Default (`make fuzz`): each target runs FUZZ_SECONDS (default 60) seconds
# on FUZZ_JOBS (default 1) processes from its seed corpus (written at build
# time by tests/fuzz/make_seeds.py) plus what earlier runs found
# (DIR/fuzz/corpus/TARGET, kept between runs), then replays
# tests/fuzz/regressions/TARGET/. A crash's input lands in
# DIR/fuzz/findings/TARGET/ (libFuzzer's crash-*, leak-*, timeout-*).
# --smoke (ctest's fuzz.smoke): the regressions and seeds replayed, then
# FUZZ_SMOKE_RUNS (default 2000) new inputs per target: seconds, not
# minutes. Prints one line per target: executions, corpus size, findings.
# Exit: 0 clean, 1 something found or failed, 77 (SKIP) without clang.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$PWD
BUILD=build-fuzz
SMOKE=0
TARGETS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) SMOKE=1 ;;
    --build) BUILD=$2; shift ;;
    --build=*) BUILD=${1#--build=} ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option '$1' (expected --smoke, --build DIR)" >&2; exit 2 ;;
    *) TARGETS+=("$1") ;;
  esac
  shift
done
ALL=(fuzz_request fuzz_op fuzz_config fuzz_shm fuzz_checkpoint)
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=("${ALL[@]}")
for t in "${TARGETS[@]}"; do
  [[ " ${ALL[*]} " == *" $t "* ]] || { echo "fuzz.sh: no target '$t' (expected: ${ALL[*]})" >&2; exit 2; }
done

CLANG=${FUZZ_CC:-$(command -v clang || command -v clang-14 || true)}
if [ -z "$CLANG" ]; then
  echo "SKIP: fuzz: no clang on PATH (Debian: apt-get install clang); the libFuzzer targets were not built"
  exit 77
fi
if ! echo 'int LLVMFuzzerTestOneInput(const char *d, long n) { return 0; }' |
    "$CLANG" -x c -fsanitize=fuzzer -o /dev/null - 2>/dev/null; then
  echo "SKIP: fuzz: $CLANG cannot link -fsanitize=fuzzer (no libFuzzer runtime)"
  exit 77
fi

case "$BUILD" in /*) ;; *) BUILD=$SRC/$BUILD ;; esac
JOBS=${FUZZ_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}
mkdir -p "$BUILD"
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  CC=$CLANG cmake -S "$SRC" -B "$BUILD" -DPARADEV_FUZZ=ON -DPARADEV_CUDA=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$BUILD/configure.log" 2>&1 ||
    { cat "$BUILD/configure.log"; echo "fuzz.sh: configure failed" >&2; exit 1; }
fi
cmake --build "$BUILD" -j "$JOBS" --target fuzz_all >"$BUILD/fuzz-build.log" 2>&1 ||
  { tail -40 "$BUILD/fuzz-build.log"; echo "fuzz.sh: build failed (log: $BUILD/fuzz-build.log)" >&2; exit 1; }

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
SECONDS_EACH=${FUZZ_SECONDS:-60}
RUNS=${FUZZ_SMOKE_RUNS:-2000}
FJOBS=${FUZZ_JOBS:-1}
failed=0
printf '%-16s %12s %8s %8s  %s\n' TARGET EXECUTIONS "EXEC/S" CORPUS FINDINGS
for t in "${TARGETS[@]}"; do
  exe=$BUILD/tests/fuzz/$t
  seeds=$BUILD/fuzz/seeds/$t
  regress=$SRC/tests/fuzz/regressions/$t
  corpus=$BUILD/fuzz/corpus/$t
  findings=$BUILD/fuzz/findings/$t
  log=$BUILD/fuzz/$t.log
  mkdir -p "$corpus" "$findings" "$seeds" "$regress"
  : >"$log"
  found=""
  # Every regression input and seed, once (a fixed finding must stay fixed).
  inputs=()
  for d in "$regress" "$seeds"; do
    for f in "$d"/*; do [ -f "$f" ] && inputs+=("$f"); done
  done
  if [ ${#inputs[@]} -gt 0 ] &&
      ! "$exe" "${inputs[@]}" >>"$log" 2>&1; then
    found="a regression or seed input fails (see $log)"
  fi
  if [ -z "$found" ]; then
    if [ "$SMOKE" = 1 ]; then
      args=(-runs="$RUNS" -max_total_time=60)
    else
      args=(-max_total_time="$SECONDS_EACH")
      [ "$FJOBS" -gt 1 ] && args+=(-fork="$FJOBS")
    fi
    # New inputs go to the run's corpus; the seeds and regressions are
    # read-only inputs after it.
    if ! (cd "$findings" && "$exe" "${args[@]}" -timeout=10 -rss_limit_mb=2048 \
        -max_len=65536 -print_final_stats=1 "$corpus" "$seeds" "$regress") >>"$log" 2>&1; then
      found="$(ls "$findings" | head -3 | tr '\n' ' ')(see $log)"
    fi
  fi
  execs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | awk '{s+=$2} END {print s+0}')
  rate=$(grep -Eo 'stat::average_exec_per_sec: *[0-9]+' "$log" | tail -1 | awk '{print $2+0}')
  size=$(find "$corpus" "$seeds" "$regress" -type f | wc -l)
  [ -n "$found" ] && failed=1
  printf '%-16s %12s %8s %8s  %s\n' "$t" "$execs" "${rate:-0}" "$size" "${found:-none}"
  if [ -n "$found" ]; then
    grep -E 'ERROR: |SUMMARY: |runtime error|Test unit written' "$log" | head -8 | sed 's/^/    /'
  fi
done
exit $failed
