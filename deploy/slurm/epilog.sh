#!/bin/sh
# Slurm node epilog for paradevd (slurm.conf: Epilog=/etc/paradev/slurm/epilog.sh,
# run by slurmd as root on every node of the job after it ends).
#
# Ends the job on paradevd and checks that its memory is back:
#  - `paradev admin kill-job --job ID --verify` revokes the job's token
#    first (no new session can be bound to the job, and its binding to the
#    job's GPUs goes with it), then ends exactly the
#    sessions bound to it by that token -- a session that only claimed the
#    job id is not the job's and is left alone -- and answers once the
#    devices finished the work already submitted, so the memory is free
#    when it returns. --verify fails when a session of the job is still
#    open, or when none is left on the daemon but device memory is still in
#    use (a leak);
#  - `paradev admin sessions --job ID --field job_sessions` must then be 0;
#  - the token file the prolog wrote is deleted.
# Answers are read from the CLI's machine output (--field) and exit status,
# never from the human table. A failing epilog makes Slurm drain the node,
# which is what a node with unreclaimed GPU memory needs.
#
# Environment: SLURM_JOB_ID (set by slurmd), PARADEV (the paradev command,
# default: paradev), PARADEV_ADMIN_SOCKET, PARADEV_JOB_TOKEN_DIR (default
# /run/paradev-jobs).
set -u
PARADEV=${PARADEV:-paradev}
TOKEN_DIR=${PARADEV_JOB_TOKEN_DIR:-/run/paradev-jobs}
JOB=${SLURM_JOB_ID:-}

say() { echo "paradev epilog (job ${JOB:-?}): $*" >&2; }

if [ -z "$JOB" ]; then
  say "SLURM_JOB_ID is not set; run me as Slurm's Epilog"
  exit 1
fi
case $JOB in
  *[!A-Za-z0-9_.-]* | .*)
    say "SLURM_JOB_ID '$JOB' is not a job id (expected letters, digits, _ . -)"
    exit 1 ;;
esac

rm -f "$TOKEN_DIR/$JOB"
killed=$("$PARADEV" admin kill-job --job "$JOB" --verify --field sessions_killed 2>&1)
rc=$?
if [ $rc -ne 0 ]; then
  say "$killed"
  say "the job's paradevd sessions could not be ended, or memory was not given back (status $rc)"
  exit 1
fi
[ "$killed" = 0 ] || say "killed $killed session(s) of job $JOB"

if ! left=$("$PARADEV" admin sessions --job "$JOB" --field job_sessions 2>&1); then
  say "cannot list sessions: $left"
  exit 1
fi
if [ "$left" != 0 ]; then
  say "$left session(s) of the job are still open after the kill"
  exit 1
fi
exit 0
