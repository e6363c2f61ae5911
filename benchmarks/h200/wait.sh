#!/usr/bin/env bash
# Wait (at most $1 seconds) for the sweeps started by run.sh or fidelity.sh, then pack what they
# wrote into $OUT: the whole results when they have finished, what there is so far otherwise (a
# lease can end before a sweep does; the MLflow store holds every finished trial). The reports are in
# orch-home.tgz (reports/<sweep>/): $OUT brings back at most 8 files.
set -uo pipefail
limit=${1:-540}; t=0
while pgrep -f "orchestrator.cli run" >/dev/null && [ $t -lt "$limit" ]; do sleep 10; t=$((t+10)); done
grep -vE "^\s*$" /tmp/sweep.log | tail -40
mkdir -p "$OUT"
cp /tmp/sweep.log "$OUT/" 2>/dev/null
cp /tmp/nvml.log /tmp/text_bench.txt /tmp/startup_compare.txt /tmp/startup_compare.csv /tmp/overhead.txt /tmp/overhead.csv \
  "$OUT/" 2>/dev/null
cp "${ORCH_HOME:-/tmp/orch}"/reports/*.csv "$OUT/" 2>/dev/null
tar -C "${ORCH_HOME:-/tmp/orch}" -czf "$OUT/orch-home.tgz" --exclude='node/scratch' --exclude='node/models' \
  --exclude='*.parquet.tmp' . 2>/dev/null
if pgrep -f "orchestrator.cli run" >/dev/null; then echo "still running after ${limit}s (packed so far)"; fi
ls -la "$OUT"
