"""The install: the prebuilt JupyterLab extension and the server extension are enabled.

`pip install -e .` (what `make setup` runs) must leave both enabled, and a
wheel must carry them, so that users install with pip alone. Each Jupyter
command runs with empty private config and data folders, so only what the
install put into this environment counts.

The wheel CI builds (``python -m build --wheel``; `make test` passes it as
``JUPYTER_TRAINCONTROL_WHEEL``, else this test builds one) is installed
into a fresh venv, on a PATH without Node: the magic loads and trains, and
both extensions are listed enabled. Its dependencies are not downloaded
again (TensorFlow alone is hundreds of MB): the fresh venv sees this test
venv's site-packages through a ``.pth`` line, after its own, and the wheel
is installed with ``--no-deps``. So the test checks what the wheel itself
brings (the package, its console script, the prebuilt labextension and the
server config in the venv's own prefix) and that its declared requirements
are met by what they name (``pip check``), not that PyPI serves them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
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


def _the_wheel(tmp_path) -> Path:
    """The wheel CI built, or one built now as CI does."""
    given = os.environ.get("JUPYTER_TRAINCONTROL_WHEEL")
    if given:
        return Path(given)
    result = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path / "dist"), str(REPO)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("jupyter_traincontrol-*.whl")
    return wheel


_LOAD_AND_TRAIN = """
import json, numpy as np, keras
from IPython.testing.globalipapp import start_ipython
shell = start_ipython()
shell.run_line_magic("load_ext", "jupyter_traincontrol")
import jupyter_traincontrol
x = np.random.default_rng(0).random((32, 3), dtype="float32")
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
model.compile("adam", "mse")
shell.user_ns.update(model=model, x=x, y=x.sum(1, keepdims=True))
shell.run_cell_magic("interruptible_fit", "--name wheel --wait", "history = model.fit(x, y, epochs=2, verbose=0)")
run = jupyter_traincontrol.runs()[-1]
print("RESULT " + json.dumps([jupyter_traincontrol.__file__, str(run.state), len(run.checkpoints)]))
"""


def test_the_wheel_installs_into_a_fresh_venv_without_node_with_both_extensions_enabled(tmp_path):
    wheel = _the_wheel(tmp_path)
    metadata = zipfile.ZipFile(wheel).read(f"jupyter_traincontrol-{jupyter_traincontrol.__version__}.dist-info/METADATA")
    requires = [line.split(":", 1)[1].strip() for line in metadata.decode().splitlines() if line.startswith("Requires-Dist:")]
    assert {"tensorflow>=2.20", "keras>=3.13", "ipywidgets>=7.7.1", "ipython>=7.34"} <= set(requires)  # Colab's
    assert not [r for r in requires if r.startswith(("jupyterlab", "jupyter_server", "jupyter-server")) and "extra ==" not in r]
    assert any(r.startswith("jupyterlab") and 'extra == "lab"' in r for r in requires), requires

    started = time.monotonic()
    venv = tmp_path / "venv"
    # No system site-packages, and no pip of its own: this venv's pip installs into it (`pip --python`).
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    env = {"PATH": str(venv / "bin"), "HOME": str(tmp_path / "home"), "LANG": "C.UTF-8", "KERAS_BACKEND": "tensorflow",
           "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTER_DATA_DIR": str(tmp_path / "data"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "JUPYTER_PLATFORM_DIRS": "1"}
    assert shutil.which("node", path=env["PATH"]) is None and shutil.which("npm", path=env["PATH"]) is None

    def run(*argv, **kwargs) -> str:
        result = subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=env, cwd=tmp_path,
                                timeout=300, **kwargs)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
        return ANSI.sub("", result.stdout + result.stderr)

    own_site = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip()
    Path(own_site, "test-venv-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = (sys.executable, "-m", "pip", "--python", python)
    run(*pip, "install", "--quiet", "--no-deps", "--no-index", wheel)
    installed = time.monotonic() - started
    run(*pip, "check")  # every requirement the wheel declares is met

    version = re.escape(jupyter_traincontrol.__version__)
    labextensions = run(python, "-m", "jupyterlab.labextensions", "list")
    assert re.search(rf"jupyter-traincontrol v{version} enabled\s+OK \(python, jupyter-traincontrol\)", labextensions), labextensions
    assert str(venv / "share" / "jupyter" / "labextensions") in labextensions  # the wheel's, in the venv's prefix
    servers = run(python, "-m", "jupyter_server.extension.serverextension", "list")
    assert re.search(r"^\s*jupyter_traincontrol enabled\s*$", servers, re.MULTILINE), servers
    assert re.search(rf"jupyter_traincontrol {version} OK", servers), servers

    (result,) = [json.loads(line[7:]) for line in run(python, "-c", _LOAD_AND_TRAIN).splitlines() if line.startswith("RESULT ")]
    assert result[0].startswith(own_site)  # the wheel's package, not this checkout's
    assert result[1:] == ["finished", 1]  # and its end checkpoint
    (listed,) = json.loads(run(venv / "bin" / "jupyter-traincontrol", "list", "--all", "--json"))
    assert (listed["name"], listed["state"], listed["end_reason"]) == ("wheel", "finished", "finished")
    print(f"fresh venv and wheel installed in {installed:.1f} s; whole check {time.monotonic() - started:.1f} s")


def test_make_lab_runs_the_headless_demo_the_first_time_only(tmp_path):
    venv = tmp_path / "venv"

    def planned(target: str) -> str:
        result = subprocess.run(["make", "-n", target, f"VENV={venv}"], capture_output=True, text=True, cwd=REPO,
                                timeout=60)
        assert result.returncode == 0, result.stderr
        return result.stdout

    first = planned("lab")  # a fresh machine: set up, the demo, then JupyterLab
    assert "pip install" in first and "jupyter lab quickstart.ipynb" in first, first
    assert first.index("pip install") < first.index("examples/notebook_demo.py") < first.index(
        "examples/script_demo.py") < first.index("jupyter lab quickstart.ipynb"), first

    venv.mkdir()
    for stamp in (".installed", ".demo-ran"):  # what `make setup` and `make demo` leave
        (venv / stamp).touch()
    again = planned("lab")
    assert "jupyter lab quickstart.ipynb" in again and "demo.py" not in again and "pip install" not in again, again
    assert "examples/notebook_demo.py" in planned("demo")  # the demo stays, on its own
