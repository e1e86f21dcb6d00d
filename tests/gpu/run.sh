#!/usr/bin/env bash
# The GPU check of the CUDA backend, in one go (issue 5): configures with
# PARADEV_CUDA=ON, builds what the check needs, runs the GPU tests and the GPU
# benchmark, and prints a short table last. Meant for a machine with a GPU
# (one H200: well under 5 minutes); without one, every step says SKIP.
#
# Usage: tests/gpu/run.sh [BUILDDIR]       (default build-gpu)
#   JOBS=N        parallel build jobs (default: all cores)
#   OUT=DIR       also copy the logs and bench-results.jsonl there
# Exit status: 0 when every test passed (or skipped for want of a GPU) and the
# benchmark ran; 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-gpu}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 4)}
logs="$build/gpu-logs"
start=$(date +%s)

say() { printf '== %s\n' "$*"; }

say "GPU"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>&1 | sed 's/^/   /'
else
  echo "   nvidia-smi not found"
fi

say "configure ($build, PARADEV_CUDA=ON, Release)"
if ! cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DPARADEV_CUDA=ON >"$build.configure.log" 2>&1; then
  tail -30 "$build.configure.log"
  echo "run.sh: configure failed (log: $build.configure.log)" >&2
  exit 1
fi
grep "paradev: CUDA backend" "$build.configure.log" | sed 's/^-- /   /'
mkdir -p "$logs"
mv -f "$build.configure.log" "$logs/configure.log"

say "build (-j$jobs)"
targets=(test_gpu_backend test_gpu_ops bench_gpu)
if ! cmake --build "$build" -j "$jobs" --target "${targets[@]}" >"$logs/build.log" 2>&1; then
  grep -E "error|Error" "$logs/build.log" | head -30
  echo "run.sh: build failed (log: $logs/build.log)" >&2
  exit 1
fi
echo "   built ${targets[*]} in $(( $(date +%s) - start )) s"

# name, command, time limit (s); status: PASS, FAIL, SKIP (exit 77), TIMEOUT.
declare -a names statuses notes
run_step() {
  local name=$1 limit=$2
  shift 2
  say "$name"
  local t0 rc
  t0=$(date +%s)
  timeout --signal=TERM --kill-after=10 "$limit" "$@" >"$logs/$name.log" 2>&1
  rc=$?
  tail -n 25 "$logs/$name.log" | sed 's/^/   /'
  local status=PASS
  case $rc in
    0) status=PASS ;;
    77) status=SKIP ;;
    124|137) status=TIMEOUT ;;
    *) status=FAIL ;;
  esac
  names+=("$name")
  statuses+=("$status")
  notes+=("$(( $(date +%s) - t0 )) s, exit $rc")
}

export CMOCKA_MESSAGE_OUTPUT=stdout
export PARADEV_BENCH_RESULTS
PARADEV_BENCH_RESULTS=$(cd "$build" && pwd)/bench-results.jsonl
rm -f "$PARADEV_BENCH_RESULTS"
run_step test_gpu_backend 60 "$build/tests/gpu/test_gpu_backend"
run_step test_gpu_ops 240 "$build/tests/gpu/test_gpu_ops"
run_step bench_gpu 150 "$build/bench_gpu"

if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  cp -f "$logs"/*.log "$OUT"/ 2>/dev/null
  cp -f "$PARADEV_BENCH_RESULTS" "$OUT"/ 2>/dev/null
fi

say "summary ($(( $(date +%s) - start )) s in all)"
printf '   %-18s %-8s %s\n' step status detail
failed=0
for i in "${!names[@]}"; do
  printf '   %-18s %-8s %s\n' "${names[$i]}" "${statuses[$i]}" "${notes[$i]}"
  case ${statuses[$i]} in FAIL|TIMEOUT) failed=1 ;; esac
done
if [ -s "$PARADEV_BENCH_RESULTS" ] && command -v python3 >/dev/null 2>&1; then
  python3 - "$PARADEV_BENCH_RESULTS" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("   %-14s %-44s %10s %10s %6s" % ("bench", "params", "value", "baseline", "ratio"))
for r in rows:
    p = ", ".join("%s=%s" % (k, v) for k, v in r["params"].items() if k != "logical")
    print("   %-14s %-44s %10.1f %10.1f %6.2f  %s vs %s" % (
        r["bench"], p[:44], r["value"], r["baseline_value"] or 0, r["ratio"] or 0,
        r["metric"], r["baseline"]))
EOF
fi
exit $failed
