"""Where Keras calls the batch-end hooks of one `fit`: on its thread pool, or on the training thread.

On backends Keras marks thread-safe (JAX, torch), `fit` hands the
batch-end hooks to a thread pool while the next step trains, when every
callback allows it (``async_safe``); `ControlCallback` does. The training
thread then never waits for a step's logs: no host sync per step. But a
command must act between two steps on the training thread (``stop`` sets
``stop_training`` after step N, which the trainer checks right after its
batch-end hook; a checkpoint reads the variables of step N; ``pause``
holds the training thread itself). So while a command waits, `hold`
switches Keras's dispatch of this `fit` to synchronous (the flags Keras's
`CallbackList` reads at every batch end, set through
`keras_internals.set_batch_end_dispatch`): the next batch-end hooks run on
the training thread, where the command acts, and `release` switches back
once nothing waits. Any thread may `hold` (the run's thread when a
command arrives, the checkpoint writer when saves wait for it, a pool
thread that saw a loss that is not finite); only the training thread
`release`s, and re-holds at once if something came meanwhile.

Before a command acts there, `flush` waits for the hooks of earlier steps
still on the pool (each waits for its own step's logs, which the step in
hand has already made), so everything up to this step has been seen: its
losses checked, its progress counted.

`find` gets the `CallbackList` of the `fit` from the stack (the frame that
calls ``on_train_begin``); a `fit` driven without one (hooks called by
hand) has nothing to switch, and every hook runs where its caller runs it.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from ..state import keras_internals
from ..system.frames import find_caller

__all__ = ["BatchDispatch"]


class BatchDispatch:
    """Switches one `fit`'s batch-end hooks between Keras's pool and the training thread.

    Args:
        callbacks: The `fit`'s `keras.callbacks.CallbackList`, or None.

    Attributes:
        callback_list: That `CallbackList`, or None.
    """

    def __init__(self, callbacks=None):
        self.callback_list = callbacks
        self._flags = keras_internals.batch_end_dispatch(callbacks)  # (train_async, test_async)
        self.owner = threading.get_ident()
        self.held = False

    @classmethod
    def find(cls) -> "BatchDispatch":
        """The dispatch of the `fit` whose ``on_train_begin`` calls the caller."""
        frame = find_caller(lambda f: f.f_code.co_name == "on_train_begin"
                            and _is_callback_list(f.f_locals.get("self")), depth=2)
        return cls(frame.f_locals["self"] if frame is not None else None)

    @property
    def asynchronous(self) -> bool:
        """True if Keras would call some batch-end hooks on its pool."""
        return any(self._flags)

    def on_training_thread(self) -> bool:
        """True on the thread that runs `fit`."""
        return threading.get_ident() == self.owner

    def hold(self) -> None:
        """Until `release`: every batch-end hook on the training thread. Any thread; cheap."""
        if self._flags[0] or self._flags[1]:
            self.held = True
            keras_internals.set_batch_end_dispatch(self.callback_list, train_async=False, test_async=False)

    def release(self, still_wanted: Callable[[], bool]) -> None:
        """Training thread: Keras's own dispatch again, unless `still_wanted()`
        says something came meanwhile (then held again)."""
        if not self.held:
            return
        self.held = False
        self._put_back_flags()
        if still_wanted():
            self.hold()

    def flush(self) -> None:
        """Training thread: waits for the batch-end hooks still on the pool."""
        if self.asynchronous:
            keras_internals.flush_pending_batch_ends(self.callback_list)

    def restore(self) -> None:
        """Puts Keras's own dispatch back (the `fit` ends). Idempotent."""
        if self.callback_list is not None:
            self.held = False
            self._put_back_flags()

    def _put_back_flags(self) -> None:
        train_async, test_async = self._flags
        keras_internals.set_batch_end_dispatch(self.callback_list, train_async=train_async, test_async=test_async)


def _is_callback_list(value: Any) -> bool:
    """True for a Keras `CallbackList` (Keras 3's or Keras 2's, tf_keras)."""
    return any(cls.__name__ == "CallbackList" and cls.__module__.startswith(("keras.", "tf_keras."))
               for cls in type(value).__mro__)
