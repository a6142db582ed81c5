"""jupyter-traincontrol: stop, save, abort, pause and resume Keras training gracefully.

Public names are imported lazily, so that ``jupyter-traincontrol`` (the CLI)
and the Jupyter server extension start without importing Keras. The
``_jupyter_*`` functions are the entry points by which Jupyter finds the
server extension (`jupyter_traincontrol.server`) and the prebuilt JupyterLab
extension (``jupyter_traincontrol/labextension``).

The package's folders are its layers, each importing only from those below
it (checked by ``lint-imports``): ``protocol`` < ``system`` < ``transport``,
``registry`` < ``checkpoint`` < ``run``, ``control``, ``state`` <
``boundary``, ``job`` < ``fit``, ``loop`` < ``notebook``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"

__all__ = [
    "ControlCallback",
    "TrainLoop",
    "RunLifecycle",
    "CheckpointStore",
    "TrainingRun",
    "send",
    "list_runs",
    "runs",
    "load_ipython_extension",
    "unload_ipython_extension",
    "__version__",
]

if TYPE_CHECKING:  # pragma: no cover
    from .checkpoint import CheckpointStore
    from .fit.callback import ControlCallback
    from .loop.train_loop import TrainLoop
    from .run.lifecycle import RunLifecycle

_LAZY = {
    "ControlCallback": ("fit.callback", "ControlCallback"),
    "TrainLoop": ("loop.train_loop", "TrainLoop"),
    "RunLifecycle": ("run.lifecycle", "RunLifecycle"),
    "CheckpointStore": ("checkpoint", "CheckpointStore"),
    "send": ("control.client", "send"),
    "list_runs": ("registry", "list_runs"),
    "TrainingRun": ("notebook.run", "TrainingRun"),
    "runs": ("notebook.run", "all_runs"),
}


def _jupyter_server_extension_points() -> list[dict]:
    """Where Jupyter Server finds the extension (imported only by the server)."""
    from .server import TrainControlApp

    return [{"module": "jupyter_traincontrol.server", "app": TrainControlApp}]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """Where JupyterLab finds the prebuilt extension, relative to this package."""
    return [{"src": "labextension", "dest": "jupyter-traincontrol"}]


def load_ipython_extension(shell) -> None:
    """``%load_ext jupyter_traincontrol``: the magic and kernel-interrupt handling."""
    from .notebook.extension import load

    load(shell)


def unload_ipython_extension(shell) -> None:
    """``%unload_ext jupyter_traincontrol``: stop active runs, remove every hook."""
    from .notebook.extension import unload

    unload(shell)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module_name, attribute = _LAZY[name]
        value = getattr(importlib.import_module(f".{module_name}", __name__), attribute)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
