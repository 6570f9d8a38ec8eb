# The two Quickstart commands. Each creates or reuses .venv and installs what it needs.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.coevo-installed

.PHONY: train test install

# Main job: co-evolution of SmolLM2-135M (+ LoRA) and its harness on the embedded defaults (configs/train.yaml).
# Hydra overrides go in ARGS, e.g. make train ARGS="experiment=smoke" or ARGS="mode=harness_only name=h".
train: $(STAMP)
	$(PY) train.py $(ARGS)

test: $(STAMP)
	$(PY) -m pytest $(ARGS)

install: $(STAMP)

$(STAMP): pyproject.toml scripts/bootstrap.sh scripts/constraints.txt
	bash scripts/bootstrap.sh $(VENV)
	touch $(STAMP)
