#!/usr/bin/env bash
# Start a one-node SLURM cluster on localhost (munge, slurmctld, slurmd) with the slurm.conf
# beside this script, and wait until the node takes jobs. Needs root (CI runs as root).
#
# Idempotent: installs Debian's packages only when a binary is missing, creates the munge key
# only when there is none, leaves daemons alone that already answer (restarting SLURM only when
# the installed slurm.conf changed), and brings a drained or down node back.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
say() { echo "slurm-setup: $*"; }
die() { echo "slurm-setup: error: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (it installs packages and starts daemons)"

missing=0
for bin in munged slurmctld slurmd sbatch; do command -v "$bin" >/dev/null || missing=1; done
if [ "$missing" = 1 ]; then
    say "installing munge, slurmctld, slurmd, slurm-client"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        munge slurmctld slurmd slurm-client >/dev/null
fi

# The node is called localhost with address 127.0.0.1, so the container's own hostname never
# needs to resolve; make sure localhost itself does.
getent hosts localhost >/dev/null || echo "127.0.0.1 localhost" >> /etc/hosts

# munge: one key, a socket directory, one daemon.
if [ ! -s /etc/munge/munge.key ]; then
    say "creating a munge key"
    install -d -o munge -g munge -m 700 /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown munge:munge /etc/munge/munge.key
chmod 400 /etc/munge/munge.key
install -d -o munge -g munge -m 755 /run/munge
install -d -o munge -g munge -m 700 /var/log/munge /var/lib/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    say "starting munged"
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
    munge -n | unmunge >/dev/null || die "munged does not answer; see /var/log/munge/munged.log"
fi

# slurm.conf: install ours; a changed file means the running daemons must restart.
restart=0
if ! cmp -s "$here/slurm.conf" /etc/slurm/slurm.conf; then
    install -D -m 644 "$here/slurm.conf" /etc/slurm/slurm.conf
    restart=1
fi
install -d -o slurm -g slurm /var/lib/slurm/slurmctld /var/log/slurm
install -d /var/lib/slurm/slurmd

# A daemon runs when the pid in its pid file is alive and is that daemon (pids get reused).
running() {  # NAME PIDFILE
    [ -s "$2" ] && [ "$(cat "/proc/$(cat "$2" 2>/dev/null)/comm" 2>/dev/null)" = "$1" ]
}
stop_daemon() {  # NAME PIDFILE: by the pid file the daemon wrote, never by name
    if running "$1" "$2"; then
        kill "$(cat "$2" 2>/dev/null)" 2>/dev/null || true
        for _ in $(seq 50); do running "$1" "$2" || break; sleep 0.1; done
    fi
    rm -f "$2"
}

if [ "$restart" = 1 ]; then
    stop_daemon slurmd /run/slurmd.pid
    stop_daemon slurmctld /run/slurmctld.pid
fi
if ! running slurmctld /run/slurmctld.pid; then
    say "starting slurmctld"
    slurmctld
fi
for _ in $(seq 100); do scontrol ping >/dev/null 2>&1 && break; sleep 0.1; done
scontrol ping >/dev/null 2>&1 || die "slurmctld does not answer; see /var/log/slurm/slurmctld.log"
if ! running slurmd /run/slurmd.pid; then
    say "starting slurmd"
    slurmd -N localhost
fi

# Wait for the node to register; bring it back if an earlier run left it down or drained.
state=""
for _ in $(seq 150); do
    state=$(sinfo -h -n localhost -o %T 2>/dev/null || true)
    case "$state" in
        *'*') ;;  # registered but not responding yet
        idle|mixed|allocated|completing) say "node localhost is $state"; exit 0 ;;
        down*|drain*|fail*) scontrol update nodename=localhost state=resume >/dev/null 2>&1 || true ;;
    esac
    sleep 0.2
done
die "node localhost did not come up (state '${state:-unknown}'); see /var/log/slurm/slurmd.log"
