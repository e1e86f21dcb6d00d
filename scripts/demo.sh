#!/usr/bin/env bash
# `make demo`: the main example against a real daemon. Starts paradevd on the
# CPU backend with 4 simulated devices on a temporary Unix socket, waits until
# it answers health checks, trains the digits classifier through it
# (examples/train_digits.c: data-parallel over the mesh, gradient tape and
# all-reduce on the daemon), then -- without options, where Debian's NumPy and
# cffi are installed -- trains it again from Python (examples/train_digits.py
# through the paradev package). The C trainer has the daemon save its weights
# (SaveTensors) in a checkpoints directory that is the daemon's storage root;
# a second step loads them in a fresh session (LoadTensors) and must report
# the same test accuracy. Then it stops the daemon with SIGTERM and checks
# that it exited 0. Exits non-zero if any of that failed; the temporary
# directory and the daemon go in every case.
#
# Usage: scripts/demo.sh [BUILD_DIR] [TRAIN_DIGITS_OPTION...]
#   Options go to train_digits; without any: --plot BUILD_DIR/train_digits.png
#   --min-accuracy 95. DEMO_DEVICES sets the mesh size (default 4).
# The Makefile builds first (make demo); this script builds nothing.
set -uo pipefail

build=${1:-build}
shift || true
devices=${DEMO_DEVICES:-4}
if [ $# -gt 0 ]; then
  args=("$@")
else
  args=(--plot "$build/train_digits.png" --min-accuracy 95)
fi

paradevd="$build/server/paradevd"
paradev="$build/client/paradev"
trainer="$build/train_digits"
for exe in "$paradevd" "$paradev" "$trainer"; do
  if [ ! -x "$exe" ]; then
    echo "demo: $exe not built (run make demo, which builds first)" >&2
    exit 1
  fi
done

dir=$(mktemp -d "${TMPDIR:-/tmp}/paradev-demo.XXXXXX") || exit 1
target="unix:$dir/paradevd.sock"
daemon_pid=""

cleanup() {
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
    kill -KILL "$daemon_pid" 2>/dev/null
    wait "$daemon_pid" 2>/dev/null
  fi
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'echo "demo: interrupted" >&2; exit 130' INT TERM

show_log() {
  echo "demo: paradevd's log:" >&2
  sed 's/^/  /' "$dir/paradevd.log" >&2
}

# --config /dev/null: the built-in defaults, whatever /etc/paradev holds.
# The daemon may read and write checkpoints beneath $dir/checkpoints only.
mkdir -p "$dir/checkpoints"
checkpoint="$dir/checkpoints/digits.safetensors"
"$paradevd" --config /dev/null --backend cpu --devices "$devices" \
  --listen "$target" --admin-socket "$dir/admin.sock" --log warn \
  --storage-root "$dir/checkpoints" \
  2>"$dir/paradevd.log" &
daemon_pid=$!

# Ready once the health check says SERVING; 20 s at most.
deadline=$((SECONDS + 20))
until "$paradev" --target "$target" --timeout 1s health >/dev/null 2>&1; do
  if ! kill -0 "$daemon_pid" 2>/dev/null; then
    wait "$daemon_pid"
    echo "demo: paradevd exited during start-up (status $?)" >&2
    daemon_pid=""
    show_log
    exit 1
  fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "demo: paradevd did not answer a health check within 20 s" >&2
    show_log
    exit 1
  fi
  sleep 0.1
done
echo "demo: paradevd (pid $daemon_pid) serves $devices simulated CPU devices on $target"

"$trainer" --target "$target" --save "$checkpoint" "${args[@]}" \
  | tee "$dir/train.out"
train_rc=${PIPESTATUS[0]}

# Second step: a fresh session loads the saved weights and evaluates them.
eval_rc=0
if [ "$train_rc" -eq 0 ]; then
  echo
  echo "demo: a fresh session loads the weights the daemon saved"
  "$trainer" --target "$target" "${args[@]}" --evaluate "$checkpoint" | tee "$dir/eval.out"
  eval_rc=${PIPESTATUS[0]}
  trained=$(grep '^test accuracy' "$dir/train.out")
  loaded=$(grep '^test accuracy' "$dir/eval.out")
  if [ "$eval_rc" -eq 0 ] && [ -n "$trained" ] && [ "$trained" = "$loaded" ]; then
    echo "demo: the loaded weights give the same ${loaded#test }"
  elif [ "$eval_rc" -eq 0 ]; then
    echo "demo: the loaded weights give '$loaded', training gave '$trained'" >&2
    eval_rc=1
  fi
fi

# Then, on the plain `make demo` (no options given), its Python twin through
# the paradev package (examples/train_digits.py), where Debian's NumPy and
# cffi are there: same split, seeds and ops, so the same numbers.
py_rc=0
if [ $# -eq 0 ] && [ "$train_rc" -eq 0 ] && [ -x /usr/bin/python3 ] &&
  /usr/bin/python3 -c "import numpy, cffi" 2>/dev/null; then
  echo "demo: the same training from Python (examples/train_digits.py):"
  PARADEV_LIBRARY="$build/client/libparadev.so" /usr/bin/python3 \
    "$(dirname "$0")/../examples/train_digits.py" --target "$target" \
    --plot "$build/train_digits_py.png" --min-accuracy 95
  py_rc=$?
fi

kill -TERM "$daemon_pid"
wait "$daemon_pid"
daemon_rc=$?
daemon_pid=""
failed=0
if [ "$daemon_rc" -ne 0 ]; then
  echo "demo: paradevd exited with status $daemon_rc after SIGTERM (expected 0)" >&2
  show_log
  failed=1
else
  echo "demo: paradevd stopped cleanly (SIGTERM, exit 0)"
fi
if [ "$train_rc" -ne 0 ]; then
  echo "demo: train_digits failed (exit status $train_rc)" >&2
  failed=1
fi
if [ "$eval_rc" -ne 0 ]; then
  echo "demo: train_digits --evaluate failed (exit status $eval_rc)" >&2
  failed=1
fi
if [ "$py_rc" -ne 0 ]; then
  echo "demo: train_digits.py failed (exit status $py_rc)" >&2
  failed=1
fi
exit "$failed"
