"""The mime type by which a cell's output names its run, for when the panel's widgets are gone.

A ``%%interruptible_fit`` cell's output holds the panel's widget view, its
text, and ``application/vnd.jupyter-traincontrol.run+json``: the run's name,
this instance's id and its checkpoint folder. Widgets live only as long as
their kernel: after a kernel restart ipywidgets leaves the panel at its
last state under broken-link icons, and in a notebook reopened later it
says "model not found". The output itself is saved with the notebook, so
the JupyterLab extension finds the run there (by its ``run_id``) and shows
it as the server records it: how it ended, and its checkpoints. Front ends
that do not know the type (classic Notebook, nbconvert) ignore it.

Example:

>>> run_reference("mnist", "5f0c", "checkpoints/mnist")["name"]
'mnist'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Collection

if TYPE_CHECKING:
    from ..run import RunLifecycle

__all__ = ["RUN_MIME_TYPE", "run_reference", "with_run_reference"]

RUN_MIME_TYPE = "application/vnd.jupyter-traincontrol.run+json"


def run_reference(name: str | None, run_id: str | None, checkpoint_dir: str | None) -> dict[str, Any]:
    """The data of `RUN_MIME_TYPE`: which run an output shows.

    Args:
        name: The run's name.
        run_id: This instance of it (its record's and its checkpoints' ``run_id``).
        checkpoint_dir: Its checkpoint folder, for when the server lists it no more.
    """
    return {"name": name, "run_id": run_id, "checkpoint_dir": checkpoint_dir, "version": 1}


def with_run_reference(bundle: dict, lifecycle: RunLifecycle, include: Collection[str] | None = None,
                       exclude: Collection[str] | None = None) -> dict:
    """`bundle` (a run's mime bundle) with `RUN_MIME_TYPE` added, unless
    `include` leaves it out or `exclude` names it (``_repr_mimebundle_``'s
    arguments)."""
    if (include is None or RUN_MIME_TYPE in include) and not (exclude and RUN_MIME_TYPE in exclude):
        store = lifecycle.store
        bundle[RUN_MIME_TYPE] = run_reference(lifecycle.name, lifecycle.run_id,
                                              str(store.directory) if store is not None else None)
    return bundle
