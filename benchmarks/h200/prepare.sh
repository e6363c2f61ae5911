# Sourced by the H200 scripts (knee.sh, starved.sh, dense.sh): the set-up they share, from the checkout a
# command sent to the machine lands in. Copies the checkout to /tmp/work (the next command replaces the
# checkout, a running sweep must not see that), the Llama 3 tokenizer from .bundle/tok to /tmp/tok, and
# enters /tmp/work with the unpacked wheel bundle (/tmp/site) on the path; prints the machine's facts.
rm -rf /tmp/work && mkdir -p /tmp/work /tmp/tok
tar --exclude=./.bundle --exclude=./.git -cf - . | tar -C /tmp/work -xf -
cp -r .bundle/tok/. /tmp/tok/ 2>/dev/null || true
cd /tmp/work || exit 1
export PYTHONPATH=/tmp/site:/tmp/work PATH=/tmp/site/bin:$PATH
export ORCH_HOME=${ORCH_HOME:-/tmp/orch} ORCH_TOKENIZER_CACHE=/tmp/tok VLLM_CACHE_ROOT=/tmp/vllm-cache
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 RAY_USAGE_STATS_ENABLED=0
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
nproc; stat -fc %T /sys/fs/cgroup
python3 -c "import vllm, ray, mlflow; print('vllm', vllm.__version__, 'ray', ray.__version__, 'mlflow', mlflow.__version__)"
