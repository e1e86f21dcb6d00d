#!/usr/bin/env bash
# Integration test of the main job: a short run of examples/train_digits
# against a real daemon, through scripts/demo.sh (the `make demo` path: start
# paradevd on a temporary socket, train, SIGTERM, exit 0). 3 devices and a
# batch of 24, so the last batch (1438 = 59 * 24 + 22 rows) splits unevenly
# (8, 7, 7). Asserts that the loss falls from the first epoch to the last,
# that the test accuracy passes a lower bar, and that the weights ended up
# identical on every device, in eager mode (one stream item per op). Then
# the same, shorter, with --mode function (the whole step one graph
# function called once per step). No timing
# thresholds.
#
# Usage: test_train_digits.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src=$1
build=$2
out=$(mktemp)
trap 'rm -f "$out"' EXIT

DEMO_DEVICES=3 bash "$src/scripts/demo.sh" "$build" --mode eager --epochs 3 \
  --batch 24 --seed 7 --min-accuracy 85 >"$out" 2>&1
rc=$?
cat "$out"
fail() {
  echo "FAIL: $*"
  exit 1
}
[ "$rc" -eq 0 ] || fail "scripts/demo.sh exited with $rc"

# "epoch  1/3  loss 1.3657  train accuracy  65.86%  483.0 steps/s"
mapfile -t losses < <(awk '$1 == "epoch" { print $4 }' "$out")
[ "${#losses[@]}" -eq 3 ] || fail "expected 3 epoch lines, got ${#losses[@]}"
awk -v a="${losses[0]}" -v b="${losses[2]}" 'BEGIN { exit !(b < a) }' ||
  fail "the loss did not fall: epoch 1 ${losses[0]}, epoch 3 ${losses[2]}"
acc=$(awk '$1 == "test" && $2 == "accuracy" { sub("%", "", $3); print $3; exit }' "$out")
[ -n "$acc" ] || fail "no test accuracy line"
awk -v a="$acc" 'BEGIN { exit !(a >= 85) }' || fail "test accuracy $acc% < 85%"
grep -q "weights bitwise identical on all 3 devices" "$out" ||
  fail "the weights were not reported identical on every device"
# The second step: the weights the daemon saved (SaveTensors), loaded in a
# fresh session (LoadTensors), give the same test accuracy, to the image.
grep -q "weights saved by the daemon to .*digits.safetensors (38440 bytes" "$out" ||
  fail "the trainer did not report the weights saved (38440 bytes: 64x128 + 128 + 128x10 + 10 floats)"
grep -q "^demo: the loaded weights give the same accuracy $acc% " "$out" ||
  fail "the loaded weights did not give the trained accuracy $acc%"
grep -q "paradevd stopped cleanly" "$out" || fail "the daemon did not stop cleanly"
if grep -q -e "AddressSanitizer" -e "runtime error" "$out"; then
  fail "sanitizer report"
fi

# Function mode: forward, loss, Gradients, AllReduce(mean) and the Adam
# update as one graph function, called once per step.
DEMO_DEVICES=3 bash "$src/scripts/demo.sh" "$build" --mode function \
  --epochs 2 --batch 24 --seed 7 --min-accuracy 85 >"$out" 2>&1
rc=$?
cat "$out"
[ "$rc" -eq 0 ] || fail "function mode: scripts/demo.sh exited with $rc"
grep -q "^mode: function (one call per step)" "$out" ||
  fail "function mode: the trainer did not say it ran in function mode"
mapfile -t flosses < <(awk '$1 == "epoch" { print $4 }' "$out")
[ "${#flosses[@]}" -eq 2 ] || fail "function mode: expected 2 epoch lines"
awk -v a="${flosses[0]}" -v b="${flosses[1]}" 'BEGIN { exit !(b < a) }' ||
  fail "function mode: the loss did not fall: ${flosses[0]} -> ${flosses[1]}"
facc=$(awk '$1 == "test" && $2 == "accuracy" { sub("%", "", $3); print $3; exit }' "$out")
[ -n "$facc" ] || fail "function mode: no test accuracy line"
awk -v a="$facc" 'BEGIN { exit !(a >= 85) }' ||
  fail "function mode: test accuracy $facc% < 85%"
grep -q "weights bitwise identical on all 3 devices" "$out" ||
  fail "function mode: the weights were not identical on every device"
grep -q "paradevd stopped cleanly" "$out" ||
  fail "function mode: the daemon did not stop cleanly"
echo "PASS: loss ${losses[0]} -> ${losses[2]}, test accuracy $acc%;" \
  "function mode ${flosses[0]} -> ${flosses[1]}, $facc%"
