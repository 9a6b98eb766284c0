#!/usr/bin/env bash
# CI tear-down: stop the local SLURM cluster and the sshd hosts (.ci/run calls this after the tests).
# Exits non-zero if a daemon of ours is still running afterwards.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
state="${ORCH_SLURM_DIR:-/tmp/orch-slurm}"
rc=0
bash "${here}/cluster.sh" down || rc=1
bash "${here}/sshd.sh" down || rc=1

# Our daemons name the state dir on their command line (slurmdbd and slurmstepd do not, but cluster.sh
# stops those by pid file and by their open files).
if left="$(pgrep -a -f -- "${state}/")"; then
    echo "ci-down: still running after down:" >&2
    echo "${left}" >&2
    rc=1
fi
exit "${rc}"
