# Sourced by prolog.sh, task_prolog.sh and epilog.sh: the settings they share with burst_buffer.lua
# (STRATA_BIN, STRATA_API, STRATA_TOKEN_FILE, STRATA_STATE_DIR) and the site's token in STRATA_TOKEN.
#
# Slurm gives these scripts no environment to configure them with: PrologSlurmctld and EpilogSlurmctld get
# only the job's SLURM_* variables (none of slurmctld's environment, not even PATH or SLURM_CONF), and
# TaskProlog gets the job's own environment (the submitter's, which the user controls). So a site sets them
# in `strata-site.sh` next to these scripts, plain shell assignments that win over the environment, e.g.
#
#     STRATA_BIN=/opt/strata/bin/strata
#     STRATA_API=http://strata-agent:7070
#     STRATA_STATE_DIR=/shared/strata-slurm     # the same directory on the controller and every node
#     SLURM_CONF=/opt/slurm/etc/slurm.conf; export SLURM_CONF   # for scontrol, when not in its default place
#
# else the defaults below hold.
site="$(dirname "$0")/strata-site.sh"
[ -r "$site" ] && . "$site"
STRATA_BIN=${STRATA_BIN:-/usr/local/bin/strata}
STRATA_STATE_DIR=${STRATA_STATE_DIR:-/var/spool/strata-slurm}
TOKEN_FILE=${STRATA_TOKEN_FILE:-/etc/strata/slurm.token}
[ -r "$TOKEN_FILE" ] && STRATA_TOKEN=$(head -n1 "$TOKEN_FILE") && export STRATA_TOKEN
export STRATA_API=${STRATA_API:-http://127.0.0.1:7070} STRATA_LOG=${STRATA_LOG:-error}
