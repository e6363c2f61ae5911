#!/usr/bin/env bash
# A PostgreSQL of MLflow's own, for a cluster's tracking server: one database cluster in a state folder,
# listening on 127.0.0.1 only, started and stopped by this script (never a system service).
#
#   mlflow/postgres.sh install   install Debian's `postgresql` package when its programs are missing
#                                (as root, where apt-get exists); exits 1 with the reason otherwise
#   mlflow/postgres.sh start     create the cluster on first use (database and user `mlflow`, a random
#                                password), start it, and print the URI for MLFLOW_BACKEND_STORE_URI
#                                (postgresql+psycopg2://...: the server needs psycopg2, the `cluster` extra)
#   mlflow/postgres.sh uri       print that URI (the cluster must exist)
#   mlflow/postgres.sh status    exit 0 when this folder's server runs, 3 when it does not
#   mlflow/postgres.sh stop      stop this folder's server (pg_ctl -D <folder>/data: exactly it)
#
# Settings (the environment, then mlflow/server.env, as for server.sh):
#   MLFLOW_HOME      state folder of the tracking server (default: ~/.local/share/orchestrator-mlflow)
#   MLFLOW_PG_DIR    this cluster's folder (default: $MLFLOW_HOME/postgres): data/, password, port, server.log
#   MLFLOW_PG_PORT   the TCP port on 127.0.0.1 (default: the one chosen at creation: a free port)
#   MLFLOW_PG_USER   as root only: the system user the server runs as (PostgreSQL refuses root). Default:
#                    `postgres` (Debian's package creates it), else a system user `orchestrator-pg` made here.
#                    That user must be able to reach MLFLOW_PG_DIR: every folder above it must be searchable
#                    by others (root's home, /root, is not; /srv or /var/lib are).
#   MLFLOW_PG_BIN    the folder of initdb, pg_ctl and postgres (default: PATH, else the newest
#                    /usr/lib/postgresql/<version>/bin)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
env_file="${MLFLOW_ENV_FILE:-$here/server.env}"
if [[ -f "$env_file" ]]; then
  while IFS= read -r line || [[ -n "$line" ]]; do
    line="${line%%#*}"
    [[ "$line" =~ ^[[:space:]]*([A-Za-z_][A-Za-z0-9_]*)=(.*)$ ]] || continue
    key="${BASH_REMATCH[1]}"; value="${BASH_REMATCH[2]}"
    value="${value%"${value##*[![:space:]]}"}"
    value="${value#\"}"; value="${value%\"}"; value="${value#\'}"; value="${value%\'}"
    [[ -z "${!key+set}" ]] && export "$key=$value"
  done < "$env_file"
fi

MLFLOW_HOME="${MLFLOW_HOME:-$HOME/.local/share/orchestrator-mlflow}"
pg="${MLFLOW_PG_DIR:-$MLFLOW_HOME/postgres}"
data="$pg/data"
me="postgres.sh"

die() { echo "$me: $*" >&2; exit 1; }

# The folder holding initdb, pg_ctl and postgres; empty when PostgreSQL is not installed.
find_bin() {
  if [[ -n "${MLFLOW_PG_BIN:-}" ]]; then
    [[ -x "$MLFLOW_PG_BIN/pg_ctl" ]] || die "MLFLOW_PG_BIN=$MLFLOW_PG_BIN holds no pg_ctl"
    echo "$MLFLOW_PG_BIN"; return
  fi
  local p
  if p="$(command -v pg_ctl)" && [[ -x "$(dirname "$p")/initdb" && -x "$(dirname "$p")/postgres" ]]; then
    dirname "$(readlink -f "$p")"; return
  fi
  # Debian keeps them off PATH, one folder per major version: take the newest.
  p="$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V | tail -n 1)"
  [[ -n "$p" && -x "$p/pg_ctl" ]] && echo "$p"
  return 0
}

install_pg() {
  [[ -n "$(find_bin)" ]] && return 0
  if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null; then
    echo "$me: PostgreSQL is not installed and cannot be installed here (needs root and apt-get):" \
         "install Debian's postgresql package, or set MLFLOW_PG_BIN" >&2
    return 1
  fi
  # No "main" cluster, so no system service runs one: this script runs its own cluster. Written only where
  # the file is not there yet; postgresql-common's set-up (ucf) then keeps it (UCF_FORCE_CONFFOLD).
  if [[ ! -e /etc/postgresql-common/createcluster.conf ]]; then
    mkdir -p /etc/postgresql-common
    echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.conf
  fi
  local apt=(env DEBIAN_FRONTEND=noninteractive UCF_FORCE_CONFFOLD=1
             apt-get install -y -q -o Dpkg::Options::=--force-confold postgresql)
  "${apt[@]}" >/dev/null 2>&1 || { apt-get update -q >/dev/null && "${apt[@]}" >/dev/null; } ||
    { echo "$me: apt-get install postgresql failed" >&2; return 1; }
  [[ -n "$(find_bin)" ]] || { echo "$me: postgresql installed, but no pg_ctl found" >&2; return 1; }
}

bin="$(find_bin)"
need_bin() { [[ -n "$bin" ]] || die "PostgreSQL is not installed: run \`$0 install\` as root, or install Debian's postgresql package"; }

# As root the server runs as another user (PostgreSQL refuses root); otherwise as the caller.
svc=""
if [[ "$(id -u)" == 0 ]]; then
  svc="${MLFLOW_PG_USER:-}"
  if [[ -z "$svc" ]]; then
    if getent passwd postgres >/dev/null; then svc=postgres; else svc=orchestrator-pg; fi
  fi
fi
as_svc() {
  if [[ -n "$svc" ]]; then (cd / && runuser -u "$svc" -- "$@"); else "$@"; fi
}
ensure_svc_user() {
  [[ -z "$svc" ]] && return 0
  getent passwd "$svc" >/dev/null && return 0
  [[ "$svc" == orchestrator-pg ]] || die "MLFLOW_PG_USER=$svc: no such user"
  useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin orchestrator-pg ||
    die "could not create the system user orchestrator-pg; set MLFLOW_PG_USER to an existing non-root user"
}

running() { [[ -f "$data/PG_VERSION" ]] && as_svc "$bin/pg_ctl" -D "$data" status >/dev/null 2>&1; }

uri() {
  [[ -f "$pg/password" && -f "$pg/port" ]] || die "no cluster in $pg: run \`$0 start\` first"
  local port="${MLFLOW_PG_PORT:-$(cat "$pg/port")}"
  # The driver named: SQLAlchemy 2.1 takes a bare postgresql:// to mean psycopg 3, 1.4-2.0 psycopg2.
  echo "postgresql+psycopg2://mlflow:$(cat "$pg/password")@127.0.0.1:$port/mlflow"
}

free_port() {
  local py
  for py in python3 python; do
    if command -v "$py" >/dev/null; then
      "$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
      return
    fi
  done
  echo 5433
}

create() {
  ensure_svc_user
  local made=""
  [[ -d "$pg" ]] || made=1
  mkdir -p "$pg" && chmod 700 "$pg"
  if [[ -n "$svc" ]]; then
    chown "$svc" "$pg"
    if ! as_svc test -x "$pg" -a -w "$pg"; then
      [[ -n "$made" ]] && rmdir "$pg"
      die "user $svc cannot reach $pg (a folder above it is private to root): set MLFLOW_PG_DIR under a folder others can search, e.g. /srv or /var/lib"
    fi
  fi
  (umask 077; head -c 18 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$pg/password")
  echo "${MLFLOW_PG_PORT:-$(free_port)}" > "$pg/port"
  [[ -n "$svc" ]] && chown "$svc" "$pg/password" "$pg/port"
  as_svc "$bin/initdb" -D "$data" -E UTF8 --no-locale --auth=reject >"$pg/initdb.log" 2>&1 ||
    die "initdb failed; see $pg/initdb.log"
  # Only the mlflow user, only to the mlflow database, only over loopback with its password. No Unix
  # socket: its path has a length limit that deep state folders exceed, and nothing here needs it.
  printf '%s\n' "host mlflow mlflow 127.0.0.1/32 scram-sha-256" > "$data/pg_hba.conf"
  cat >> "$data/postgresql.conf" <<EOF

# mlflow/postgres.sh
listen_addresses = '127.0.0.1'
unix_socket_directories = ''
# Each MLflow server worker keeps a pool of up to 15 connections (SQLAlchemy's 5 + 10 overflow).
max_connections = 200
password_encryption = 'scram-sha-256'
EOF
  [[ -n "$svc" ]] && chown "$svc" "$data/pg_hba.conf"
  # Single-user mode: the role and the database are made before any connection is possible.
  printf '%s\n' "CREATE ROLE mlflow LOGIN PASSWORD '$(cat "$pg/password")';" \
                "CREATE DATABASE mlflow OWNER mlflow;" |
    as_svc "$bin/postgres" --single -D "$data" postgres >"$pg/create.log" 2>&1 ||
    die "creating the mlflow role and database failed; see $pg/create.log"
  grep -q "ERROR" "$pg/create.log" && die "creating the mlflow role and database failed; see $pg/create.log"
  return 0
}

start() {
  need_bin
  [[ -f "$data/PG_VERSION" ]] || create
  if ! running; then
    local port="${MLFLOW_PG_PORT:-$(cat "$pg/port")}"
    echo "$port" > "$pg/port"
    as_svc "$bin/pg_ctl" -D "$data" -l "$pg/server.log" -w -t 60 -o "-p $port" start >/dev/null ||
      die "PostgreSQL did not start on 127.0.0.1:$port; see $pg/server.log"
  fi
  uri
}

stop() {
  [[ -f "$data/PG_VERSION" ]] || return 0
  need_bin
  running || return 0
  as_svc "$bin/pg_ctl" -D "$data" -m fast -w -t 60 stop >/dev/null
}

case "${1:-}" in
  install) install_pg ;;
  start) start ;;
  stop) stop ;;
  uri) uri ;;
  status) need_bin; running || exit 3 ;;
  *) echo "usage: $0 install|start|stop|status|uri" >&2; exit 2 ;;
esac
