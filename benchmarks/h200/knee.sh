#!/usr/bin/env bash
# sweeps/h200-knee.yaml on a lent single-GPU machine, from a copy of the checkout in /tmp/work (each
# command sent to the machine replaces the checkout). The wheel bundle is already unpacked in /tmp/site;
# the Llama 3 tokenizer comes in .bundle/tok. Poll with benchmarks/h200/wait.sh.
set -uo pipefail
source "$(dirname "$0")/prepare.sh"
python3 -m orchestrator.cli plan sweeps/h200-knee.yaml | tail -3
setsid nohup python3 -m orchestrator.cli run sweeps/h200-knee.yaml > /tmp/sweep.log 2>&1 < /dev/null &
echo "started: pid $!"
