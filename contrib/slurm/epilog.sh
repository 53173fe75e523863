#!/bin/sh
# Strata for Slurm sites without burst buffers: EpilogSlurmctld (runs on the controller after the job ends,
# cancelled jobs included). Releases the job's claim (idempotent) and records its accounting in the job's
# AdminComment. A release that cannot reach the agent is left to the claim's TTL.
. "$(dirname "$0")/strata-env.sh"
f="$STRATA_STATE_DIR/$SLURM_JOB_ID.claim"
[ -r "$f" ] || exit 0
id=$(head -n1 "$f")
usage=$("$STRATA_BIN" claim release "$id" --reason "slurm job $SLURM_JOB_ID ended" --json \
  | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["usage"], separators=(",", ":")))') || exit 0
scontrol update jobid="$SLURM_JOB_ID" AdminComment="strata:$usage" || true
rm -f "$f"
