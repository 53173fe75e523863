# Sourced by prolog.sh, task_prolog.sh and epilog.sh: the settings they share with burst_buffer.lua
# (STRATA_BIN, STRATA_API, STRATA_TOKEN_FILE, STRATA_STATE_DIR) and the site's token in STRATA_TOKEN.
STRATA_BIN=${STRATA_BIN:-/usr/local/bin/strata}
STRATA_STATE_DIR=${STRATA_STATE_DIR:-/var/spool/strata-slurm}
TOKEN_FILE=${STRATA_TOKEN_FILE:-/etc/strata/slurm.token}
[ -r "$TOKEN_FILE" ] && STRATA_TOKEN=$(head -n1 "$TOKEN_FILE") && export STRATA_TOKEN
export STRATA_API=${STRATA_API:-http://127.0.0.1:7070} STRATA_LOG=${STRATA_LOG:-error}
