#!/bin/sh
# Slurm node epilog for paradevd (slurm.conf: Epilog=/etc/paradev/slurm/epilog.sh,
# run by slurmd as root on every node of the job after it ends).
#
# Ends every paradevd session of the job (jobs' sessions carry SLURM_JOB_ID
# as their job id) and checks that their memory is back:
#  - `paradev admin kill --job ID --verify` answers only once the devices
#    finished the work already submitted, so the killed sessions' memory is
#    free when it returns; --verify fails when no session is left on the
#    daemon but device memory is still in use (a leak);
#  - no session of the job may remain afterwards.
# A failing epilog makes Slurm drain the node, which is what a node with
# unreclaimed GPU memory needs.
#
# Environment: SLURM_JOB_ID (set by slurmd), PARADEV (the paradev command,
# default: paradev), PARADEV_ADMIN_SOCKET.
set -u
PARADEV=${PARADEV:-paradev}
JOB=${SLURM_JOB_ID:-}

say() { echo "paradev epilog (job ${JOB:-?}): $*" >&2; }

if [ -z "$JOB" ]; then
  say "SLURM_JOB_ID is not set; run me as Slurm's Epilog"
  exit 1
fi

out=$("$PARADEV" admin kill --job "$JOB" --verify 2>&1)
rc=$?
if [ $rc -ne 0 ]; then
  say "$out"
  say "the job's paradevd sessions could not be ended, or memory was not given back (status $rc)"
  exit 1
fi
case $out in
  "killed 0 sessions"*) ;;
  *) say "$out" ;;
esac

left=$("$PARADEV" admin sessions --job "$JOB" --json 2>&1) || {
  say "cannot list sessions: $left"
  exit 1
}
# One JSON document; "count" is the number of the job's sessions still open.
case $left in
  *'"count": 0,'*) ;;
  *)
    say "sessions of the job are still open after the kill: $left"
    exit 1
    ;;
esac
exit 0
