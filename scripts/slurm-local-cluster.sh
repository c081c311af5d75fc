#!/usr/bin/env bash
# A real two-node Slurm cluster on this one machine, for the Slurm tier (tests/slurm) and for trying
# `stackgate run --launcher slurm` by hand: munged, one slurmctld and two slurmd daemons (n1, n2)
# on ports of their own, both pointing at 127.0.0.1. Needs root and Debian's slurmctld, slurmd,
# slurm-client and munge (apt-get install -y slurmctld slurmd slurm-client munge).
#
#   scripts/slurm-local-cluster.sh start   # writes $SLURM_CONF (default /etc/slurm/slurm.conf), starts the daemons
#   scripts/slurm-local-cluster.sh stop
set -euo pipefail

CONF=${SLURM_CONF:-/etc/slurm/slurm.conf}
STATE=${STACKGATE_SLURM_STATE:-/var/lib/stackgate-slurm}
HOST=$(hostname -s)
CPUS=$(nproc)

stop() {
    pkill -x slurmd 2>/dev/null || true
    pkill -x slurmctld 2>/dev/null || true
    sleep 1
}

start() {
    stop
    mkdir -p "$(dirname "$CONF")" "$STATE"/{ctld,n1,n2} /run/munge /var/log/munge /etc/munge
    chown -R munge:munge /run/munge /var/log/munge /etc/munge 2>/dev/null || true
    [ -s /etc/munge/munge.key ] || mungekey -c -f -k /etc/munge/munge.key
    chown munge:munge /etc/munge/munge.key 2>/dev/null || true
    pgrep -x munged >/dev/null || su -s /bin/sh munge -c munged 2>/dev/null || munged --force
    cat > "$CONF" <<CONF
# written by stackgate's scripts/slurm-local-cluster.sh: two nodes on one machine
ClusterName=stackgate
SlurmctldHost=$HOST
SlurmctldPort=16817
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
KillWait=5
MinJobAge=300
SlurmdTimeout=30
StateSaveLocation=$STATE/ctld
SlurmctldPidFile=$STATE/ctld/slurmctld.pid
SlurmctldLogFile=$STATE/ctld/slurmctld.log
SlurmdPidFile=$STATE/%n/slurmd.pid
SlurmdSpoolDir=$STATE/%n
SlurmdLogFile=$STATE/%n/slurmd.log
NodeName=n1 NodeHostname=$HOST NodeAddr=127.0.0.1 Port=17001 CPUs=$CPUS RealMemory=4000
NodeName=n2 NodeHostname=$HOST NodeAddr=127.0.0.1 Port=17002 CPUs=$CPUS RealMemory=4000
PartitionName=cpu Nodes=n1,n2 Default=YES OverSubscribe=YES MaxTime=INFINITE State=UP
CONF
    slurmctld -f "$CONF"
    slurmd -f "$CONF" -N n1
    slurmd -f "$CONF" -N n2
    for _ in $(seq 1 30); do
        if SLURM_CONF=$CONF sinfo -h -o '%T %D' 2>/dev/null | grep -q '^idle 2$'; then
            SLURM_CONF=$CONF sinfo
            return 0
        fi
        sleep 1
    done
    echo "the local Slurm cluster did not come up; logs in $STATE" >&2
    SLURM_CONF=$CONF sinfo >&2 || true
    tail -n 20 "$STATE"/ctld/slurmctld.log "$STATE"/n1/slurmd.log >&2 || true
    return 1
}

case "${1:-start}" in
    start) start ;;
    stop) stop ;;
    *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
