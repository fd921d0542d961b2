#!/usr/bin/env bash
# Stop the cluster slurm-up.sh started (slurmd, slurmctld, slurmdbd, MariaDB, and munged
# when slurm-up.sh started it), by the pid files in its state directory, and remove that
# directory. The packages stay installed (as the Makefile leaves LaTeX installed).
#   bash tests/cluster/slurm-down.sh [--keep]   # --keep: leave the directory (logs) in place
set -uo pipefail

DIR="${SEQMIX_SLURM_DIR:-/tmp/seqmix-slurm}"
[ -d "$DIR/run" ] || exit 0

stop() {  # stop NAME: SIGTERM the pid in run/NAME.pid, wait up to 30 s, then SIGKILL
  local pidfile="$DIR/run/$1.pid" pid
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null
    for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null
  fi
  rm -f "$pidfile"
}

# Jobs first, then slurmd, the controller, accounting and its database.
if [ -f "$DIR/run/slurmctld.pid" ]; then
  mapfile -t jobs < <(SLURM_CONF="$DIR/etc/slurm.conf" squeue -h -o %i 2>/dev/null)
  [ "${#jobs[@]}" -gt 0 ] && SLURM_CONF="$DIR/etc/slurm.conf" scancel "${jobs[@]}" 2>/dev/null && sleep 6
fi
for name in slurmd slurmctld slurmdbd mariadb munged; do stop "$name"; done
[ "$(readlink /etc/slurm/slurm.conf 2>/dev/null)" = "$DIR/etc/slurm.conf" ] && rm -f /etc/slurm/slurm.conf
[ "${1:-}" = "--keep" ] || rm -rf "$DIR"
echo "slurm-down: stopped the cluster in $DIR" >&2
