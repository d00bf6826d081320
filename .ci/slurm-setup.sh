#!/usr/bin/env bash
# A one-node Slurm for the integration tests (tests/test_slurm.py): Debian's slurm-wlm,
# slurmctld + slurmd run as root, no munge (auth/none, cred/none), no accounting, no
# cgroups (proctrack/linuxproc, task/none) so that it also runs inside a container.
# Idempotent: does nothing when a controller already answers. Needs root.
set -euo pipefail

if scontrol ping >/dev/null 2>&1 && sinfo -h -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then
    echo "slurm-setup: a controller is already up"; exit 0
fi
if ! command -v slurmctld >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq slurm-wlm >/dev/null
fi

host=$(hostname -s)
cpus=$(nproc)
mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 512 ))
conf_dir=/etc/slurm
mkdir -p "$conf_dir" /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/slurm
cat > "$conf_dir/slurm.conf" <<CONF
ClusterName=linbench-ci
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ReturnToService=2
# Short waits keep requeue tests fast: TERM, then KILL 5 s later.
KillWait=5
MinJobAge=30
SchedulerParameters=sched_interval=2
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF

# -c: start from a clean state, so job ids and queues of an earlier run are gone.
slurmctld -c
slurmd
for _ in $(seq 60); do
    if sinfo -h -o %t 2>/dev/null | grep -qE '^(idle|mix)'; then
        sinfo; exit 0
    fi
    sleep 1
done
echo "slurm-setup: node did not come up; logs:" >&2
tail -n 30 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log >&2
exit 1
