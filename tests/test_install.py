"""The install: the prebuilt JupyterLab extension and the server extension are enabled.

`pip install -e .` (what `make setup` runs) must leave both enabled, and a
wheel must carry them, so that users install with pip alone. Each Jupyter
command runs with empty private config and data folders, so only what the
install put into this environment counts.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import jupyter_traincontrol
from helpers import REPO

BIN = Path(sys.executable).parent
ANSI = re.compile(r"\x1b\[[0-9;]*m")
PACKAGE_BUILD = Path(jupyter_traincontrol.__file__).parent / "labextension"


def jupyter(tmp_path, *args: str) -> str:
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTER_DATA_DIR": str(tmp_path / "data")}
    result = subprocess.run([str(BIN / "jupyter"), *args], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    return ANSI.sub("", result.stdout + result.stderr)


def test_the_labextension_is_installed_and_enabled(tmp_path):
    listing = jupyter(tmp_path, "labextension", "list")
    version = jupyter_traincontrol.__version__
    assert re.search(rf"jupyter-traincontrol v{re.escape(version)} enabled\s+OK \(python, jupyter-traincontrol\)", listing), listing


def test_the_server_extension_is_installed_and_enabled(tmp_path):
    listing = jupyter(tmp_path, "server", "extension", "list")
    assert re.search(r"^\s*jupyter_traincontrol enabled\s*$", listing, re.MULTILINE), listing
    assert re.search(rf"jupyter_traincontrol {re.escape(jupyter_traincontrol.__version__)} OK", listing), listing


def test_the_installed_labextension_is_the_current_build():
    (point,) = jupyter_traincontrol._jupyter_labextension_paths()
    assert (Path(jupyter_traincontrol.__file__).parent / point["src"]) == PACKAGE_BUILD
    installed = Path(sys.prefix, "share", "jupyter", "labextensions", point["dest"])
    built = json.loads((PACKAGE_BUILD / "package.json").read_text())
    assert json.loads((installed / "package.json").read_text()) == built
    assert built["jupyterlab"]["_build"]["load"].startswith("static/remoteEntry.")
    assert (installed / built["jupyterlab"]["_build"]["load"]).is_file()


def test_a_wheel_carries_the_built_extension_and_the_server_config(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(tmp_path), str(REPO)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    (wheel,) = tmp_path.glob("jupyter_traincontrol-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    data = f"jupyter_traincontrol-{jupyter_traincontrol.__version__}.data/data/"
    for expected in (
        data + "etc/jupyter/jupyter_server_config.d/jupyter_traincontrol.json",
        data + "share/jupyter/labextensions/jupyter-traincontrol/package.json",
        data + "share/jupyter/labextensions/jupyter-traincontrol/install.json",
        "jupyter_traincontrol/labextension/package.json",
        "jupyter_traincontrol/control/server/handlers.py",
    ):
        assert expected in names, f"{expected} not in {wheel.name}"
    assert any(name.startswith(data + "share/jupyter/labextensions/jupyter-traincontrol/static/remoteEntry.") for name in names)
