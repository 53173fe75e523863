#!/bin/sh
# Strata for Slurm sites without burst buffers: TaskProlog (runs on the job's nodes as the job's user, before
# each task; its `export NAME=value` lines, taken verbatim, become the task's environment).
# Prints the environment of the claim prolog.sh submitted for this job, as prolog.sh saved it in
# $STRATA_STATE_DIR/<job>.env: STRATA_AGENT, STRATA_CLAIM, STRATA_JOB, STRATA_TEAM, STRATA_DATASET_<NAME>,
# STRATA_SCRATCH, ... It needs no token and no agent (the job's user cannot read the site's token).
. "$(dirname "$0")/strata-env.sh"
f="$STRATA_STATE_DIR/$SLURM_JOB_ID.env"
[ -r "$f" ] || exit 0   # not a Strata job
cat "$f"
