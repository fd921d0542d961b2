#!/usr/bin/env bash
# Bring up a single-node SLURM cluster on localhost: munge, MariaDB, slurmdbd, slurmctld
# and slurmd from Debian's packages (slurm-wlm 22.05), installed with apt when missing, all
# running as root from one state directory, $SEQMIX_SLURM_DIR (default /tmp/seqmix-slurm):
# the configs written from this folder's *.conf.in, the daemons' pid files and logs,
# MariaDB's data. Sized to the machine: all its CPUs, 3/4 of its memory, and
# $SEQMIX_SLURM_GPUS (default 2) GPUs as a GRES count without devices.
#
#   bash tests/cluster/slurm-up.sh        # prints SLURM_CONF=<dir>/etc/slurm.conf
#   export SLURM_CONF=/tmp/seqmix-slurm/etc/slurm.conf; sinfo; sbatch ...
#   bash tests/cluster/slurm-down.sh      # stops what this started, removes the directory
#
# Idempotent: a cluster already up from the same directory is reused. Exit status 2 means
# the cluster cannot be started here (not root, no apt-get, a port taken by another
# program); tests/workflow/test_slurm.py skips on it (CI fails instead).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
DIR="${SEQMIX_SLURM_DIR:-/tmp/seqmix-slurm}"
GPUS="${SEQMIX_SLURM_GPUS:-2}"  # at least 1
CTLD_PORT="${SEQMIX_SLURM_PORT_BASE:-6817}"
SLURMD_PORT=$((CTLD_PORT + 1))
DBD_PORT=$((CTLD_PORT + 2))
DB_PORT=$((CTLD_PORT + 3))
PACKAGES=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server)
export SLURM_CONF="$DIR/etc/slurm.conf"

say() { echo "slurm-up: $*" >&2; }
cannot() { say "cannot start a cluster here: $*"; exit 2; }
fail() { say "$*"; for f in "$DIR"/log/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -n 20 "$f" >&2; }; done; exit 1; }

# wait_for SECONDS DESCRIPTION COMMAND...: poll COMMAND every 0.5 s until it succeeds.
wait_for() {
  local limit=$(( $1 * 2 )) what=$2; shift 2
  for _ in $(seq "$limit"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.5; done
  fail "$what did not come up within $(( limit / 2 )) s"
}

alive() { [ -f "$DIR/run/$1.pid" ] && kill -0 "$(cat "$DIR/run/$1.pid")" 2>/dev/null; }

node_idle() { [ "$(sinfo -h -n localhost -o %T 2>/dev/null)" = idle ]; }

port_free() {
  ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

install_packages() {
  local missing=()
  for cmd in slurmctld slurmd sbatch slurmdbd munged mariadbd mariadb-install-db; do
    command -v "$cmd" >/dev/null || missing+=("$cmd")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  command -v apt-get >/dev/null || cannot "no apt-get to install ${missing[*]}"
  say "installing ${PACKAGES[*]} (missing: ${missing[*]})"
  # Debian's maintainer scripts start each daemon with its default config; a policy-rc.d
  # that refuses keeps them from doing so (as Debian's container images have).
  local policy_added=
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    policy_added=1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
  [ -n "$policy_added" ] && rm -f /usr/sbin/policy-rc.d
  return 0
}

render() {  # render TEMPLATE DEST: fill in the @NAME@ placeholders
  sed -e "s|@DIR@|$DIR|g" -e "s|@CPUS@|$CPUS|g" -e "s|@MEM_MB@|$MEM_MB|g" -e "s|@GPUS@|$GPUS|g" \
      -e "s|@LAST_GPU@|$((GPUS - 1))|g" \
      -e "s|@CTLD_PORT@|$CTLD_PORT|g" -e "s|@SLURMD_PORT@|$SLURMD_PORT|g" \
      -e "s|@DBD_PORT@|$DBD_PORT|g" -e "s|@DB_PORT@|$DB_PORT|g" -e "s|@DB_PASS@|$DB_PASS|g" \
      "$HERE/$1" > "$2"
}

start_munge() {
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    say "munge: using the munged already running"
    return
  fi
  [ -s /etc/munge/munge.key ] || { mungekey --create --force >/dev/null 2>&1 || \
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 2>/dev/null; }
  chown munge:munge /etc/munge/munge.key && chmod 600 /etc/munge/munge.key
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid
  # Ours to stop: slurm-down.sh stops munged only when this file names it.
  cp /run/munge/munged.pid "$DIR/run/munged.pid"
  wait_for 20 munged sh -c 'munge -n | unmunge'
}

start_mariadb() {
  local db="$DIR/mariadb"
  if [ ! -d "$db/mysql" ]; then
    mariadb-install-db --no-defaults --datadir="$db" --user=root --skip-test-db \
      --auth-root-authentication-method=socket > "$DIR/log/mariadb-install.log" 2>&1 \
      || fail "mariadb-install-db failed (log: $DIR/log/mariadb-install.log)"
  fi
  # Its own data, socket and port, listening on 127.0.0.1 only; --no-defaults: no /etc/mysql.
  mariadbd --no-defaults --user=root --datadir="$db" --socket="$DIR/run/mariadb.sock" \
    --pid-file="$DIR/run/mariadb.pid" --port="$DB_PORT" --bind-address=127.0.0.1 \
    --skip-name-resolve --innodb-buffer-pool-size=64M --innodb-lock-wait-timeout=900 \
    --log-error="$DIR/log/mariadb.log" >/dev/null 2>&1 &
  wait_for 60 MariaDB mariadb-admin --no-defaults --socket="$DIR/run/mariadb.sock" ping
  mariadb --no-defaults --socket="$DIR/run/mariadb.sock" -u root <<SQL
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
SQL
}

main() {
  [ "$(id -u)" = 0 ] || cannot "run it as root (it installs packages and starts daemons)"
  if alive slurmctld && alive slurmd && alive slurmdbd && node_idle; then
    say "already up ($DIR)"; echo "SLURM_CONF=$SLURM_CONF"; return
  fi
  [ -e "$DIR" ] && { say "clearing a stale $DIR"; bash "$HERE/slurm-down.sh" >/dev/null 2>&1 || true; }
  if [ -e /etc/slurm/slurm.conf ] && [ "$(readlink /etc/slurm/slurm.conf)" != "$DIR/etc/slurm.conf" ]; then
    cannot "/etc/slurm/slurm.conf exists (a SLURM installation of its own): not replacing it"
  fi
  for port in "$CTLD_PORT" "$SLURMD_PORT" "$DBD_PORT" "$DB_PORT"; do
    port_free "$port" || cannot "127.0.0.1:$port is taken (set SEQMIX_SLURM_PORT_BASE to use 4 other ports)"
  done
  install_packages
  CPUS=$(nproc)
  MEM_MB=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) * 3 / 4 / 1024 ))
  DB_PASS=$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
  mkdir -p "$DIR"/{etc,state,spool,run,log,dev}
  for i in $(seq 0 $((GPUS - 1))); do
    mknod "$DIR/dev/gpu$i" c 1 3 2>/dev/null || touch "$DIR/dev/gpu$i"
  done
  render slurm.conf.in "$DIR/etc/slurm.conf"
  render gres.conf.in "$DIR/etc/gres.conf"
  render slurmdbd.conf.in "$DIR/etc/slurmdbd.conf"
  chmod 600 "$DIR/etc/slurmdbd.conf"  # slurmdbd refuses a config others can read
  # Commands find the config through $SLURM_CONF, but not all of them get it: the executor
  # plugin's job step drops every SLURM_* variable before its nested srun, which then reads
  # the default path. Link it there (removed by slurm-down.sh); an existing one is refused.
  mkdir -p /etc/slurm && ln -sfn "$DIR/etc/slurm.conf" /etc/slurm/slurm.conf

  start_munge
  start_mariadb
  slurmdbd || fail "slurmdbd did not start"
  wait_for 60 slurmdbd sacctmgr -n show cluster
  sacctmgr -i add cluster seqmix >/dev/null 2>&1 || true
  slurmctld || fail "slurmctld did not start"
  wait_for 60 slurmctld scontrol ping
  slurmd -N localhost || fail "slurmd did not start"
  wait_for 60 "the node (idle in sinfo)" node_idle
  say "up: $CPUS CPUs, $MEM_MB MB, $GPUS GPU GRES; state in $DIR"
  echo "SLURM_CONF=$SLURM_CONF"
}

main "$@"
