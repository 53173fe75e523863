#!/bin/sh
# Strata for Slurm sites without burst buffers: TaskProlog (its `export` lines become the task's environment).
# Prints the environment of the claim prolog.sh submitted for this job: STRATA_AGENT, STRATA_CLAIM,
# STRATA_DATASET_<NAME>, STRATA_SCRATCH, ...
STRATA_BIN=${STRATA_BIN:-/usr/local/bin/strata}
STRATA_STATE_DIR=${STRATA_STATE_DIR:-/var/spool/strata-slurm}
TOKEN_FILE=${STRATA_TOKEN_FILE:-/etc/strata/slurm.token}
[ -r "$TOKEN_FILE" ] && STRATA_TOKEN=$(head -n1 "$TOKEN_FILE") && export STRATA_TOKEN
export STRATA_API=${STRATA_API:-http://127.0.0.1:7070} STRATA_LOG=${STRATA_LOG:-error}
f="$STRATA_STATE_DIR/$SLURM_JOB_ID.claim"
[ -r "$f" ] || exit 0
"$STRATA_BIN" claim env "$(head -n1 "$f")"
