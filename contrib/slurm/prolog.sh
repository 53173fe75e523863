#!/bin/sh
# Strata for Slurm sites without burst buffers: PrologSlurmctld (runs on the controller before the job
# starts; a failure holds or requeues the job instead of draining a node).
#
#   slurm.conf:  PrologSlurmctld=/etc/slurm/strata/prolog.sh
#                EpilogSlurmctld=/etc/slurm/strata/epilog.sh
#                TaskProlog=/etc/slurm/strata/task_prolog.sh
#   job:         sbatch --comment=strata:claim=/shared/claims/train.yaml job.sh
#
# Submits the claim named in the job's comment for this job id and waits until it is ready; the claim id is
# kept in $STRATA_STATE_DIR for task_prolog.sh (the job's environment) and epilog.sh (release). Settings as for
# burst_buffer.lua: STRATA_BIN, STRATA_API, STRATA_TOKEN_FILE, STRATA_STATE_DIR.
set -eu
. "$(dirname "$0")/strata-env.sh"

claim=$(printf '%s' "${SLURM_JOB_COMMENT:-}" | sed -n 's/.*strata:claim=\([^ ]*\).*/\1/p')
[ -n "$claim" ] || exit 0   # not a Strata job
mkdir -p "$STRATA_STATE_DIR" && chmod 0700 "$STRATA_STATE_DIR"
id=$("$STRATA_BIN" claim submit "$claim" --job "$SLURM_JOB_ID" | tail -n1)
printf '%s\n' "$id" > "$STRATA_STATE_DIR/$SLURM_JOB_ID.claim"
exec "$STRATA_BIN" claim wait "$id"
