#!/usr/bin/env bash
# The GPU check of the CUDA backend in one go (issue 5), made for the lent GPU
# machine (one H200, CUDA and CMake but none of our Debian packages, nothing
# to install): runs the GPU tests, the GPU benchmark and the daemon end to
# end, each step under its own time limit inside one overall budget, and
# prints a short table last. tests/gpu/README.md says how a session runs it.
#
# Two routes to the executables:
#   bundle  .gpu-bundle/bundle.tar.xz from tests/gpu/pack.sh (built where the
#           packages are): unpacked under /tmp; LD_LIBRARY_PATH is the
#           bundle's lib/ plus the directories where this machine keeps the
#           CUDA libraries (cuBLAS, NCCL; the driver); every executable must
#           pass `ldd -r` (nothing "not found", no undefined symbol).
#   build   when there is no bundle, it does not pass that check, or
#           PARADEV_GPU_FORCE_BUILD=1: an engine-only build here
#           (-DPARADEV_ENGINE_ONLY=ON: no gRPC, so no daemon), with cmocka and
#           OpenBLAS from the bundle when there is one, else from the system.
#
# Steps, each PASS, FAIL, SKIP (exit 77, or no GPU, said why) or TIMEOUT:
#   build             (build route only)
#   test_gpu_backend  test_gpu_ops  bench_gpu
#   place_collectives  place_copy  place_pack  nccl_comm
#                     test_gpu_placement's cases (issue #17): collectives on
#                     subsets with values (logical devices on GPU 0; NCCL on
#                     distinct GPUs), CopyToDevices on one GPU and between
#                     GPUs (peer and staged), ParallelPack/Unpack sharing
#                     buffers, and NCCL communicator creation per device set
#                     beside the first collective on it (bench rows, no
#                     threshold); a case that needs two GPUs skips with one
#   daemon_mesh4      paradevd --backend cuda --mesh cuda:0,cuda:0,cuda:0,cuda:0
#                     on a Unix socket; paradev info; train_digits through it
#                     (test accuracy >= 97%, weights identical on the 4
#                     devices); SIGTERM, exit status 0
#   bench_gpu_rpc     against paradevd --mesh cuda:0 (when it was bundled)
#
# Usage: tests/gpu/run.sh
#   OUT=DIR                   also write summary.txt, bench-results.jsonl and
#                             logs.tar.gz (every log, the manifest) there
#   PARADEV_GPU_BUDGET_S=N    overall time budget, seconds (default 285)
#   PARADEV_GPU_QUICK=1       pass --quick to the benchmarks
#   PARADEV_GPU_FORCE_BUILD=1 take the build route even with a good bundle
#   PARADEV_GPU_KEEP=1        keep the work directory under /tmp
#   PARADEV_GPU_DAEMON_BACKEND=cpu  run the daemon steps on the CPU backend
#                             (as many simulated devices as the mesh has
#                             entries): checks this script's daemon plumbing
#                             on a machine without a GPU
# Exit status: 0 when no step failed or timed out (skips for want of a GPU
# included), 1 otherwise. No process outlives it.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
root=$(pwd)
SECONDS=0
budget=${PARADEV_GPU_BUDGET_S:-285}
quick_args=()
[ "${PARADEV_GPU_QUICK:-0}" = 1 ] && quick_args=(--quick)
# Under /tmp whatever TMPDIR says: Unix socket paths must stay short.
work=$(mktemp -d /tmp/paradev-gpu.XXXXXX) || exit 1
logs="$work/logs"
mkdir -p "$logs"
export PARADEV_BENCH_RESULTS="$work/bench-results.jsonl"
export CMOCKA_MESSAGE_OUTPUT=stdout
: >"$PARADEV_BENCH_RESULTS"

say() { printf '== %s\n' "$*"; }
note() { printf '   %s\n' "$*"; }
# Seconds left for a step, keeping 10 s for the summary.
left() { echo $((budget - SECONDS - 10)); }

# --- steps and their table ---------------------------------------------------------
declare -a st_name=() st_status=() st_time=() st_note=()
record() { # NAME STATUS SECONDS NOTE
  st_name+=("$1")
  st_status+=("$2")
  st_time+=("$3")
  st_note+=("$4")
  note "-> $2 ($3 s) $4"
}

# The line of a log that says why a step was skipped or failed.
why_skip() {
  grep -m1 -E 'SKIP|no CUDA GPU|no GPU|not supported' "$1" 2>/dev/null | cut -c1-150
}
why_fail() {
  local l
  # CMake: the line after "CMake Error at ...".
  l=$(grep -m1 -A1 '^CMake Error' "$1" 2>/dev/null | sed -n '2s/^ *//p' | cut -c1-150)
  # cmocka: the first failed check's message, and how many tests failed.
  [ -n "$l" ] || l=$(grep -m1 -E '^\[  ERROR   \] --- ' "$1" 2>/dev/null | cut -c1-120)
  [ -z "$l" ] || l="$l ($(grep -m1 -oE '^\[  FAILED  \] [0-9]+' "$1" | grep -oE '[0-9]+$') failed)"
  [ -n "$l" ] || l=$(grep -E 'FAIL|[Ee]rror|error:|failed|Assertion|Segmentation|Aborted|core dumped' "$1" 2>/dev/null |
    tail -1 | cut -c1-150)
  [ -n "$l" ] || l=$(grep -v '^[[:space:]]*$' "$1" 2>/dev/null | tail -1 | cut -c1-150)
  echo "$l"
}

# LD_LIBRARY_PATH for our executables only: never exported, so that this
# machine's own programs (python3, tar) keep their own libraries.
ldp=""
run_ours() { env LD_LIBRARY_PATH="$ldp" "$@"; }

# run_step NAME LIMIT CMD...: CMD under `timeout` (its whole process group is
# killed at the limit), output in logs/NAME.log, status from the exit code.
run_step() {
  local name=$1 limit=$2 rc t0 status why
  shift 2
  say "$name"
  [ "$limit" -le "$(left)" ] || limit=$(left)
  if [ "$limit" -lt 5 ]; then
    record "$name" TIMEOUT 0 "not started: the ${budget} s budget is spent"
    return
  fi
  t0=$SECONDS
  timeout -k 5 "$limit" env LD_LIBRARY_PATH="$ldp" "$@" >"$logs/$name.log" 2>&1 </dev/null
  rc=$?
  tail -n 8 "$logs/$name.log" | cut -c1-160 | sed 's/^/   | /'
  case $rc in
    0) status=PASS why="" ;;
    77) status=SKIP why=$(why_skip "$logs/$name.log") ;;
    124 | 137) status=TIMEOUT why="killed after $limit s" ;;
    *) status=FAIL why="exit $rc: $(why_fail "$logs/$name.log")" ;;
  esac
  # test_gpu_backend passes without a GPU too, saying so.
  if [ "$status" = PASS ] && grep -q "no GPU here" "$logs/$name.log"; then
    why="no GPU here: only the checks that need none ran"
  fi
  # test_gpu_placement: a case skipped beside others that passed.
  if [ "$status" = PASS ] && grep -qE '^[a-z_]+: SKIP: ' "$logs/$name.log"; then
    why="partly: $(grep -E '^[a-z_]+: SKIP: ' "$logs/$name.log" | cut -c1-100 | paste -sd';' -)"
  fi
  record "$name" "$status" $((SECONDS - t0)) "$why"
}

# --- daemons -----------------------------------------------------------------
daemon_pid=""
daemon_target=""
stop_daemon() { # sets daemon_rc
  daemon_rc=""
  [ -n "$daemon_pid" ] || return 0
  kill -TERM "$daemon_pid" 2>/dev/null
  wait "$daemon_pid" 2>/dev/null
  daemon_rc=$?
  daemon_pid=""
}
# start_daemon LABEL MESH LIMIT: paradevd under `timeout` on a Unix socket in
# the work directory, log in logs/paradevd-LABEL.log; waits until `paradev
# health` answers. Returns 0 when ready; 2 when the daemon found no GPU
# (start_why says so); 1 otherwise (start_why says why).
start_daemon() {
  local label=$1 mesh=$2 limit=$3 dir="$work/$1" deadline
  mkdir -p "$dir"
  daemon_target="unix:$dir/paradevd.sock"
  daemon_log="$logs/paradevd-$label.log"
  local devs=(--backend cuda --mesh "$mesh")
  if [ "${PARADEV_GPU_DAEMON_BACKEND:-cuda}" = cpu ]; then
    devs=(--backend cpu --devices "$(tr ',' '\n' <<<"$mesh" | grep -c .)")
  fi
  # --config /dev/null: the built-in defaults, whatever /etc/paradev holds.
  # -k 40: SIGTERM drains for up to 30 s (--drain-timeout) before KILL.
  timeout -k 40 "$limit" env LD_LIBRARY_PATH="$ldp" "$bin/paradevd" --config /dev/null \
    "${devs[@]}" --listen "$daemon_target" --admin-socket "$dir/admin.sock" \
    --log info >"$daemon_log" 2>&1 </dev/null &
  daemon_pid=$!
  deadline=$((SECONDS + 60))
  until run_ours "$bin/paradev" --target "$daemon_target" --timeout 1s health \
    >/dev/null 2>&1 </dev/null; do
    if ! kill -0 "$daemon_pid" 2>/dev/null; then
      wait "$daemon_pid"
      daemon_rc=$?
      daemon_pid=""
      if grep -q "no CUDA GPU found" "$daemon_log"; then
        start_why="paradevd: $(grep -m1 'no CUDA GPU found' "$daemon_log" |
          sed 's/^<[0-9]>//; s/^paradevd: //; s/; run with --backend=cpu.*//' | cut -c1-140)"
        return 2
      fi
      start_why="paradevd exited during start-up (status $daemon_rc): $(why_fail "$daemon_log")"
      return 1
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      start_why="paradevd did not answer a health check within 60 s"
      stop_daemon
      return 1
    fi
    sleep 0.2
  done
  return 0
}

# step_placement NAME LIMIT CASE...: test_gpu_placement's CASEs as one row.
step_placement() {
  local name=$1 limit=$2
  shift 2
  if [ ! -x "$bin/test_gpu_placement" ]; then
    say "$name"
    record "$name" SKIP 0 "no test_gpu_placement in the $route route (pack again)"
    return
  fi
  run_step "$name" "$limit" "$bin/test_gpu_placement" "$@"
}

step_daemon_mesh4() {
  local name=daemon_mesh4 t0=$SECONDS limit rc acc problems=() good
  say "$name"
  if [ "$route" != bundle ]; then
    record "$name" SKIP 0 "the engine-only build has no daemon (the bundle route has)"
    return
  fi
  # The daemon's own limit is only a safety net: it is stopped below.
  limit=$(left)
  if [ "$limit" -lt 20 ]; then
    record "$name" TIMEOUT 0 "not started: the ${budget} s budget is spent"
    return
  fi
  start_daemon mesh4 cuda:0,cuda:0,cuda:0,cuda:0 "$limit"
  rc=$?
  if [ $rc -eq 2 ]; then
    record "$name" SKIP $((SECONDS - t0)) "$start_why"
    return
  elif [ $rc -ne 0 ]; then
    record "$name" FAIL $((SECONDS - t0)) "$start_why"
    return
  fi
  if [ "${PARADEV_GPU_DAEMON_BACKEND:-cuda}" = cpu ]; then
    note "paradevd (CPU backend, 4 devices, standing in for the GPU) ready on $daemon_target after $((SECONDS - t0)) s"
  else
    note "paradevd (mesh of 4 on cuda:0) ready on $daemon_target after $((SECONDS - t0)) s"
  fi
  if ! timeout -k 5 20 env LD_LIBRARY_PATH="$ldp" "$bin/paradev" --target "$daemon_target" \
    info >"$logs/paradev-info.log" 2>&1 </dev/null; then
    problems+=("paradev info failed: $(why_fail "$logs/paradev-info.log")")
  fi
  sed 's/^/   | /' "$logs/paradev-info.log" | head -20
  limit=$(($(left) - 5))
  [ "$limit" -le 90 ] || limit=90
  timeout -k 5 "$limit" env LD_LIBRARY_PATH="$ldp" "$bin/train_digits" --target "$daemon_target" \
    --data "$bundle/data/digits.csv.gz" --min-accuracy 97 >"$logs/train_digits.log" 2>&1 </dev/null
  rc=$?
  tail -n 5 "$logs/train_digits.log" | sed 's/^/   | /'
  acc=$(awk '$1 == "test" && $2 == "accuracy" { sub("%", "", $3); print $3 }' \
    "$logs/train_digits.log")
  case $rc in
    0) ;;
    124 | 137) problems+=("train_digits killed after $limit s") ;;
    *) problems+=("train_digits exit $rc") ;;
  esac
  if [ -z "$acc" ]; then
    problems+=("no test accuracy reported")
  elif ! awk -v a="$acc" 'BEGIN { exit !(a >= 97) }'; then
    problems+=("test accuracy $acc% < 97%")
  fi
  good="weights bitwise identical on all 4 devices"
  grep -q "$good" "$logs/train_digits.log" || problems+=("weights not reported identical on 4 devices")
  stop_daemon
  [ "$daemon_rc" = 0 ] || problems+=("paradevd exit status $daemon_rc after SIGTERM (expected 0)")
  if [ ${#problems[@]} -eq 0 ]; then
    record "$name" PASS $((SECONDS - t0)) "test accuracy $acc%, weights identical on 4 devices, info ok, SIGTERM: exit 0"
  else
    local IFS=';'
    record "$name" FAIL $((SECONDS - t0)) "${problems[*]}"
  fi
}

step_bench_gpu_rpc() {
  local name=bench_gpu_rpc t0=$SECONDS limit rc status why
  say "$name"
  if [ "$route" != bundle ]; then
    record "$name" SKIP 0 "the engine-only build has no daemon or client"
    return
  fi
  if [ ! -x "$bin/bench_gpu_rpc" ]; then
    record "$name" SKIP 0 "not in the bundle (no bench_gpu_rpc target when it was packed)"
    return
  fi
  limit=$(left)
  if [ "$limit" -lt 20 ]; then
    record "$name" TIMEOUT 0 "not started: the ${budget} s budget is spent"
    return
  fi
  start_daemon mesh1 cuda:0 "$limit"
  rc=$?
  if [ $rc -eq 2 ]; then
    record "$name" SKIP $((SECONDS - t0)) "$start_why"
    return
  elif [ $rc -ne 0 ]; then
    record "$name" FAIL $((SECONDS - t0)) "$start_why"
    return
  fi
  limit=$(($(left) - 5))
  [ "$limit" -le 100 ] || limit=100
  timeout -k 5 "$limit" env LD_LIBRARY_PATH="$ldp" "$bin/bench_gpu_rpc" --target "$daemon_target" \
    "${quick_args[@]}" >"$logs/bench_gpu_rpc.log" 2>&1 </dev/null
  rc=$?
  tail -n 8 "$logs/bench_gpu_rpc.log" | cut -c1-160 | sed 's/^/   | /'
  stop_daemon
  case $rc in
    0) status=PASS why="" ;;
    77) status=SKIP why=$(why_skip "$logs/bench_gpu_rpc.log") ;;
    124 | 137) status=TIMEOUT why="killed after $limit s" ;;
    *) status=FAIL why="exit $rc: $(why_fail "$logs/bench_gpu_rpc.log")" ;;
  esac
  if [ "$daemon_rc" != 0 ] && [ "$status" != TIMEOUT ]; then
    status=FAIL why="$why; paradevd exit status $daemon_rc after SIGTERM"
  fi
  record "$name" "$status" $((SECONDS - t0)) "$why"
}

# --- the end: summary, $OUT, clean-up -----------------------------------------------
finished=0
finish() {
  [ "$finished" = 1 ] && return
  finished=1
  local i failed=0 summary="$work/summary.txt"
  {
    say "summary: route ${route:-none}${route_note:+ ($route_note)}; $SECONDS s of the ${budget} s budget"
    printf '   %-17s %-7s %5s  %s\n' step status time note
    for i in "${!st_name[@]}"; do
      printf '   %-17s %-7s %4ss  %s\n' "${st_name[$i]}" "${st_status[$i]}" "${st_time[$i]}" \
        "${st_note[$i]}"
    done
    if [ -s "$PARADEV_BENCH_RESULTS" ] && command -v python3 >/dev/null 2>&1; then
      python3 - "$PARADEV_BENCH_RESULTS" <<'EOF'
import json, sys
rows = []
for line in open(sys.argv[1]):
    try:
        rows.append(json.loads(line))
    except ValueError:
        pass
def num(v):
    return "%.4g" % v if isinstance(v, (int, float)) else "-"
def param(k, v):
    if k.endswith("bytes") and isinstance(v, int) and v >= 1 << 20 and v % (1 << 20) == 0:
        return "%s=%dMiB" % (k, v >> 20)
    return "%s=%s" % (k, v)
fmt = "   %-16s %-40s %9s %9s %6s  %s"
print(fmt % ("bench", "params", "value", "baseline", "ratio", "metric vs baseline"))
for r in rows:
    p = r.get("params") or {}
    if isinstance(p, dict):
        p = ", ".join(param(k, v) for k, v in p.items() if k != "logical")
    ratio = r.get("ratio")
    print(fmt % (str(r.get("bench", "?"))[:16], str(p)[:40], num(r.get("value")),
                 num(r.get("baseline_value")),
                 "%.2f" % ratio if isinstance(ratio, (int, float)) else "-",
                 "%s vs %s" % (r.get("metric", "?"), r.get("baseline") or "-")))
EOF
    elif [ -s "$PARADEV_BENCH_RESULTS" ]; then
      sed 's/^/   /' "$PARADEV_BENCH_RESULTS"
    else
      note "(no benchmark results)"
    fi
  } >"$summary"
  for i in "${!st_status[@]}"; do
    case ${st_status[$i]} in FAIL | TIMEOUT) failed=1 ;; esac
  done
  if [ "$interrupted" = 1 ]; then
    failed=1
    echo "   run.sh was interrupted (signal) before every step ran" >>"$summary"
  fi
  if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    cp -f "$summary" "$OUT/summary.txt"
    cp -f "$PARADEV_BENCH_RESULTS" "$OUT/bench-results.jsonl"
    tar -C "$work" -czf "$OUT/logs.tar.gz" logs 2>/dev/null
  fi
  echo
  cat "$summary"
  [ -n "${OUT:-}" ] && note "(OUT: summary.txt, bench-results.jsonl, logs.tar.gz)"
  exit_status=$failed
}
cleanup() {
  # A daemon still up (interrupted): SIGTERM through its `timeout`, then
  # SIGKILL to that process group (timeout leads its own group).
  if [ -n "$daemon_pid" ]; then
    kill -TERM "$daemon_pid" 2>/dev/null
    local i
    for i in 1 2 3 4 5 6 7 8 9 10; do
      kill -0 "$daemon_pid" 2>/dev/null || break
      sleep 0.5
    done
    kill -KILL -- "-$daemon_pid" 2>/dev/null
    wait "$daemon_pid" 2>/dev/null
    daemon_pid=""
  fi
  finish
  if [ "${PARADEV_GPU_KEEP:-0}" = 1 ]; then
    echo "run.sh: work directory kept: $work"
  else
    rm -rf "$work"
  fi
}
exit_status=1
interrupted=0
trap 'cleanup; exit $exit_status' EXIT
trap 'echo "run.sh: interrupted" >&2; interrupted=1; exit 130' INT TERM

# --- the machine -------------------------------------------------------------
say "machine"
note "$( (. /etc/os-release && echo "$PRETTY_NAME") 2>/dev/null || uname -s), glibc $(getconf \
  GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}'), $(nproc) cores, $(uname -m)"
if command -v nvidia-smi >/dev/null 2>&1; then
  timeout 20 nvidia-smi --query-gpu=index,name,memory.total,driver_version,compute_cap \
    --format=csv,noheader >"$logs/nvidia-smi.log" 2>&1
  sed 's/^/   GPU /' "$logs/nvidia-smi.log"
else
  note "nvidia-smi not found"
fi

# --- where this machine keeps the CUDA libraries ----------------------------------
# pip's site-packages that hold nvidia/* wheels (asked once).
site_dirs=""
if command -v python3 >/dev/null 2>&1; then
  site_dirs=$(timeout 20 python3 -c 'import site, sysconfig
print("\n".join(site.getsitepackages() + [sysconfig.get_paths()["purelib"]]))' 2>/dev/null)
fi
# shellcheck disable=SC2086
site_dirs=$(printf '%s\n' $site_dirs /opt/torch/.venv/lib/python3*/site-packages \
  /usr/local/lib/python3*/dist-packages /usr/lib/python3/dist-packages |
  while read -r d; do if [ -d "$d/nvidia" ]; then echo "$d"; fi; done | awk '!seen[$0]++')
# The last resort, once for every library we may need: a bounded search.
deep_names="libcublas.so.13 libcublasLt.so.13 libnccl.so.2 libcudart.so.13 libcuda.so.1"
deep_done=0
deep_find() {
  [ "$deep_done" = 1 ] && return
  deep_done=1
  local n args=()
  for n in $deep_names; do args+=(-o -name "$n"); done
  timeout 20 find /usr /opt /lib /lib64 -xdev -maxdepth 9 \( "${args[@]:1}" \) \
    -not -path '*/stubs/*' -not -path '*/compat/*' >"$work/deep-find.txt" 2>/dev/null
}
# find_lib NAME: sets found to the path of a shared library (never a stub or
# a forward-compatibility driver), looked for in LD_LIBRARY_PATH, the dynamic
# linker's cache, the CUDA toolkit and driver directories, pip's nvidia-*
# wheels, then by the bounded search; empty when it is nowhere.
find_lib() {
  local name=$1 d s
  found=""
  local IFS=:
  for d in ${LD_LIBRARY_PATH:-}; do
    [ -n "$d" ] && [ -e "$d/$name" ] && found="$d/$name" && return
  done
  IFS=$' \t\n'
  found=$(ldconfig -p 2>/dev/null | awk -v n="$name" '$1 == n && /x86-64/ { print $NF; exit }')
  [ -n "$found" ] && [ -e "$found" ] && return
  found=""
  for d in ${CUDA_HOME:-} ${CUDA_PATH:-} /usr/local/cuda /usr/local/cuda-* /usr/local/nvidia \
    /usr /usr/lib/wsl; do
    for s in lib64 lib targets/x86_64-linux/lib lib/x86_64-linux-gnu; do
      [ -e "$d/$s/$name" ] && found="$d/$s/$name" && return
    done
  done
  for d in $site_dirs; do
    found=$(find "$d/nvidia" -maxdepth 4 -name "$name" -not -path '*/stubs/*' -print -quit \
      2>/dev/null)
    [ -n "$found" ] && return
  done
  deep_find
  found=$(grep -m1 "/$name\$" "$work/deep-find.txt" 2>/dev/null)
}
# machine_libs NAME...: finds each; adds to lib_dirs (for LD_LIBRARY_PATH)
# the directories the dynamic linker would not search by itself, and prints
# where each was found.
lib_dirs=""
machine_libs() {
  local name d
  for name in "$@"; do
    find_lib "$name"
    if [ -z "$found" ]; then
      note "$(printf '%-18s' "$name") NOT FOUND on this machine"
      continue
    fi
    d=$(dirname "$found")
    note "$(printf '%-18s' "$name") $found"
    if ! ldconfig -p 2>/dev/null | awk -v f="$found" '$NF == f { hit = 1 } END { exit !hit }'; then
      case ":$lib_dirs:" in *":$d:"*) ;; *) lib_dirs="${lib_dirs:+$lib_dirs:}$d" ;; esac
    fi
  done
}

# --- route 1: the bundle ----------------------------------------------------------
route=""
route_note=""
bundle=""
bin=""
why_build=""
unpack_bundle() {
  local tarball="$root/.gpu-bundle/bundle.tar.xz"
  [ -f "$tarball" ] || return 1
  mkdir -p "$work/b"
  if command -v xz >/dev/null 2>&1; then
    tar -C "$work/b" -xJf "$tarball" 2>"$logs/unpack.log" || return 1
  else
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
      "$tarball" "$work/b" 2>"$logs/unpack.log" || return 1
  fi
  bundle="$work/b/paradev-gpu-bundle"
  [ -f "$bundle/MANIFEST" ]
}
# check_bundle: sets ldp; 0 when every executable resolves every library.
check_bundle() {
  local e out p problems compat=""
  say "bundle: $(sed -n 's/^built //p' "$bundle/MANIFEST")"
  cp "$bundle/MANIFEST" "$logs/MANIFEST"
  if (cd "$root" && sha256sum -c --quiet "$bundle/sources.sha256") >"$logs/sources-check.log" 2>&1; then
    note "sources: the bundle was built from this tree's sources"
  else
    route_note="STALE: $(grep -c ': FAILED' "$logs/sources-check.log") source files differ from the"
    route_note+=" bundle's, e.g. $(grep -m1 ': FAILED' "$logs/sources-check.log" | cut -d: -f1);"
    route_note+=" rerun tests/gpu/pack.sh"
    note "WARNING: $route_note"
  fi
  note "libraries from this machine (the rest, $(grep -c '^lib ' "$bundle/MANIFEST"), from the bundle):"
  # shellcheck disable=SC2046
  machine_libs $(sed -n 's/^machine //p' "$bundle/MANIFEST")
  for compat in "" "$bundle/lib-compat"; do
    ldp="$bundle/lib${lib_dirs:+:$lib_dirs}${compat:+:$compat}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    problems=""
    : >"$logs/ldd.log"
    for e in "$bundle"/bin/*; do
      if command -v ldd >/dev/null 2>&1; then
        out=$(env LD_LIBRARY_PATH="$ldp" ldd -r "$e" 2>&1)
      else
        out=$(env LD_LIBRARY_PATH="$ldp" LD_TRACE_LOADED_OBJECTS=1 LD_WARN=yes LD_BIND_NOW=yes "$e" 2>&1)
      fi
      printf '== %s\n%s\n' "$e" "$out" >>"$logs/ldd.log"
      p=$(grep -E "not found|undefined symbol|No such file|not a dynamic" <<<"$out" |
        sed "s/[[:space:]]\{1,\}/ /g; s|^ *|$(basename "$e"): |")
      [ -z "$p" ] || problems+="$p"$'\n'
    done
    if [ -z "$problems" ]; then
      [ -n "$compat" ] && note "libstdc++/libgcc_s: the machine's are missing or too old; the bundle's are used"
      note "ldd -r: every executable resolves every library; the loader takes:"
      awk -v b="$bundle/" '$2 == "=>" && index($3, b) != 1 && !seen[$1]++ &&
        $1 !~ /^(libc|libm|libpthread|libdl|librt|ld-linux.*)\.so/ { printf "   %-18s %s\n", $1, $3 }' \
        "$logs/ldd.log"
      echo "LD_LIBRARY_PATH=$ldp" >>"$logs/ldd.log"
      return 0
    fi
  done
  printf '%s' "$problems" | head -5 | sed 's/^/   ldd: /'
  why_build="the bundle's executables do not load here: $(printf '%s' "$problems" | head -1)"
  return 1
}

if [ "${PARADEV_GPU_FORCE_BUILD:-0}" = 1 ]; then
  why_build="PARADEV_GPU_FORCE_BUILD=1"
  unpack_bundle || bundle=""
elif ! unpack_bundle; then
  why_build="no usable .gpu-bundle/bundle.tar.xz (run tests/gpu/pack.sh and carry .gpu-bundle)"
  bundle=""
elif check_bundle; then
  route=bundle
  bin="$bundle/bin"
fi

# --- route 2: an engine-only build here ---------------------------------------------
find_nvcc() {
  local c
  for c in "$(command -v nvcc 2>/dev/null)" ${CUDA_HOME:+$CUDA_HOME/bin/nvcc} \
    /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc; do
    [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return; }
  done
}
build_here() {
  local name=build t0=$SECONDS nvcc tk args=() gen=() limit rc f
  say "$name (engine only: $why_build)"
  route=build
  route_note="$why_build"
  nvcc=$(find_nvcc)
  if [ -z "$nvcc" ]; then
    record "$name" FAIL 0 "no nvcc on PATH, in CUDA_HOME or /usr/local/cuda*"
    return 1
  fi
  tk=$(cd "$(dirname "$nvcc")/.." && pwd)
  note "nvcc: $nvcc ($("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'))"
  args=(-DCMAKE_BUILD_TYPE=Release -DPARADEV_CUDA=ON -DPARADEV_ENGINE_ONLY=ON
    -DCMAKE_CUDA_ARCHITECTURES=90 "-DCMAKE_CUDA_COMPILER=$nvcc")
  if [ -n "$bundle" ] && [ -f "$bundle/include/cmocka.h" ]; then
    args+=("-DCMAKE_PREFIX_PATH=$bundle")
    note "cmocka and OpenBLAS: the bundle's"
  else
    note "cmocka and OpenBLAS: the system's (no bundle)"
  fi
  if ls "$tk"/lib64/libcudart_static.a "$tk"/lib/libcudart_static.a \
    "$tk"/targets/x86_64-linux/lib/libcudart_static.a >/dev/null 2>&1; then
    args+=(-DPARADEV_CUDART_STATIC=ON)
  fi
  # A toolkit without cuBLAS's development links: point FindCUDAToolkit at
  # the versioned libraries wherever they are (pip's wheels have only those).
  for f in cublas cublasLt; do
    if ! ls "$tk"/lib64/lib$f.so "$tk"/lib/lib$f.so "$tk"/targets/x86_64-linux/lib/lib$f.so \
      >/dev/null 2>&1; then
      find_lib "lib$f.so.13"
      [ -n "$found" ] && args+=("-DCUDA_${f}_LIBRARY=$found") && note "lib$f: $found"
    fi
  done
  command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
  limit=$(($(left) - 60))
  [ "$limit" -le 170 ] || limit=170
  if [ "$limit" -lt 30 ]; then
    record "$name" TIMEOUT 0 "not started: the ${budget} s budget is spent"
    return 1
  fi
  local b="$work/build"
  timeout -k 5 "$limit" cmake -S "$root" -B "$b" "${gen[@]}" "${args[@]}" \
    >"$logs/build-configure.log" 2>&1 </dev/null
  rc=$?
  grep -E "paradev: " "$logs/build-configure.log" | sed 's/^-- /   /'
  if [ $rc -eq 0 ]; then
    limit=$((limit - (SECONDS - t0)))
    timeout -k 5 "$limit" cmake --build "$b" -j "$(nproc)" --target test_gpu_backend \
      test_gpu_ops test_gpu_placement bench_gpu >"$logs/build.log" 2>&1 </dev/null
    rc=$?
    [ $rc -eq 0 ] || grep -E -A3 "error|FAILED|Error" "$logs/build.log" | head -20 | sed 's/^/   | /'
  else
    tail -15 "$logs/build-configure.log" | sed 's/^/   | /'
  fi
  f="$logs/build.log"
  [ -f "$f" ] || f="$logs/build-configure.log"
  case $rc in
    0) record "$name" PASS $((SECONDS - t0)) "engine only, $(nproc) jobs" ;;
    124 | 137) record "$name" TIMEOUT $((SECONDS - t0)) "killed after $limit s" ;;
    *) record "$name" FAIL $((SECONDS - t0)) "$(basename "$f"): $(why_fail "$f")" ;;
  esac
  [ $rc -eq 0 ] || return 1
  mkdir -p "$work/bin"
  for f in tests/gpu/test_gpu_backend tests/gpu/test_gpu_ops tests/gpu/test_gpu_placement \
    bench_gpu; do
    ln -sf "$b/$f" "$work/bin/$(basename "$f")"
  done
  bin="$work/bin"
  # Our libraries (the bundle's cmocka, OpenBLAS, gfortran) and CUDA's.
  note "libraries from this machine:"
  machine_libs libcublas.so.13 libcublasLt.so.13 libnccl.so.2 libcuda.so.1
  ldp="${bundle:+$bundle/lib}${lib_dirs:+:$lib_dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  ldp=${ldp#:}
  return 0
}

if [ "$route" != bundle ] && ! build_here; then
  exit 1 # the EXIT trap prints the summary
fi

# --- the steps -------------------------------------------------------------------
run_step test_gpu_backend 60 "$bin/test_gpu_backend"
run_step test_gpu_ops 150 "$bin/test_gpu_ops"
run_step bench_gpu 120 "$bin/bench_gpu" "${quick_args[@]}"
step_placement place_collectives 60 subset_collectives subset_collectives_nccl
step_placement place_copy 60 copy_logical copy_gpus
step_placement place_pack 30 pack_unpack
step_placement nccl_comm 60 nccl_comm_timing
step_daemon_mesh4
step_bench_gpu_rpc
