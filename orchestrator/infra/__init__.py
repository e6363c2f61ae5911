"""Infra: the run's own processes and ports, used by control and node alike: the local Ray head and MLflow
server (local_servers), watchdogs that end a group when its owner dies (lifeline), the record of what a run
started for the next run to reap (survivors), free ports and health checks (net), the one-run-per-home
lock (homelock), and the SSH node on 127.0.0.1 that cluster-local.yaml's launcher reaches (loopback_cluster).
Imports no stage."""
