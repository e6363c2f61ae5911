"""Infra: the run's own processes and ports, used by control and node alike: the local Ray head and MLflow
server (local_servers), watchdogs that end a group when its owner dies (lifeline), the record of what a run
started for the next run to reap (survivors), free ports and health checks (net), and the one-run-per-home
lock (homelock). Imports no stage."""
