"""Builds the JupyterLab extension with npm and installs it with the server config.

The metadata lives in setup.cfg. This file only adds what needs code:

- ``build_labextension`` runs ``npm ci`` and ``npm run build`` in
  ``labextension/`` when the built extension (``jupyter_traincontrol/labextension``)
  is missing or older than its sources, then lists the data files:
  ``share/jupyter/labextensions/jupyter-traincontrol/...`` and
  ``etc/jupyter/jupyter_server_config.d/jupyter_traincontrol.json`` (which
  enables the server extension). They are listed after the build, because
  files that a build creates are not there when setup.cfg is read.
- ``build_py`` (wheels), ``editable_wheel`` (``pip install -e .``) and
  ``sdist`` run it first. ``editable_wheel`` needs its own hook: a PEP 660
  editable install turns errors of a customised ``build_py`` into a warning
  and installs data files only if they were listed before it looked.

Without npm, a source tree that already holds the built extension (an sdist)
installs as it is; one without fails with a message saying what is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from setuptools import Command, setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel
from setuptools.command.sdist import sdist

HERE = Path(__file__).parent.resolve()
JS_DIR = HERE / "labextension"
BUILT_DIR = HERE / "jupyter_traincontrol" / "labextension"
LABEXTENSION_NAME = "jupyter-traincontrol"
SERVER_CONFIG = Path("jupyter-config", "jupyter_server_config.d", "jupyter_traincontrol.json")
INSTALL_JSON = {
    "packageManager": "python",
    "packageName": "jupyter-traincontrol",
    "uninstallInstructions": "Use your Python package manager (pip, conda, etc.) to uninstall the package jupyter-traincontrol",
}


def _newest_mtime(paths) -> float:
    return max((path.stat().st_mtime for path in paths if path.is_file()), default=0.0)


def _js_sources() -> list[Path]:
    sources = [JS_DIR / name for name in ("package.json", "package-lock.json", "tsconfig.json")]
    for folder in ("src", "style"):
        sources.extend(sorted((JS_DIR / folder).rglob("*")))
    return sources


def _built_files() -> list[Path]:
    return sorted(path for path in BUILT_DIR.rglob("*") if path.is_file()) if BUILT_DIR.is_dir() else []


def _is_built() -> bool:
    return (BUILT_DIR / "package.json").is_file() and any((BUILT_DIR / "static").glob("remoteEntry.*.js"))


def _data_files() -> list[tuple[str, list[str]]]:
    """The files installed outside the package, relative to this folder."""
    files: dict[str, list[str]] = {str(SERVER_CONFIG.parent).replace("jupyter-config", "etc/jupyter"): [str(SERVER_CONFIG)]}
    for path in _built_files():
        target = Path("share", "jupyter", "labextensions", LABEXTENSION_NAME, path.parent.relative_to(BUILT_DIR))
        files.setdefault(target.as_posix(), []).append(path.relative_to(HERE).as_posix())
    return sorted(files.items())


class build_labextension(Command):
    """Builds the JupyterLab extension with npm if needed, and lists the data files."""

    description = "build the JupyterLab extension (npm ci, npm run build) if its sources changed"
    user_options = [("force", "f", "build even if the built extension looks up to date")]
    boolean_options = ["force"]

    def initialize_options(self) -> None:
        self.force = False

    def finalize_options(self) -> None:
        pass

    def run(self) -> None:
        has_sources = (JS_DIR / "package.json").is_file()
        stale = not _is_built() or _newest_mtime(_js_sources()) > _newest_mtime(_built_files())
        if has_sources and (stale or self.force):
            self._npm_build()
        elif not _is_built():
            raise RuntimeError(
                f"The JupyterLab extension is not built ({BUILT_DIR} has no remoteEntry), "
                f"and there are no sources to build it from ({JS_DIR / 'package.json'} is missing)."
            )
        else:
            self.announce(f"JupyterLab extension up to date in {BUILT_DIR}", level=2)
        (BUILT_DIR / "install.json").write_text(json.dumps(INSTALL_JSON, indent=2) + "\n")
        self.distribution.data_files = _data_files()

    def _npm_build(self) -> None:
        npm = shutil.which("npm")
        if npm is None:
            if _is_built():
                self.warn(f"npm not found: installing the JupyterLab extension already built in {BUILT_DIR}, which is older than its sources.")
                return
            raise RuntimeError(
                "npm was not found on PATH. Building the JupyterLab extension of jupyter-traincontrol "
                "from source needs Node.js >= 20.19 with npm (for example `apt-get install nodejs npm`)."
            )
        lock = JS_DIR / "package-lock.json"
        installed = JS_DIR / "node_modules" / ".package-lock.json"
        if not installed.is_file() or installed.stat().st_mtime < lock.stat().st_mtime:
            self._run([npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"])
        self._run([npm, "run", "build"])
        if not _is_built():
            raise RuntimeError(f"`npm run build` succeeded but {BUILT_DIR} holds no built extension.")

    def _run(self, argv: list[str]) -> None:
        self.announce(f"running {' '.join(argv)} in {JS_DIR}", level=2)
        try:
            subprocess.run(argv, cwd=JS_DIR, check=True)
        except subprocess.CalledProcessError as error:
            raise RuntimeError(f"Building the JupyterLab extension failed: `{' '.join(argv)}` exited with {error.returncode}.") from None


class build_py_with_labextension(build_py):
    def run(self) -> None:
        self.run_command("build_labextension")
        super().run()


class editable_wheel_with_labextension(editable_wheel):
    def run(self) -> None:
        self.run_command("build_labextension")
        # setuptools' editable_wheel installs each category X only if the
        # distribution has `has_X`: for data files it asks `has_data`, which
        # does not exist (the method is `has_data_files`), so it skips them
        # without a word. Give it the method, and check the wheel after.
        self.distribution.has_data = self.distribution.has_data_files
        super().run()
        self._check_data_files_in_wheel()

    def _check_data_files_in_wheel(self) -> None:
        import zipfile

        wheels = sorted(Path(self.dist_dir).glob("*.editable-*.whl"), key=lambda path: path.stat().st_mtime)
        if not wheels:
            raise RuntimeError(f"editable_wheel made no wheel in {self.dist_dir}.")
        with zipfile.ZipFile(wheels[-1]) as wheel:
            names = wheel.namelist()
        expected = [
            f"share/jupyter/labextensions/{LABEXTENSION_NAME}/package.json",
            "etc/jupyter/jupyter_server_config.d/jupyter_traincontrol.json",
        ]
        missing = [name for name in expected if not any(entry.endswith(".data/data/" + name) for entry in names)]
        if missing:
            raise RuntimeError(f"The editable wheel {wheels[-1].name} lacks {missing}; this setuptools skipped the data files.")


class sdist_with_labextension(sdist):
    def run(self) -> None:
        self.run_command("build_labextension")
        super().run()


setup(
    data_files=_data_files(),
    cmdclass={
        "build_labextension": build_labextension,
        "build_py": build_py_with_labextension,
        "editable_wheel": editable_wheel_with_labextension,
        "sdist": sdist_with_labextension,
    },
)
