#!/usr/bin/env bash
# A second paradevd must not take a live daemon's addresses: the same Unix
# socket, the same admin socket or the same TCP port is refused (exit 1) and
# the first daemon keeps serving on all of them; a stale socket file (its
# daemon killed) is reused.
# Usage: test_listen_conflicts.sh PARADEVD PARADEV
set -u
paradevd=$1 paradev=$2
dir=$(mktemp -d /tmp/paradev-conflict.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$dir"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- first daemon's log"; cat "$dir/a.log"; exit 1; }

"$paradevd" --config /dev/null --admin-socket "$dir/adm.sock" --listen "unix:$dir/s.sock" \
  --listen 127.0.0.1:0 >"$dir/a.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  grep -q "ready:" "$dir/a.log" && break
  sleep 0.1
done
port=$(grep -o "listening on 127.0.0.1:[0-9]*" "$dir/a.log" | head -1 | sed 's/listening on //')
[ -n "$port" ] || fail "first daemon did not report its TCP port"

expect_refused() {
  local what=$1; shift
  timeout 20 "$paradevd" --config /dev/null "$@" >"$dir/b.log" 2>&1
  local rc=$?
  [ $rc -eq 1 ] || { cat "$dir/b.log"; fail "$what: second daemon exit $rc, want 1"; }
  grep -q "$what" "$dir/b.log" || { cat "$dir/b.log"; fail "message lacks '$what'"; }
  echo "ok: second daemon refused ($what)"
}
expect_refused "another process is serving on this socket" --admin-socket '' --listen "unix:$dir/s.sock"
expect_refused "cannot listen on $port" --admin-socket '' --listen "$port"
expect_refused "another process is serving on this socket" --admin-socket "$dir/adm.sock" --listen "unix:$dir/s2.sock"
[ ! -e "$dir/s2.sock" ] || fail "refused daemon left $dir/s2.sock behind"

for t in "unix:$dir/s.sock" "$port"; do
  out=$("$paradev" --target "$t" health) || fail "first daemon stopped answering on $t: $out"
  [ "$out" = SERVING ] || fail "health on $t: '$out', want SERVING"
done
[ -S "$dir/adm.sock" ] || fail "the admin socket of the first daemon is gone"
echo "ok: first daemon still serves on every address"

kill -9 "${pids[0]}"; wait "${pids[0]}" 2>/dev/null
"$paradevd" --config /dev/null --admin-socket "$dir/adm.sock" --listen "unix:$dir/s.sock" >"$dir/c.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  out=$("$paradev" --target "unix:$dir/s.sock" health 2>/dev/null) && break
  sleep 0.1
done
[ "${out:-}" = SERVING ] || { cat "$dir/c.log"; fail "a daemon could not reuse a stale socket"; }
echo "ok: stale socket reused"
kill -TERM "${pids[1]}"; wait "${pids[1]}"; rc=$?
[ $rc -eq 0 ] || fail "daemon exit $rc after SIGTERM, want 0"
echo "4 passed, 0 failed"
