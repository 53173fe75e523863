#!/bin/sh
# Strata for Slurm sites without burst buffers: PrologSlurmctld (runs on the controller, as SlurmUser, once the
# job has its nodes: the job shows CONFIGURING and its script starts only when this exits 0).
#
#   slurm.conf:  PrologSlurmctld=/etc/slurm/strata/prolog.sh
#                EpilogSlurmctld=/etc/slurm/strata/epilog.sh
#                TaskProlog=/etc/slurm/strata/task_prolog.sh
#   job:         sbatch --comment=strata:claim=/shared/claims/train.yaml job.sh
#
# Submits the claim named in the job's comment (SLURM_JOB_COMMENT) for this job id and waits until it is ready.
# The claim file is read with the job user's rights, and the user must be in the Unix group named like the
# claim's team (STRATA_TEAM_GROUPS=0 turns that off), as burst_buffer.lua does.
# In $STRATA_STATE_DIR it keeps the claim id (<job>.claim, for epilog.sh) and the claim's environment
# (<job>.env, `export NAME=value` lines readable by the job's user only, for task_prolog.sh, which runs as that
# user on the job's nodes: the directory must be the same there, a shared one when the controller is not a
# compute node). The job's AdminComment gets `strata:{"claim":...,"usage":...}` before the job runs (Slurm
# 22.05 refuses updates to a finished job, so the final accounting stays with the claim:
# `strata claim ls --job <id> --all`).
#
# A claim that cannot be had (refused: an empty dataset, quota; or failed while staging, then released here)
# puts `strata: <reason>` in the AdminComment and exits 1: Slurm 22.05 then requeues the batch job (PENDING,
# Reason=BeginTime, eligible again 120 s later, Restarts+1: the claim is submitted again then); a job
# submitted with --no-requeue is cancelled instead. Slurm runs EpilogSlurmctld after the failed prolog, but
# when it cancels the job it sometimes SIGKILLs that epilog as it starts (22.05), as it does on a scancel
# while this script waits (which kills this script too): the claim's TTL releases it then, so give claims a
# ttl_secs.
# Settings as for burst_buffer.lua, in strata-site.sh beside these scripts (see strata-env.sh): STRATA_BIN,
# STRATA_API, STRATA_TOKEN_FILE, STRATA_STATE_DIR.
set -eu
. "$(dirname "$0")/strata-env.sh"

claim=$(printf '%s' "${SLURM_JOB_COMMENT:-}" | sed -n 's/.*strata:claim=\([^ ]*\).*/\1/p')
[ -n "$claim" ] || exit 0   # not a Strata job
mkdir -p "$STRATA_STATE_DIR" && chmod 0711 "$STRATA_STATE_DIR"   # users open their own <job>.env, list nothing
umask 077
j="$STRATA_STATE_DIR/$SLURM_JOB_ID"
note() { scontrol update jobid="$SLURM_JOB_ID" AdminComment="$1" >/dev/null 2>&1 || true; }
fail() {
  note "strata: $(tail -n1 "$j.err")"
  if [ -r "$j.claim" ]; then   # released now: the EpilogSlurmctld that follows is sometimes killed (see above)
    "$STRATA_BIN" claim release "$(head -n1 "$j.claim")" \
      --reason "slurm job $SLURM_JOB_ID not started: its claim failed" >/dev/null 2>&1 && rm -f "$j.claim"
  fi
  rm -f "$j.err"
  exit 1
}

# The claim file, read with the job user's rights (this script runs as SlurmUser, which reads more).
if ! setpriv --reuid="$SLURM_JOB_UID" --regid="$SLURM_JOB_GID" --init-groups cat -- "$claim" >"$j.yaml" 2>"$j.err"; then
  echo "cannot read the claim file $claim as the job's user" >>"$j.err"
  rm -f "$j.yaml"
  fail
fi
# The job's user must be in the Unix group named like the claim's team (STRATA_TEAM_GROUPS=0: not checked).
if [ "${STRATA_TEAM_GROUPS:-1}" = 1 ]; then
  team=$("$STRATA_BIN" claim validate --job "$SLURM_JOB_ID" "$j.yaml" --json 2>"$j.err" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["team"])' 2>/dev/null) || { rm -f "$j.yaml"; fail; }
  if ! id -Gn "$SLURM_JOB_UID" | tr ' ' '\n' | grep -qx -- "$team"; then
    echo "user $SLURM_JOB_UID is not in the Unix group of team $team" >"$j.err"
    rm -f "$j.yaml"
    fail
  fi
fi
id=$("$STRATA_BIN" claim submit "$j.yaml" --job "$SLURM_JOB_ID" 2>"$j.err") || { rm -f "$j.yaml"; fail; }
rm -f "$j.yaml"
printf '%s\n' "$id" > "$j.claim"
ready=$("$STRATA_BIN" claim wait "$id" --json 2>"$j.err") || fail
rm -f "$j.err"
# TaskProlog takes each `export NAME=value` line verbatim (no shell quoting, one line each).
usage=$(printf '%s' "$ready" | python3 -c '
import json, sys
c = json.load(sys.stdin)
with open(sys.argv[1], "w") as f:
    for k, v in sorted(c["env"].items()):
        if "\n" not in str(v):
            f.write(f"export {k}={v}\n")
print(json.dumps({"claim": c["id"], "usage": c["usage"]}, separators=(",", ":")))' "$j.env.tmp")
chown "$SLURM_JOB_UID:$SLURM_JOB_GID" "$j.env.tmp" && chmod 0400 "$j.env.tmp" && mv -f "$j.env.tmp" "$j.env"
note "strata:$usage"
