"""The state of the user's Keras callbacks, kept in each checkpoint and given back at a resume.

A resumed `fit` runs with fresh callback objects: without their state,
`EarlyStopping` starts its patience and its best over, and a fresh
`ModelCheckpoint(save_best_only=True)` overwrites the best model with the
first epoch it sees. So each checkpoint carries the state of the fit's
callbacks (`capture`, attached to the model part: `checkpoint.Attached`),
and a resume gives it back to the new callbacks of the same class
(`CallbackStates.apply`), after their ``on_train_begin`` has reset them.

What is kept:

- Keras's `EarlyStopping` (``wait``, ``best``, ``best_weights``,
  ``best_epoch``, ``stopped_epoch``), `ModelCheckpoint` (``best`` and its
  batch counters) and `ReduceLROnPlateau` (``wait``, ``best``,
  ``cooldown_counter``), of Keras 3 and Keras 2 (tf_keras), subclasses too;
- any callback that offers ``state_dict()`` and ``load_state_dict(state)``
  (the protocol, as PyTorch and Lightning name it): ``state_dict`` returns a
  dict of numbers, strings, None, lists and dicts of them, and numpy arrays;
  ``load_state_dict`` takes that dict back. A callback's own methods win over
  what is known of its Keras class.

Callbacks are matched by class name and by order among those of the same
class (the second `ModelCheckpoint` gets the second one's state). Keras's
callbacks that keep nothing across epochs (`History`, `TerminateOnNaN`,
`LearningRateScheduler`, ...) need nothing; any other callback is named
once, when the resume starts, as one whose state is not restored.
"""

from __future__ import annotations

import io
import json
from typing import Any, Callable, Iterable, Mapping

from ..checkpoint import read_attachment

__all__ = ["CALLBACKS_ATTACHMENT", "KEPT_ATTRIBUTES", "CallbackStates", "KeptCallbacks", "capture", "is_bookkeeping"]

#: The attachment (inside the model part) that holds the states, and the one holding their arrays.
CALLBACKS_ATTACHMENT = "callbacks.json"
_ARRAYS_ATTACHMENT = "callbacks.npz"

#: What is kept of Keras's own stateful callbacks, by class name (Keras 3 and tf_keras alike;
#: an attribute the object does not have is left out).
KEPT_ATTRIBUTES: Mapping[str, tuple[str, ...]] = {
    "EarlyStopping": ("wait", "stopped_epoch", "best", "best_weights", "best_epoch"),
    "ModelCheckpoint": ("best", "epochs_since_last_save", "_batches_seen_since_last_saving", "_last_batch_seen",
                        "_current_epoch"),
    "ReduceLROnPlateau": ("wait", "best", "cooldown_counter"),
}

#: Keras's callbacks with no state across epochs that a resume would need.
_STATELESS = frozenset({"History", "ProgbarLogger", "TerminateOnNaN", "LearningRateScheduler", "LambdaCallback",
                        "CSVLogger", "RemoteMonitor", "BackupAndRestore"})
_KERAS_MODULES = ("keras.", "tf_keras.")
_FORMAT = 1
_ARRAY_KEY = "__ndarray__"  # an array's place in the arrays attachment


def _keras_class(callback: Any) -> str | None:
    """The name of the Keras class `callback` is (or derives from), or None."""
    for cls in type(callback).__mro__:
        if cls.__module__.startswith(_KERAS_MODULES) and cls.__name__ not in ("Callback", "MonitorCallback"):
            return cls.__name__
    return None


def is_bookkeeping(callback: Any) -> bool:
    """True for Keras's own record of a `fit` (`History`, `ProgbarLogger`),
    which sees the end of an epoch a stop ended early; the user's callbacks
    do not (they see that epoch end once, in the resumed run)."""
    return _keras_class(callback) in ("History", "ProgbarLogger")


def _keys(callbacks: Iterable[Any]) -> list[tuple[str, Any]]:
    """Each callback with its key: class name and order among those of its class (``EarlyStopping#0``)."""
    seen: dict[str, int] = {}
    keyed = []
    for callback in callbacks:
        name = type(callback).__name__
        keyed.append((f"{name}#{seen.get(name, 0)}", callback))
        seen[name] = seen.get(name, 0) + 1
    return keyed


def _offers_protocol(callback: Any) -> bool:
    """True if `callback` keeps its own state: ``state_dict()`` and ``load_state_dict(state)``."""
    return callable(getattr(callback, "state_dict", None)) and callable(getattr(callback, "load_state_dict", None))


def _state_of(callback: Any) -> dict[str, Any] | None:
    """What is kept of `callback`, or None if nothing is known to keep."""
    if _offers_protocol(callback):
        state = callback.state_dict()
        if not isinstance(state, Mapping):
            raise TypeError(f"{type(callback).__name__}.state_dict() returned a {type(state).__name__}; "
                            "expected a dict.")
        return dict(state)
    attributes = KEPT_ATTRIBUTES.get(_keras_class(callback) or "")
    if attributes is None:
        return None
    return {name: getattr(callback, name) for name in attributes if hasattr(callback, name)}


def capture(callbacks: Iterable[Any], exclude: Any = None, epoch_end_pending: int | None = None) -> dict[str, Any]:
    """The attachments of a checkpoint taken now: the state of `callbacks`
    (call on the training thread, at a boundary). Arrays are encoded when
    the part is written (they are the callbacks' own copies: `EarlyStopping`
    replaces its ``best_weights``, never changes them in place).

    Args:
        callbacks: The fit's callbacks.
        exclude: One to leave out (this package's own).
        epoch_end_pending: The (zero-based) epoch whose batches are all
            trained but whose end has not run yet (a checkpoint after its
            last batch, or in its validation), or None.

    Returns:
        Attachment names to contents (or functions making them); empty if no
        callback has a state to keep.
    """
    arrays: list[Any] = []
    states = {}
    for key, callback in _keys(c for c in callbacks if c is not exclude):
        state = _state_of(callback)
        if state is not None:
            states[key] = _encoded(state, arrays)
    if not states:
        return {}
    document = json.dumps({"format": _FORMAT, "callbacks": states, "epoch_end_pending": epoch_end_pending},
                          sort_keys=True).encode()
    files: dict[str, Any] = {CALLBACKS_ATTACHMENT: document}
    if arrays:
        files[_ARRAYS_ATTACHMENT] = lambda: _npz(arrays)
    return files


def _encoded(value: Any, arrays: list[Any]) -> Any:
    """`value` as JSON holds it; each numpy array becomes ``{"__ndarray__": N}``, N its place in `arrays`."""
    if isinstance(value, Mapping):
        return {str(key): _encoded(item, arrays) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encoded(item, arrays) for item in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    shape = getattr(value, "shape", None)
    if shape == () and callable(getattr(value, "item", None)):
        return value.item()  # a numpy scalar (a metric's best)
    if shape is not None:
        import numpy as np

        arrays.append(np.asarray(value))
        return {_ARRAY_KEY: len(arrays) - 1}
    raise TypeError(f"A callback's state holds a {type(value).__name__}; expected numbers, strings, None, "
                    "lists, dicts and numpy arrays.")


def _npz(arrays: list[Any]) -> bytes:
    import numpy as np

    buffer = io.BytesIO()
    np.savez(buffer, *arrays)
    return buffer.getvalue()


class CallbackStates:
    """The callback states a checkpoint holds, to give back to a resumed fit's callbacks.

    Args:
        states: Key (``EarlyStopping#0``) to its state, arrays decoded.
        epoch_end_pending: The epoch whose end had not run when they were
            taken (see `capture`), or None.
    """

    def __init__(self, states: Mapping[str, Mapping[str, Any]], epoch_end_pending: int | None = None):
        self.states = dict(states)
        self.epoch_end_pending = epoch_end_pending

    @classmethod
    def read(cls, part) -> "CallbackStates | None":
        """The states attached to model part `part`, or None if it has none
        (a checkpoint written before callback states were kept).

        Raises:
            ValueError: If the attachment cannot be read back.
        """
        document = read_attachment(part, CALLBACKS_ATTACHMENT)
        if document is None:
            return None
        try:
            content = json.loads(document)
            arrays = _arrays(read_attachment(part, _ARRAYS_ATTACHMENT))
            states = {key: _decoded(state, arrays) for key, state in content["callbacks"].items()}
            return cls(states, content.get("epoch_end_pending"))
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as error:
            raise ValueError(f"The callback states in {part} cannot be read: {error!r}") from error

    def apply(self, callbacks: Iterable[Any], exclude: Any = None) -> tuple[list[str], list[str]]:
        """Gives each of `callbacks` its state (call after their ``on_train_begin``).

        Returns:
            ``(restored, not_restored)``: the class names of the callbacks
            whose state was given back, and of those that keep state (or
            may) but had none in the checkpoint: no protocol and not a
            known Keras class, or added since.

        Raises:
            Whatever a callback's ``load_state_dict`` raises.
        """
        restored, not_restored = [], []
        for key, callback in _keys(c for c in callbacks if c is not exclude):
            name = type(callback).__name__
            state = self.states.get(key)
            if state is None:
                if _keras_class(callback) not in _STATELESS:
                    not_restored.append(name)
                continue
            if _offers_protocol(callback):
                callback.load_state_dict(state)
            else:
                for attribute, value in state.items():
                    setattr(callback, attribute, value)
            restored.append(name)
        return restored, not_restored


def _arrays(npz: bytes | None) -> list[Any]:
    if npz is None:
        return []
    import numpy as np

    with np.load(io.BytesIO(npz), allow_pickle=False) as loaded:
        return [loaded[f"arr_{index}"] for index in range(len(loaded.files))]


def _decoded(value: Any, arrays: list[Any]) -> Any:
    if isinstance(value, dict) and set(value) == {_ARRAY_KEY} and isinstance(value[_ARRAY_KEY], int):
        return arrays[value[_ARRAY_KEY]]
    if isinstance(value, dict):
        return {key: _decoded(item, arrays) for key, item in value.items()}
    if isinstance(value, list):
        return [_decoded(item, arrays) for item in value]
    return value


class KeptCallbacks:
    """The callback states of one `fit`: captured for each of its
    checkpoints, and given back once when it resumed from one.

    Args:
        callbacks: Returns the fit's callbacks.
        exclude: One to leave out (this package's own).
        log: Logs one line for the run and the user: ``log(level, message)``.
    """

    def __init__(self, callbacks: Callable[[], Iterable[Any]], exclude: Any, log: Callable[[str, str], None]):
        self._callbacks = callbacks
        self._exclude = exclude
        self._log = log
        self._pending: CallbackStates | None = None  # read from the resumed checkpoint, not given back yet
        self._capture_failed = False

    def attachments(self, epoch_end_pending: int | None) -> dict[str, Any]:
        """What a checkpoint taken now carries (`capture`); a callback whose
        state cannot be encoded is said once, and the checkpoint is written
        without the states.

        Args:
            epoch_end_pending: The epoch whose batches are all trained and
                whose end has not run yet, or None (see `capture`).
        """
        try:
            return capture(self._callbacks(), self._exclude, epoch_end_pending)
        except (TypeError, ValueError) as error:
            if not self._capture_failed:
                self._capture_failed = True
                self._log("warning", f"Checkpoints keep no callback state: {error}")
            return {}

    def load(self, part) -> None:
        """Reads the states attached to the resumed checkpoint's model part
        `part`, to give back at the first epoch's begin (`give_back`)."""
        try:
            self._pending = CallbackStates.read(part)
        except (OSError, ValueError) as error:
            self._log("warning", f"Resume: the callbacks start afresh: {error}")
            return
        if self._pending is None:
            self._pending = CallbackStates({})  # an older checkpoint: the callbacks that keep state are named

    def give_back(self) -> None:
        """At the resumed fit's first epoch begin (every callback's
        ``on_train_begin`` has reset it): the states, once, and one line
        saying what was given back and which callbacks start afresh."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        try:
            restored, not_restored = pending.apply(self._callbacks(), self._exclude)
        except Exception as error:  # noqa: BLE001 - a user's load_state_dict: said, training goes on
            self._log("warning", f"Resume: a callback's state could not be given back: {error!r}")
            return
        if restored:
            self._log("info", f"Resume: the state of {', '.join(restored)} restored.")
        if restored and pending.epoch_end_pending is not None:
            epoch = pending.epoch_end_pending + 1
            self._log("warning", f"Resume is not exact for {', '.join(restored)}: the checkpoint was taken after "
                                 f"epoch {epoch}'s last batch, before its end, so they keep their state as of the "
                                 f"epoch before and never see epoch {epoch}'s end (its validation).")
        if not_restored:
            self._log("warning", f"Resume: the state of {', '.join(not_restored)} is not restored (the checkpoint "
                                 "holds none for it; a callback class keeps its state with state_dict() and "
                                 "load_state_dict(state)): it starts afresh.")
