"""Installed into Colab's runtime, the package upgrades nothing there.

`make test-colab` builds .venv-colab with exactly the versions of
tests/colab-pins.txt (Colab's ipykernel, IPython, ipywidgets 7, Keras,
TensorFlow, ...), then installs the wheel into it with its dependencies, as
``pip install jupyter-traincontrol`` would in Colab. Run there
(``TRAINCONTROL_COLAB_PASS=1``), these tests check that every pin is still
what it was, and that the package is the wheel's. Anywhere else they are
skipped: the main venv tests the newest versions.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution, version
from pathlib import Path

import pytest

PINS_FILE = Path(__file__).parent / "colab-pins.txt"

pytestmark = pytest.mark.skipif(
    os.environ.get("TRAINCONTROL_COLAB_PASS") != "1", reason="the Colab pass only (make test-colab, in .venv-colab)"
)


def colab_pins() -> dict[str, str]:
    """The pins of tests/colab-pins.txt: package name to version."""
    pins = {}
    for line in PINS_FILE.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, pinned = line.split("==")
            pins[name.strip()] = pinned.strip()
    return pins


def test_the_pins_file_names_colabs_runtime():
    assert {"ipykernel", "ipython", "ipywidgets", "widgetsnbextension", "notebook", "jupyter_client", "traitlets",
            "keras", "tensorflow"} == set(colab_pins())


def test_installing_the_wheel_upgraded_none_of_the_pins():
    found = {}
    for name in colab_pins():
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    assert found == colab_pins()


def test_the_package_is_the_wheels_and_its_requirements_are_met():
    import jupyter_traincontrol

    installed = distribution("jupyter-traincontrol")
    assert installed.version == jupyter_traincontrol.__version__
    assert '"editable": true' not in (installed.read_text("direct_url.json") or "")  # the wheel, not `pip install -e`
    check = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
