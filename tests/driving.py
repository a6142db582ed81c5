"""Driving a real `fit` in the tests: one tiny training, and a script that commands it.

- `fit`: a model on `tiny_data`, 8 batches an epoch, no shuffle, quiet.
- `guarded`: runs a function for the test's main thread to check, ending
  a held fit if it fails (so a failure shows as itself, not as a hang).
- `drive_fit`: `fit` while a script drives it from another thread, from
  the first batch on.
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
