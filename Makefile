# Two commands do everything:  `make demo` and `make test`  (and `make lab`).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup demo test lab clean

# The install also builds the JupyterLab extension (npm): redo it when its sources change.
LAB_SOURCES := setup.py labextension/package.json labextension/package-lock.json labextension/tsconfig.json \
               $(wildcard labextension/src/*.ts labextension/style/*)
# JupyterLab refuses to run as root unless told.
LAB_ARGS ?= $(if $(filter 0,$(shell id -u)),--allow-root,)

$(STAMP): setup.cfg pyproject.toml $(LAB_SOURCES)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -e ".[test]"
	touch $(STAMP)

setup: $(STAMP)

## demo: set up, then train in the background and stop it from the "terminal" (the CLI)
demo: $(STAMP)
	$(BIN)/python examples/script_demo.py

## lab: set up, then start JupyterLab with the "Training runs" side panel
lab: $(STAMP)
	$(BIN)/jupyter lab $(LAB_ARGS)

## test: set up, then run the whole test suite
test: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) build *.egg-info checkpoints test-artifacts \
	       labextension/node_modules labextension/lib labextension/tsconfig.tsbuildinfo jupyter_traincontrol/labextension
