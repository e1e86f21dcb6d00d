#!/bin/sh
# Slurm TaskProlog for paradevd (slurm.conf:
# TaskProlog=/etc/paradev/slurm/task_prolog.sh), run as the job's user
# before each task. Slurm sets in the task's environment every line it
# prints as `export NAME=value`: this one exports the job's token, which the
# prolog wrote to PARADEV_JOB_TOKEN_DIR/$SLURM_JOB_ID (default
# /run/paradev-jobs), as PARADEV_JOB_TOKEN. libparadev, the paradev CLI and
# the Python client present it at CreateSession, so the job's sessions are
# bound to the job and the epilog ends exactly them.
#
# No file (a node without paradevd, a prolog that did not run): nothing is
# exported, and the job's sessions carry no proven job id.
TOKEN_DIR=${PARADEV_JOB_TOKEN_DIR:-/run/paradev-jobs}
f=$TOKEN_DIR/${SLURM_JOB_ID:-none}
[ -r "$f" ] || exit 0
IFS= read -r token < "$f" || exit 0
case $token in
  pdjob1_*[!0-9a-f]*) exit 0 ;;
  pdjob1_*) echo "export PARADEV_JOB_TOKEN=$token" ;;
esac
exit 0
