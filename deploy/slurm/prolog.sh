#!/bin/sh
# Slurm node prolog for paradevd (slurm.conf: Prolog=/etc/paradev/slurm/prolog.sh,
# run by slurmd as root on every node of the job before it starts).
#
# 1. Waits (up to PARADEV_PROLOG_WAIT seconds, default 30) for paradevd's
#    admin socket to answer `paradev admin status`.
# 2. Fails when paradevd is draining or exiting (taken out of service),
#    unless PARADEV_PROLOG_REQUIRE_READY=0. A failing prolog makes Slurm
#    drain the node and requeue the job: the node cannot serve it.
# 3. Ends what is left under this job id (a requeued job starts clean) and
#    revokes its old token: `paradev admin kill-job`.
# 4. Mints the job's token (`paradev admin job-token`, bound to the job's
#    uid and to its GPUs: SLURM_JOB_GPUS, else CUDA_VISIBLE_DEVICES as
#    slurmd sets it for the prolog, passed as --gpus; paradevd maps them to
#    its devices on those GPUs and the job's sessions may use no others) and
#    writes it to PARADEV_JOB_TOKEN_DIR/$SLURM_JOB_ID (default
#    /run/paradev-jobs), owned by the job's user, mode 0400. The TaskProlog
#    (task_prolog.sh) exports it as PARADEV_JOB_TOKEN, which libparadev,
#    the paradev CLI and the Python client present; the epilog deletes it.
#
# Every answer is read from the CLI's machine output (`--field NAME`, one
# member of its JSON document) and its exit status, never from the human
# table: no client name or job id can change what this script sees.
#
# A job Slurm gave no GPUs (neither variable set, or empty) gets a token
# bound to no devices, as before placement existed, unless
# PARADEV_PROLOG_REQUIRE_GPUS=1: then the prolog fails rather than let a job
# without GPUs use every device. A GPU list that is not indices ("GPU-<uuid>"
# in CUDA_VISIBLE_DEVICES) fails the prolog: paradevd binds by index.
#
# Environment: SLURM_JOB_ID, SLURM_JOB_UID, SLURM_JOB_GPUS (set by slurmd);
# CUDA_VISIBLE_DEVICES (set by slurmd when SLURM_JOB_GPUS is not); PARADEV (the
# paradev command, default: paradev); PARADEV_ADMIN_SOCKET (default:
# paradev's, /run/paradev/admin.sock under systemd); PARADEV_JOB_TOKEN_DIR;
# PARADEV_JOB_TOKEN_LIFETIME (e.g. 48h; default: the daemon's [auth]
# job_token_lifetime_seconds; make it longer than your longest job).
set -u
PARADEV=${PARADEV:-paradev}
WAIT=${PARADEV_PROLOG_WAIT:-30}
REQUIRE_READY=${PARADEV_PROLOG_REQUIRE_READY:-1}
TOKEN_DIR=${PARADEV_JOB_TOKEN_DIR:-/run/paradev-jobs}
LIFETIME=${PARADEV_JOB_TOKEN_LIFETIME:-}
REQUIRE_GPUS=${PARADEV_PROLOG_REQUIRE_GPUS:-0}
JOB=${SLURM_JOB_ID:-}
JOB_UID=${SLURM_JOB_UID:-}
# The job's GPUs as Slurm numbers them: "1,3".
GPUS=${SLURM_JOB_GPUS:-}
GPUS_FROM=SLURM_JOB_GPUS
if [ -z "$GPUS" ]; then
  GPUS=${CUDA_VISIBLE_DEVICES:-}
  GPUS_FROM=CUDA_VISIBLE_DEVICES
fi

say() { echo "paradev prolog (job ${JOB:-?}): $*" >&2; }

if [ -z "$JOB" ]; then
  say "SLURM_JOB_ID is not set; run me as Slurm's Prolog"
  exit 1
fi
case $JOB in
  *[!A-Za-z0-9_.-]* | .*)
    say "SLURM_JOB_ID '$JOB' is not a job id (expected letters, digits, _ . -)"
    exit 1 ;;
esac
case $JOB_UID in
  '' | *[!0-9]*)
    say "SLURM_JOB_UID '$JOB_UID' is not a uid; run me as Slurm's Prolog"
    exit 1 ;;
esac
GPUS=$(printf '%s' "$GPUS" | tr -d ' ')
# Slurm sets CUDA_VISIBLE_DEVICES=NoDevFiles for a job with a GPU gres but
# no device files: no GPUs (PARADEV_PROLOG_REQUIRE_GPUS decides below).
[ "$GPUS" = NoDevFiles ] && GPUS=
case $GPUS in
  '')
    if [ "$REQUIRE_GPUS" != 0 ]; then
      say "the job has no GPUs (SLURM_JOB_GPUS and CUDA_VISIBLE_DEVICES are empty) and PARADEV_PROLOG_REQUIRE_GPUS is set"
      exit 1
    fi ;;
  *[!0-9,]* | ,* | *, | *,,*)
    say "$GPUS_FROM '$GPUS' is not a list of GPU indices (such as 1,3); paradevd binds jobs by GPU index"
    exit 1 ;;
esac

if [ -L "$TOKEN_DIR" ]; then
  say "$TOKEN_DIR is a symbolic link; refusing to write the job token there"
  exit 1
fi
if [ -d "$TOKEN_DIR" ]; then
  # Whoever owns the directory could swap a job's token file for another.
  owner_mode=$(stat -c '%u %a' "$TOKEN_DIR") || exit 1
  owner=${owner_mode% *}
  mode=${owner_mode#* }
  if [ "$owner" != "$(id -u)" ] || [ $((0$mode & 022)) -ne 0 ]; then
    say "$TOKEN_DIR is owned by uid $owner with mode $mode; expected this user's (uid $(id -u)) directory that only it may write"
    exit 1
  fi
fi

waited=0
while ! state=$("$PARADEV" admin status --field state 2>&1); do
  if [ "$waited" -ge "$WAIT" ]; then
    say "paradevd did not answer on its admin socket within ${WAIT} s: $state"
    exit 1
  fi
  sleep 1
  waited=$((waited + 1))
done

case $state in
  serving) ;;
  draining | exiting)
    if [ "$REQUIRE_READY" != 0 ]; then
      say "paradevd is $state (out of service); not starting the job here"
      exit 1
    fi
    say "warning: paradevd is $state" ;;
  *)
    say "unexpected state from paradev admin status: $state"
    exit 1 ;;
esac

if ! killed=$("$PARADEV" admin kill-job --job "$JOB" --field sessions_killed 2>&1); then
  say "cannot end leftover sessions: $killed"
  exit 1
fi
[ "$killed" = 0 ] || say "ended $killed leftover session(s) of this job id"

set -- --job "$JOB" --uid "$JOB_UID" --field token
[ -n "$LIFETIME" ] && set -- "$@" --lifetime "$LIFETIME"
[ -n "$GPUS" ] && set -- "$@" --gpus "$GPUS"
if ! token=$("$PARADEV" admin job-token "$@" 2>&1); then
  say "cannot mint the job's token: $token"
  exit 1
fi
case $token in
  pdjob1_*) ;;
  *) say "unexpected job token from paradev admin job-token"; exit 1 ;;
esac

# The token file: root's directory (no one else may write there), a file
# only the job's user may read, put in place whole.
umask 077
if ! mkdir -p "$TOKEN_DIR" || ! chmod 0755 "$TOKEN_DIR"; then
  say "cannot make $TOKEN_DIR for the job token"
  exit 1
fi
tmp=$(mktemp "$TOKEN_DIR/.$JOB.XXXXXX") || { say "cannot write in $TOKEN_DIR"; exit 1; }
if ! printf '%s\n' "$token" > "$tmp" || ! chown "$JOB_UID" "$tmp" ||
   ! chmod 0400 "$tmp" || ! mv -f "$tmp" "$TOKEN_DIR/$JOB"; then
  rm -f "$tmp"
  say "cannot write the job token to $TOKEN_DIR/$JOB"
  exit 1
fi
exit 0
