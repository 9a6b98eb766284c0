#!/usr/bin/env bash
# CI set-up: bring up the local SLURM cluster and the sshd hosts before the tests (.ci/run calls this).
# Installs what is missing with apt-get. Everything listens on 127.0.0.0/8 (slurmd/slurmctld/slurmdbd
# bind all addresses, as SLURM does; nothing here connects anywhere else). The nodes and hosts are
# described in $ORCH_SLURM_DIR (default /tmp/orch-slurm) for the tests' fixtures; nothing is exported.
#
#   ORCH_CI_CLUSTER_ARGS  arguments for `cluster.sh up` (default: --nodes 2 --gpus 2)
#   ORCH_CI_SSHD_ARGS     arguments for `sshd.sh up` (default: --hosts 2)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
read -r -a cluster_args <<<"${ORCH_CI_CLUSTER_ARGS:---nodes 2 --gpus 2}"
read -r -a sshd_args <<<"${ORCH_CI_SSHD_ARGS:---hosts 2}"

start=${SECONDS}
bash "${here}/cluster.sh" up "${cluster_args[@]}" >/dev/null
bash "${here}/sshd.sh" up "${sshd_args[@]}" >/dev/null
bash "${here}/cluster.sh" status
bash "${here}/sshd.sh" status
echo "ci-up: SLURM cluster and sshd hosts up in $((SECONDS - start)) s"
