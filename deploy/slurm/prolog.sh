#!/bin/sh
# Slurm node prolog for paradevd (slurm.conf: Prolog=/etc/paradev/slurm/prolog.sh,
# run by slurmd as root on every node of the job before it starts).
#
# 1. Waits (up to PARADEV_PROLOG_WAIT seconds, default 30) for paradevd's
#    admin socket to answer.
# 2. Ends sessions left over under this job's id (a requeued job starts
#    clean); jobs' sessions carry SLURM_JOB_ID as their job id (libparadev
#    sets it from the environment; see deploy/README.md).
# 3. Fails when paradevd is draining (taken out of service), unless
#    PARADEV_PROLOG_REQUIRE_READY=0. A failing prolog makes Slurm drain the
#    node and requeue the job: the node cannot serve it.
#
# Environment: SLURM_JOB_ID (set by slurmd), PARADEV (the paradev command,
# default: paradev), PARADEV_ADMIN_SOCKET (default: paradev's default,
# /run/paradev/admin.sock under systemd).
set -u
PARADEV=${PARADEV:-paradev}
WAIT=${PARADEV_PROLOG_WAIT:-30}
REQUIRE_READY=${PARADEV_PROLOG_REQUIRE_READY:-1}
JOB=${SLURM_JOB_ID:-}

say() { echo "paradev prolog (job ${JOB:-?}): $*" >&2; }

if [ -z "$JOB" ]; then
  say "SLURM_JOB_ID is not set; run me as Slurm's Prolog"
  exit 1
fi

waited=0
while ! out=$("$PARADEV" admin sessions 2>&1); do
  if [ "$waited" -ge "$WAIT" ]; then
    say "paradevd did not answer on its admin socket within ${WAIT} s: $out"
    exit 1
  fi
  sleep 1
  waited=$((waited + 1))
done

case $out in
  *DRAINING*)
    if [ "$REQUIRE_READY" != 0 ]; then
      say "paradevd is draining (out of service); not starting the job here"
      exit 1
    fi
    say "warning: paradevd is draining" ;;
esac

if ! out=$("$PARADEV" admin kill --job "$JOB" 2>&1); then
  say "cannot end leftover sessions: $out"
  exit 1
fi
case $out in
  "killed 0 sessions"*) ;;
  *) say "ended leftover sessions of this job id: $out" ;;
esac
exit 0
