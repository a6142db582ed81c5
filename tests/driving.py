"""Driving a real `fit` in the tests: one tiny training, and a script that commands it.

- `fit`: a model on `tiny_data`, 8 batches an epoch, no shuffle, quiet.
- `guarded`: runs a function for the test's main thread to check, ending
  a held fit if it fails (so a failure shows as itself, not as a hang).
- `drive_fit`: `fit` while a script drives it from another thread, from
  the first batch on.
- `inject`: a command queued at a chosen batch; `LearningRates`: the
  learning rate at every batch (`lr_of`).
"""

from __future__ import annotations

import threading
from typing import Callable

from helpers import At, wait_until

#: `tiny_data` has 64 samples: 8 batches an epoch.
BATCH = 8


def fit(model, data, *callbacks, epochs=3, **kwargs):
    """`model.fit` on `data` with `callbacks`, 8 batches an epoch, no shuffle (unless given), quiet."""
    x, y = data
    kwargs.setdefault("shuffle", False)
    return model.fit(x, y, batch_size=BATCH, epochs=epochs, callbacks=list(callbacks), verbose=0, **kwargs)


def abort_run(control) -> None:
    """Queues ``abort`` for a `ControlCallback`'s run, if it still listens."""
    channel = control.lifecycle.channel
    if channel is not None:
        channel.inject("abort")


def guarded(function: Callable[[], None], errors: list, unblock: Callable[[], None] | None = None) -> None:
    """Runs `function`, keeping what it raised in `errors` for the test's
    main thread; then calls `unblock` (so a fit held for `function` ends)."""
    try:
        function()
    except BaseException as error:  # reported by the test's main thread
        errors.append(error)
        if unblock is not None:
            unblock()


def drive_fit(model, data, control, script, *, epochs=100_000, callbacks=()):
    """Runs `fit` while `script(control)` drives it from another thread.

    The script starts at the first batch (the FIFO exists by then) and must
    end the fit (``stop`` or ``abort``). If it fails, the fit is aborted and
    its error re-raised here.

    Returns:
        The `History` of the fit.
    """
    errors = []

    def start(_callback):
        threading.Thread(target=guarded, args=(lambda: script(control), errors, lambda: abort_run(control)),
                         name="test-driver", daemon=True).start()

    history = fit(model, data, control, *callbacks, At(0, 0, start), epochs=epochs)
    wait_until(lambda: not [t for t in threading.enumerate() if t.name == "test-driver"], message="the driver to end")
    if errors:
        raise errors[0]
    return history


def inject(control, line, epoch, batch):
    """An `At` that queues `line` at the start of (epoch, batch): the run applies it at that batch's end."""
    from jupyter_traincontrol.protocol import parse_request

    return At(epoch, batch, lambda cb: control.lifecycle.channel.inject(parse_request(line)), hook="on_train_batch_begin")


def lr_of(model) -> float:
    """The model's optimizer's learning rate now."""
    import keras

    return float(keras.ops.convert_to_numpy(model.optimizer.learning_rate))


class LearningRates:
    """A callback that reads the learning rate at the start of every batch (its ``rates``)."""

    def __new__(cls):
        import keras

        class _LearningRates(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.rates = []

            def on_train_batch_begin(self, batch, logs=None):
                self.rates.append(lr_of(self.model))

        return _LearningRates()
