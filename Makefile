# `make lab` runs the headless demo (the first time) and opens JupyterLab on the example notebooks; `make test` runs the tests. Both set up .venv first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(abspath $(VENV))/bin
STAMP  := $(VENV)/.installed
# Shell commands in notebooks (`!jupyter-traincontrol ...`) find the venv's scripts.
export PATH := $(BIN):$(PATH)
LAB_FLAGS ?= --ServerApp.ip=127.0.0.1 $(if $(filter 0,$(shell id -u)),--allow-root)

.PHONY: setup demo lab test wheel clean

# The install also builds the JupyterLab extension (npm): redo it when its sources change.
LAB_SOURCES := setup.py labextension/package.json labextension/package-lock.json labextension/tsconfig.json \
               $(wildcard labextension/src/*.ts labextension/style/*)

$(STAMP): setup.cfg pyproject.toml $(LAB_SOURCES)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -e ".[test]"
	touch $(STAMP)

setup: $(STAMP)

## demo: the quickstart notebook headless in a real kernel (with a real kernel
## interrupt), then a script controlled from the command line
DEMO_STAMP := $(VENV)/.demo-ran
demo: $(STAMP)
	$(BIN)/python examples/notebook_demo.py
	$(BIN)/python examples/script_demo.py
	touch $(DEMO_STAMP)

## lab: the headless demo the first time only (`make demo` leaves a stamp in
## the venv; run `make demo` to see it again), then JupyterLab on a copy of
## the example notebooks in work/ (ignored by git), so running them leaves the
## tracked ones clean; copies already there are kept (your edits and outputs
## stay yours). A demo that fails says so and JupyterLab opens all the same.
LAB_DIR ?= work
$(DEMO_STAMP): | $(STAMP)
	$(MAKE) --no-print-directory demo \
	    || echo "The headless demo failed (its output is above); opening JupyterLab all the same. Rerun it: make demo"

lab: $(STAMP) | $(DEMO_STAMP)
	mkdir -p $(LAB_DIR)
	cp -n notebooks/*.ipynb $(LAB_DIR)/
	cd $(LAB_DIR) && $(BIN)/jupyter lab quickstart.ipynb $(LAB_FLAGS)

## test: the architecture's import contracts (lint-imports), the whole test
## suite on TensorFlow, then the core tests (callback,
## commands, resume, checkpoints, the script driven by the CLI, Ctrl+C, the
## fault cases with a fit, SIGTERM and autosave) and the notebook's main scenarios (a real kernel)
## again on JAX and on torch, and the Keras 2 tests (tf_keras: its fit, a
## script, a kernel) once, with TF_USE_LEGACY_KERAS=1 as Keras 2 users run
## it (what CI runs)
## Each pass runs on PYTEST_WORKERS processes (pytest-xdist), a test file
## whole on one of them (`--dist loadfile`: a file's fixtures, such as its
## multi-process jobs, are shared by its tests).
PYTEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --durations=10
BACKEND_TESTS ?= tests/test_callback.py tests/test_cli.py tests/test_checkpoint.py tests/test_faults.py \
                 tests/test_steering.py tests/test_background_saves.py tests/test_exact_resume.py \
                 tests/test_backends.py tests/test_notebook_backends.py tests/test_span.py tests/test_never_lose.py
KERAS2_TESTS ?= tests/test_keras2.py
test: $(STAMP) wheel
	$(BIN)/lint-imports --no-cache
	JUPYTER_TRAINCONTROL_WHEEL="$$(ls $(abspath $(WHEEL_DIR))/jupyter_traincontrol-*.whl)" $(PYTEST) \
	    $(addprefix --ignore=,$(KERAS2_TESTS))
	KERAS_BACKEND=jax $(PYTEST) $(BACKEND_TESTS)
	KERAS_BACKEND=torch $(PYTEST) $(BACKEND_TESTS)
	TF_USE_LEGACY_KERAS=1 $(PYTEST) $(KERAS2_TESTS)

## wheel: the wheel users install (`python -m build --wheel`: builds the
## JupyterLab extension with npm if its sources changed); tests/test_install.py
## installs it into a fresh venv on a PATH without Node
WHEEL_DIR ?= dist
wheel: $(STAMP)
	rm -f $(WHEEL_DIR)/jupyter_traincontrol-*.whl
	$(BIN)/python -m build --wheel --outdir $(WHEEL_DIR)

clean:
	rm -rf $(VENV) build dist *.egg-info checkpoints notebooks/checkpoints test-artifacts work \
	       labextension/node_modules labextension/lib labextension/tsconfig.tsbuildinfo jupyter_traincontrol/labextension
