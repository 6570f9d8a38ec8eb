# The two Quickstart commands. Each creates or reuses .venv and installs what it needs.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.coevo-installed

.PHONY: train test install

# Main job. For now: the base harness evaluated on the built-in arithmetic tasks.
train: $(STAMP)
	$(VENV)/bin/coevo eval $(ARGS)

test: $(STAMP)
	$(PY) -m pytest $(ARGS)

install: $(STAMP)

$(STAMP): pyproject.toml scripts/bootstrap.sh
	bash scripts/bootstrap.sh $(VENV)
	touch $(STAMP)
