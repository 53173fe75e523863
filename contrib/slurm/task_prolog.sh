#!/bin/sh
# Strata for Slurm sites without burst buffers: TaskProlog (its `export` lines become the task's environment).
# Prints the environment of the claim prolog.sh submitted for this job: STRATA_AGENT, STRATA_CLAIM,
# STRATA_DATASET_<NAME>, STRATA_SCRATCH, ...
. "$(dirname "$0")/strata-env.sh"
f="$STRATA_STATE_DIR/$SLURM_JOB_ID.claim"
[ -r "$f" ] || exit 0
"$STRATA_BIN" claim env "$(head -n1 "$f")"
