"""Which resume a `fit` makes: from its own run's checkpoints, from another
run's (``resume_from=``), or a Keras 2 one (epoch and batch only).

`start_resume` chooses by what the user asked and what the model is, and
returns the resumption made (`resumption.Resumption`; a Keras 2 one is the
same resume, of kind `keras2.KERAS2`).
"""

from __future__ import annotations

import os
from typing import Callable

from ...checkpoint import CheckpointStore, SkippedCheckpoint
from .. import keras2
from .data_order import DataOrder
from .resumption import Resumption, resume_from_latest, resume_from_source
from .sources import ResumeSourceError, find_source

__all__ = ["start_resume"]


def start_resume(model, store: CheckpointStore, *, is_keras2: bool, resume_from: "str | os.PathLike | None",
                 data_order: DataOrder | None, on_skip: Callable[[SkippedCheckpoint], None],
                 on_skipped: Callable[[], None]) -> Resumption:
    """Loads the checkpoint a `fit` continues from into `model` and positions `fit` there.

    Args:
        model: The model being trained.
        store: The run's checkpoints.
        is_keras2: The model is a Keras 2 (tf_keras) one.
        resume_from: Another run's name, or a checkpoint file; None: this
            run's own newest checkpoint.
        data_order: The fit's data-order counts (Keras 3), or None.
        on_skip: Called for each newer checkpoint that did not load.
        on_skipped: Called once the batches already trained are drawn.

    Raises:
        ResumeSourceError: If `resume_from` names nothing that loads, or is
            given for a Keras 2 model.
    """
    if is_keras2:
        if resume_from is not None:
            raise ResumeSourceError(f"resume_from={str(resume_from)!r}: a Keras 2 (tf_keras) fit resumes only "
                                    "its own run's checkpoints (resume=True).")
        return resume_from_latest(model, store, on_skip=on_skip, on_skipped=on_skipped, kind=keras2.KERAS2)
    if resume_from is not None:  # another run's checkpoints, or a file: found, or `fit` fails saying what was
        return resume_from_source(model, find_source(resume_from, store.directory), on_skip=on_skip,
                                  data_order=data_order, on_skipped=on_skipped)
    return resume_from_latest(model, store, on_skip=on_skip, data_order=data_order, on_skipped=on_skipped)
