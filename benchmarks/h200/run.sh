#!/usr/bin/env bash
# Run a sweep on a lent single-node GPU machine that has no package registry: the wheel bundle
# (see the GPU notes) is unpacked into /tmp/site, the Llama 3 tokenizer comes pre-fetched in
# $TOK, and everything the sweep wrote is packed into $OUT.
#   usage: benchmarks/h200/run.sh SWEEP [pytest paths to run first ...]
set -uo pipefail
SWEEP=${1:?sweep file}; shift
export PYTHONPATH=/tmp/site:/tmp/pylib:$PWD PATH=/tmp/site/bin:$PATH
export ORCH_HOME=${ORCH_HOME:-/tmp/orch} ORCH_TOKENIZER_CACHE=${TOK:-/tmp/tok}
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 RAY_USAGE_STATS_ENABLED=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
nproc; python3 -c "import vllm, ray, mlflow; print('vllm', vllm.__version__, 'ray', ray.__version__, 'mlflow', mlflow.__version__)"
stat -fc %T /sys/fs/cgroup
if [ $# -gt 0 ]; then python3 -m pytest -q -p no:cacheprovider "$@" 2>&1 | tail -15; fi
setsid nohup python3 -m orchestrator.cli run "$SWEEP" > /tmp/sweep.log 2>&1 < /dev/null &
echo "sweep started: pid $!"
