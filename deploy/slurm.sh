#!/usr/bin/env bash
# A small Slurm cluster on this machine, for the real-Slurm tests (`python -m pytest -q -m slurm`):
# Debian's slurm-wlm and munge, a munge key, and a slurm.conf whose emulated nodes n1..nN all live on
# 127.0.0.1, each its own `slurmd -N nK` with its own port and spool folder (the multiple-slurmd
# mode; SlurmdParameters=config_overrides lets a node declare more CPUs than the machine has, so a
# 2-core machine holds a heterogeneous job of five components). Idempotent: each step does only what
# is missing. Run as root; every address in the configuration is 127.0.0.1.
#
#   deploy/slurm.sh          # install what is missing, start munged, slurmctld and the slurmds
#   deploy/slurm.sh start    # the same
#   deploy/slurm.sh status   # one line: the nodes and their states, or what is missing (exit 1)
#   deploy/slurm.sh stop     # stop the slurmds and slurmctld (and munged, where this script started it)
#
# The configuration is /etc/slurm/slurm.conf (where sbatch, squeue and scontrol look for it); the
# script writes it only where none exists or where it wrote the one there (its first line says so),
# and never touches a configuration of a real cluster. The state, spool folders, pid files and logs
# go under $PS_SLURM_DIR.
#
# Environment (defaults in brackets):
#   PS_SLURM_DIR [/var/lib/hetero-ps-slurm]   state, spool folders, pid files, logs
#   PS_SLURM_NODES [6]                        emulated nodes n1..nN (a job puts each component on a node of its own)
#   PS_SLURM_CPUS [4]                         CPUs each node declares
#   PS_SLURM_MEMORY_MB [4096]                 memory each node declares
#   PS_SLURM_PORT [6817]                      slurmctld's port; node k listens on PORT + k
set -euo pipefail

PS_SLURM_DIR="${PS_SLURM_DIR:-/var/lib/hetero-ps-slurm}"
PS_SLURM_NODES="${PS_SLURM_NODES:-6}"
PS_SLURM_CPUS="${PS_SLURM_CPUS:-4}"
PS_SLURM_MEMORY_MB="${PS_SLURM_MEMORY_MB:-4096}"
PS_SLURM_PORT="${PS_SLURM_PORT:-6817}"
CONF=/etc/slurm/slurm.conf
MARK="# hetero-ps deploy/slurm.sh: a test cluster on 127.0.0.1"
MUNGE_KEY=/etc/munge/munge.key

say() { echo "slurm.sh: $*" >&2; }
die() { echo "slurm.sh: error: $*" >&2; exit 1; }

need_root() {
    [ "$(id -u)" -eq 0 ] || die "run as root (it installs packages, writes $CONF and starts the daemons)"
}

nodes() { seq -f "n%g" 1 "$PS_SLURM_NODES"; }

install_packages() {
    command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 \
        && command -v munged >/dev/null 2>&1 && command -v sbatch >/dev/null 2>&1 && return
    command -v apt-get >/dev/null 2>&1 || die "Slurm is not installed and there is no apt-get here"
    say "installing slurm-wlm and munge"
    apt-get update -q >/dev/null || die "apt-get update failed"
    # the packages' own services are not wanted: this script starts the daemons with its configuration
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null \
        || die "apt-get could not install slurm-wlm and munge"
}

munge_up() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
    if [ ! -s "$MUNGE_KEY" ]; then
        say "creating $MUNGE_KEY"
        mkdir -p "$(dirname "$MUNGE_KEY")"
        if command -v mungekey >/dev/null 2>&1; then
            mungekey --create --keyfile="$MUNGE_KEY"
        else
            dd if=/dev/urandom of="$MUNGE_KEY" bs=1 count=1024 status=none
        fi
    fi
    chown munge:munge "$MUNGE_KEY" 2>/dev/null || true
    chmod 0400 "$MUNGE_KEY"
    munge_up && return
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
    say "starting munged"
    if id munge >/dev/null 2>&1; then
        runuser -u munge -- munged
    else
        munged --force
    fi
    touch "$PS_SLURM_DIR/run/munged.started"
    local waited=0
    until munge_up; do
        sleep 0.2
        waited=$((waited + 1))
        [ "$waited" -lt 50 ] || die "munged does not answer (see /var/log/munge/munged.log)"
    done
}

write_config() {
    if [ -e "$CONF" ] && [ "$(head -n 1 "$CONF")" != "$MARK" ]; then
        die "$CONF exists and was not written by this script: this machine has a Slurm configuration of its own"
    fi
    mkdir -p "$(dirname "$CONF")" "$PS_SLURM_DIR"/{state,run,log}
    local node k
    for node in $(nodes); do mkdir -p "$PS_SLURM_DIR/spool/$node"; done
    {
        echo "$MARK"
        echo "# (state, spool, pids and logs under $PS_SLURM_DIR; stop it with deploy/slurm.sh stop)"
        cat <<EOF
ClusterName=heterops
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmctldPort=$PS_SLURM_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$PS_SLURM_DIR/state
SlurmdSpoolDir=$PS_SLURM_DIR/spool/%n
SlurmctldPidFile=$PS_SLURM_DIR/run/slurmctld.pid
SlurmdPidFile=$PS_SLURM_DIR/run/slurmd-%n.pid
SlurmctldLogFile=$PS_SLURM_DIR/log/slurmctld.log
SlurmdLogFile=$PS_SLURM_DIR/log/slurmd-%n.log
SlurmdParameters=config_overrides
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
JobRequeue=1
MinJobAge=600
KillWait=10
InactiveLimit=0
SlurmdTimeout=120
EOF
        k=0
        for node in $(nodes); do
            k=$((k + 1))
            echo "NodeName=$node NodeHostname=$(hostname -s) NodeAddr=127.0.0.1 Port=$((PS_SLURM_PORT + k)) CPUs=$PS_SLURM_CPUS RealMemory=$PS_SLURM_MEMORY_MB State=UNKNOWN"
        done
        echo "PartitionName=local Nodes=n[1-$PS_SLURM_NODES] Default=YES MaxTime=INFINITE State=UP"
    } >"$CONF.new"
    if [ -e "$CONF" ] && ! cmp -s "$CONF.new" "$CONF" && ctld_up; then
        say "the configuration changed (nodes, CPUs, ports): restarting the daemons"
        stop_daemons
    fi
    mv "$CONF.new" "$CONF"
}

pid_alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

ctld_up() { scontrol ping 2>/dev/null | grep -q "is UP"; }

start_daemons() {
    if ! pid_alive "$PS_SLURM_DIR/run/slurmctld.pid"; then
        say "starting slurmctld (log: $PS_SLURM_DIR/log/slurmctld.log)"
        slurmctld
    fi
    local waited=0
    until ctld_up; do
        sleep 0.2
        waited=$((waited + 1))
        [ "$waited" -lt 100 ] || die "slurmctld does not answer; last log line: $(tail -n 1 "$PS_SLURM_DIR/log/slurmctld.log")"
    done
    local node
    for node in $(nodes); do
        if ! pid_alive "$PS_SLURM_DIR/run/slurmd-$node.pid"; then
            slurmd -N "$node"
        fi
    done
    waited=0
    until [ "$(sinfo -h -N -t idle,mixed,allocated -o %N | sort -u | wc -l)" -ge "$PS_SLURM_NODES" ]; do
        if [ "$waited" -eq 25 ]; then  # a node a previous run left down answers again: take it back
            scontrol update NodeName="n[1-$PS_SLURM_NODES]" State=RESUME 2>/dev/null || true
        fi
        sleep 0.2
        waited=$((waited + 1))
        [ "$waited" -lt 150 ] || die "the nodes did not come up: $(sinfo -h -N -o '%N %T %E' | tr '\n' ';')"
    done
}

status_line() {
    if ! ctld_up; then
        echo "slurmctld: down"
        return 1
    fi
    echo "slurmctld: up; nodes: $(sinfo -h -N -o '%N %T %c CPUs' | tr '\n' ';' | sed 's/;$//')"
}

stop_daemons() {
    local pidfile pids=()
    for pidfile in "$PS_SLURM_DIR"/run/slurmd-*.pid "$PS_SLURM_DIR/run/slurmctld.pid"; do
        pid_alive "$pidfile" && pids+=("$(cat "$pidfile")")
    done
    if [ "${1:-}" = "and-munge" ] && [ -f "$PS_SLURM_DIR/run/munged.started" ] && [ -s /run/munge/munged.pid ]; then
        pids+=("$(cat /run/munge/munged.pid)")
        rm -f "$PS_SLURM_DIR/run/munged.started"
    fi
    [ "${#pids[@]}" -gt 0 ] || { say "nothing to stop"; return; }
    kill -TERM "${pids[@]}" 2>/dev/null || true
    local waited=0 pid alive
    while :; do
        alive=0
        for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [ "$alive" -eq 1 ] || break
        sleep 0.2
        waited=$((waited + 1))
        if [ "$waited" -ge 100 ]; then
            kill -KILL "${pids[@]}" 2>/dev/null || true
            break
        fi
    done
    say "stopped ${#pids[@]} daemons"
}

case "${1:-start}" in
    start)
        need_root
        install_packages
        mkdir -p "$PS_SLURM_DIR/run"
        start_munge
        write_config
        start_daemons
        status_line
        ;;
    status) status_line ;;
    stop) need_root; stop_daemons and-munge ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
    *) echo "slurm.sh: error: unknown command '$1' (start, status, stop)" >&2; exit 2 ;;
esac
