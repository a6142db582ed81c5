# `make lab` runs the headless demo (the first time) and opens JupyterLab on the example notebooks; `make test` runs the tests. Both set up .venv first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(abspath $(VENV))/bin
STAMP  := $(VENV)/.installed
# Shell commands in notebooks (`!jupyter-traincontrol ...`) find the venv's scripts.
export PATH := $(BIN):$(PATH)
LAB_FLAGS ?= --ServerApp.ip=127.0.0.1 $(if $(filter 0,$(shell id -u)),--allow-root)

.PHONY: setup demo lab test test-colab colab-pass wheel clean

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
## again on JAX and on torch, the Keras 2 tests (tf_keras: its fit, a
## script, a kernel) once, with TF_USE_LEGACY_KERAS=1 as Keras 2 users run
## it, and last the Colab pass (`make test-colab`, below): what CI runs
## Each pass runs on PYTEST_WORKERS processes (pytest-xdist), a test file
## whole on one of them (`--dist loadfile`: a file's fixtures, such as its
## multi-process jobs, are shared by its tests).
PYTEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --durations=10
BACKEND_TESTS ?= tests/test_callback.py tests/test_cli.py tests/test_checkpoint.py tests/test_faults.py \
                 tests/test_steering.py tests/test_background_saves.py tests/test_exact_resume.py \
                 tests/test_backends.py tests/test_notebook_backends.py tests/test_span.py tests/test_never_lose.py \
                 tests/test_callback_states.py tests/test_steering_resume.py tests/test_loop_resume.py
KERAS2_TESTS ?= tests/test_keras2.py
test: $(STAMP) wheel
	$(BIN)/lint-imports --no-cache
	JUPYTER_TRAINCONTROL_WHEEL="$$(ls $(abspath $(WHEEL_DIR))/jupyter_traincontrol-*.whl)" $(PYTEST) \
	    $(addprefix --ignore=,$(KERAS2_TESTS))
	KERAS_BACKEND=jax $(PYTEST) $(BACKEND_TESTS)
	KERAS_BACKEND=torch $(PYTEST) $(BACKEND_TESTS)
	TF_USE_LEGACY_KERAS=1 $(PYTEST) $(KERAS2_TESTS)
	$(MAKE) --no-print-directory colab-pass

## test-colab: the wheel installed into .venv-colab, a venv with Colab's
## versions (tests/colab-pins.txt: IPython 7.34, ipykernel 6.17.1,
## ipywidgets 7.7.1, Keras 3.13, TensorFlow 2.20, ...) on COLAB_PYTHON, built
## once (delete its stamp, .venv-colab/.installed, to rebuild it). The wheel
## comes with its dependencies, as `pip install` in Colab does:
## tests/test_colab_pins.py checks that it upgraded none of the pins. Then
## the notebook's main scenarios in real kernels there: the panel on
## ipywidgets 7 and its clicks, kernel interrupts, a restart, --resume; and
## in a browser (Playwright, driving Debian's chromium), the panel in classic
## Notebook 6 with widgetsnbextension 3, whose widget manager stands in for
## Colab's (tests/test_browser_notebook6.py); and the private Keras names the
## package relies on, on Keras 3.13 (tests/test_keras_internals.py).
## `--confcutdir tests` leaves out the root conftest.py (pytest-jupyter's
## server fixtures, which no test here uses).
COLAB_VENV   ?= .venv-colab
COLAB_BIN    := $(abspath $(COLAB_VENV))/bin
COLAB_PYTHON ?= /usr/bin/python3.11
COLAB_PINS   := tests/colab-pins.txt
COLAB_STAMP  := $(COLAB_VENV)/.installed
COLAB_TESTS  ?= tests/test_colab_pins.py tests/test_widget_compat.py tests/test_browser_notebook6.py \
                tests/test_notebook_front_ends.py tests/test_keras_internals.py \
                $(addprefix tests/test_notebook.py::test_,the_cell_returns_at_once_with_the_panel_and_the_kernel_stays_free \
                    interrupting_an_idle_kernel_stops_the_run_with_an_exact_checkpoint \
                    interrupt_during_a_busy_cell_interrupts_that_cell_and_stops_the_run \
                    the_busy_notice_follows_cells_not_widget_clicks button_clicks_as_comm_messages \
                    resume_in_a_fresh_kernel_continues_the_optimizer_and_the_epoch \
                    kernel_restart_during_a_run_checkpoints_first unload_restores_what_load_changed \
                    defaults_are_configurable_with_traitlets) \
                $(addprefix tests/test_notebook_panel.py::test_,abort_asks_first_and_the_question_lapses \
                    a_finished_run_shows_its_outcome_and_checkpoints_instead_of_buttons \
                    the_output_names_its_run_for_when_the_widgets_are_gone)

$(COLAB_STAMP): $(COLAB_PINS)
	$(COLAB_PYTHON) -m venv --clear $(COLAB_VENV)
	$(COLAB_BIN)/pip install --quiet --upgrade pip
	$(COLAB_BIN)/pip install --quiet -r $(COLAB_PINS) pytest pytest-timeout pytest-xdist playwright
	touch $(COLAB_STAMP)

test-colab: wheel
	$(MAKE) --no-print-directory colab-pass

colab-pass: $(COLAB_STAMP)
	$(COLAB_BIN)/pip uninstall --yes --quiet jupyter-traincontrol
	$(COLAB_BIN)/pip install --quiet $(WHEEL_DIR)/jupyter_traincontrol-*.whl
	TRAINCONTROL_COLAB_PASS=1 $(COLAB_BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --durations=10 \
	    --confcutdir tests $(COLAB_TESTS)

## wheel: the wheel users install (`python -m build --wheel`: builds the
## JupyterLab extension with npm if its sources changed); tests/test_install.py
## installs it into a fresh venv on a PATH without Node
WHEEL_DIR ?= dist
wheel: $(STAMP)
	rm -f $(WHEEL_DIR)/jupyter_traincontrol-*.whl
	$(BIN)/python -m build --wheel --outdir $(WHEEL_DIR)

clean:
	rm -rf $(VENV) $(COLAB_VENV) build dist *.egg-info checkpoints notebooks/checkpoints test-artifacts work \
	       labextension/node_modules labextension/lib labextension/tsconfig.tsbuildinfo jupyter_traincontrol/labextension
