#!/bin/sh
# Strata for Slurm sites without burst buffers: EpilogSlurmctld (runs on the controller after the job ends,
# cancelled and requeued jobs included). Releases the job's claim (idempotent), with the reason
# `slurm job <id> ended`, and removes what prolog.sh kept. A release that cannot reach the agent is left to
# the claim's TTL. The accounting is not written to the job: Slurm 22.05 refuses updates to a finished job
# ("Job has already finished"); prolog.sh recorded the staging in the AdminComment, and the final accounting
# stays with the claim (`strata claim ls --job <id> --all`).
. "$(dirname "$0")/strata-env.sh"
f="$STRATA_STATE_DIR/$SLURM_JOB_ID.claim"
[ -r "$f" ] || exit 0
"$STRATA_BIN" claim release "$(head -n1 "$f")" --reason "slurm job $SLURM_JOB_ID ended" >/dev/null || exit 0
rm -f "$f" "$STRATA_STATE_DIR/$SLURM_JOB_ID.env"
