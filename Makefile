# The two Quickstart commands. Each creates or reuses .venv and installs what it needs.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.coevo-installed

.PHONY: train test install

# Main job. For now: SmolLM2 with the base harness on 24 reasoning val tasks (until co-evolution lands).
train: $(STAMP)
	$(VENV)/bin/coevo eval --limit 24 $(ARGS)

test: $(STAMP)
	$(PY) -m pytest $(ARGS)

install: $(STAMP)

$(STAMP): pyproject.toml scripts/bootstrap.sh
	bash scripts/bootstrap.sh $(VENV)
	touch $(STAMP)
