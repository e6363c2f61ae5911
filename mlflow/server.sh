#!/usr/bin/env bash
# Start the MLflow tracking server that a team's sweeps log to.
#
# Settings come from the environment, then from mlflow/server.env (copy server.env.example);
# a variable already set in the environment wins over the file. Extra arguments are passed
# to `mlflow server` unchanged (e.g. --allowed-hosts mlflow.example.org).
#
#   MLFLOW_HOME                   state folder (default: ~/.local/share/orchestrator-mlflow)
#   MLFLOW_BACKEND_STORE_URI      sqlite:///$MLFLOW_HOME/mlflow.db (default) or postgresql://user:pw@host/db
#                                 (a cluster's head: the URI `mlflow/postgres.sh start` prints)
#   MLFLOW_ARTIFACTS_DESTINATION  where uploaded artifacts live (default: $MLFLOW_HOME/artifacts; s3://... works)
#   MLFLOW_HOST                   bind address (default 127.0.0.1: this machine only)
#   MLFLOW_PORT                   port (default 5000)
#   MLFLOW_WORKERS                server worker processes (default 2)
#   MLFLOW_SERVER_ALLOWED_HOSTS   Host headers accepted when others reach it by name (MLflow's own variable)
#   MLFLOW_BIN                    the mlflow executable (default: the repo's .venv, else PATH)
#   MLFLOW_SERVER_ENABLE_JOB_EXECUTION  MLflow's GenAI job runner (default here: false; sweeps never use
#                                 it, and it costs seven worker processes)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
env_file="${MLFLOW_ENV_FILE:-$here/server.env}"

if [[ -f "$env_file" ]]; then
  while IFS= read -r line || [[ -n "$line" ]]; do
    line="${line%%#*}"                                  # drop comments
    [[ "$line" =~ ^[[:space:]]*([A-Za-z_][A-Za-z0-9_]*)=(.*)$ ]] || continue
    key="${BASH_REMATCH[1]}"; value="${BASH_REMATCH[2]}"
    value="${value%"${value##*[![:space:]]}"}"          # trim trailing blanks
    value="${value#\"}"; value="${value%\"}"; value="${value#\'}"; value="${value%\'}"
    [[ -z "${!key+set}" ]] && export "$key=$value"      # the environment wins over the file
  done < "$env_file"
fi

MLFLOW_HOME="${MLFLOW_HOME:-$HOME/.local/share/orchestrator-mlflow}"
backend="${MLFLOW_BACKEND_STORE_URI:-sqlite:///$MLFLOW_HOME/mlflow.db}"
artifacts="${MLFLOW_ARTIFACTS_DESTINATION:-$MLFLOW_HOME/artifacts}"
host="${MLFLOW_HOST:-127.0.0.1}"
port="${MLFLOW_PORT:-5000}"
workers="${MLFLOW_WORKERS:-2}"
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION="${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false}"
if [[ -n "${MLFLOW_BIN:-}" ]]; then
  mlflow_bin="$MLFLOW_BIN"
elif [[ -x "$repo/.venv/bin/mlflow" ]]; then
  mlflow_bin="$repo/.venv/bin/mlflow"
else
  mlflow_bin="$(command -v mlflow || true)"
fi
if [[ -z "$mlflow_bin" ]]; then
  echo "server.sh: mlflow not found; install the project (pip install -e .) or set MLFLOW_BIN" >&2
  exit 1
fi

mkdir -p "$MLFLOW_HOME"
case "$artifacts" in
  *://*) ;;                                             # s3://, gs://, ... : nothing to create
  *) mkdir -p "$artifacts" ;;
esac
case "$backend" in
  sqlite*) ;;
  *) # A database's driver (psycopg2 for the URI mlflow/postgres.sh prints): SQLAlchemy imports it without
     # connecting. The URI goes through the environment: it holds a password.
     python_bin="$(dirname "$mlflow_bin")/python"
     if [[ -x "$python_bin" ]] && ! MLFLOW_BACKEND_STORE_URI="$backend" "$python_bin" -c \
          "import os, sqlalchemy; sqlalchemy.create_engine(os.environ['MLFLOW_BACKEND_STORE_URI'])" 2>/dev/null; then
       echo "server.sh: no database driver for ${backend%%://*}:// in $python_bin. For PostgreSQL, install" \
            "the project's cluster extra (pip install -e '.[cluster]': psycopg2-binary) and name its driver in" \
            "the URI, postgresql+psycopg2:// (as mlflow/postgres.sh prints it)" >&2
       exit 1
     fi ;;
esac
if [[ "$host" != "127.0.0.1" && "$host" != "localhost" ]]; then
  echo "server.sh: listening on $host:$port. MLflow has no authentication here: keep it on a trusted network." >&2
fi

echo "server.sh: backend=${backend%%://*}://…  artifacts=$artifacts  http://$host:$port" >&2
# The backend goes through the environment (mlflow server reads MLFLOW_BACKEND_STORE_URI), not the
# command line, which every user of the machine can read: a database URI holds its password.
export MLFLOW_BACKEND_STORE_URI="$backend"
exec "$mlflow_bin" server \
  --artifacts-destination "$artifacts" \
  --serve-artifacts \
  --host "$host" \
  --port "$port" \
  --workers "$workers" \
  "$@"
