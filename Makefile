# Two commands do everything:  `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup demo test clean

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -e ".[test]"
	touch $(STAMP)

setup: $(STAMP)

## demo: set up, then train in the background and stop it from the "terminal" (the CLI)
demo: $(STAMP)
	$(BIN)/python examples/script_demo.py

## test: set up, then run the whole test suite
test: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) build *.egg-info checkpoints
