"""The random state that decides a run's future, captured into checkpoints and restored.

A seeded run (``keras.utils.set_random_seed``) is deterministic only if a
resumed run draws the same random numbers from the same point on. A
checkpoint therefore carries, in its sidecar's ``resume_state`` field:

- ``epoch_start``: Python's and numpy's global random state and the
  backend's global generator (torch), as they were when the epoch in
  progress began. With numpy input and ``shuffle=True``, the JAX and torch
  backends draw the epoch's order from these right after the epoch begins,
  so restoring them before the resumed epoch rebuilds that order; the
  batches already trained are then skipped (`batch_skipper.BatchSkipper`).
- ``now``: the same global states at the checkpoint's boundary, put back
  once the resumed epoch's already-trained batches are skipped.
- ``seed_generators``: the state of Keras's `SeedGenerator`s at the
  checkpoint's boundary: every one of the model's layers (dropout, noise)
  and the global one (`keras.random` ops without a seed).

Version 1 of the field: ``{"version": 1, "epoch": E, "epoch_start":
{"python": [...], "numpy": [...], "torch": "base64"}, "now": (the same),
"seed_generators":
{"model": [[int, ...], ...], "global": [int, ...] or null}}``. A field that
is missing, of another version or malformed makes the resume inexact, and
the resume says so.

What is not covered here: a `tf.data` pipeline's own shuffle state (it
depends on how many iterators of it were opened) and a torch loader's own
generator, which the drivers keep (`fit.resume.data_order`,
`loop.data_sources`); an unseeded shuffle, a plain Python generator, and
random state that user code keeps elsewhere.

A custom loop restores the parts at their own moments: the global states
of the epoch's start before the epoch's first line
(`restore_epoch_start`), the seed generators and the global states of
the checkpoint's boundary once the items already trained are drawn
(`restore_seed_generators`, `restore_now`); `fit` restores both at once
(`restore`).
"""

from __future__ import annotations

import base64
import random
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from . import keras_internals
from .frozen import Late

__all__ = ["RESUME_STATE_VERSION", "CapturedState", "EpochStart", "KeptEpochStart", "capture_epoch_start", "capture",
           "kept_epoch_start", "restore", "restore_epoch_start", "restore_now", "restore_seed_generators"]

RESUME_STATE_VERSION = 2
_READABLE_VERSIONS = (1, 2)


class EpochStart:
    """The global random states as an epoch began: taken as they are (a
    copy of each, tens of microseconds), packed into a sidecar's form only
    when a checkpoint needs them (`packed`)."""

    __slots__ = ("_python", "_numpy", "_torch")

    def __init__(self):
        import numpy as np

        self._python = random.getstate()
        self._numpy = np.random.get_state()
        self._torch = _torch_generator_state()

    def packed(self) -> dict[str, Any]:
        """The states as ``resume_state`` holds them (a few KB of JSON)."""
        import numpy as np

        version, internal, gauss = self._python
        kind, keys, pos, has_gauss, cached = self._numpy
        state: dict[str, Any] = {
            "python": [version, _packed(np.array(internal, dtype=np.uint32)), gauss],
            "numpy": [kind, _packed(keys.astype(np.uint32)), int(pos), int(has_gauss), float(cached)],
        }
        if self._torch is not None:
            state["torch"] = base64.b64encode(self._torch.numpy().tobytes()).decode("ascii")
        return state


class KeptEpochStart:
    """An epoch's start state as a checkpoint holds it (``resume_state["epoch_start"]``):
    what a resumed epoch's later checkpoints keep as its start."""

    __slots__ = ("_packed",)

    def __init__(self, packed: dict[str, Any]):
        self._packed = packed

    def packed(self) -> dict[str, Any]:
        """The states as ``resume_state`` holds them (as read from the checkpoint)."""
        return self._packed


def capture_epoch_start() -> EpochStart:
    """The global random states as an epoch begins (cheap: see `EpochStart`)."""
    return EpochStart()


def kept_epoch_start(state: Any, epoch: int) -> KeptEpochStart | None:
    """The start state of `epoch` that a checkpoint's ``resume_state`` holds,
    or None if it holds none for that epoch (an older or malformed one)."""
    if not isinstance(state, Mapping) or state.get("version") not in _READABLE_VERSIONS or state.get("epoch") != epoch:
        return None
    epoch_start = state.get("epoch_start")
    return KeptEpochStart(epoch_start) if isinstance(epoch_start, dict) else None


def capture(model, epoch: int, epoch_start: "EpochStart | None",
            data: dict[str, Any] | None = None) -> Mapping[str, Any]:
    """The ``resume_state`` of a checkpoint taken now (on the training
    thread, the model's state synced at this boundary). The states are
    taken now and packed when first read (`CapturedState`): by the
    checkpoint's writer, off the training thread.

    Args:
        model: The Keras model being trained (its seed generators are
            kept), or None (a custom loop's own state: the global random
            states only).
        epoch: The epoch a resume continues in (`TrainingPosition.resume_epoch`).
        epoch_start: `capture_epoch_start` as that epoch began, or None if
            it has not begun (the checkpoint ends an epoch): then the state
            now is that start.
        data: `data_order.DataOrder.state` for that epoch, or None.
    """
    now = EpochStart()  # the global random states as they are now
    # A custom loop without Keras: nothing to keep, and nothing imported.
    model_generators, global_generator = ([], None) if "keras" not in sys.modules else \
        keras_internals.seed_generators(model, create_global=False)
    seed_generators = {
        "model": [Late(sg.state, _int_list) for sg in model_generators],
        "global": Late(global_generator.state, _int_list) if global_generator is not None else None,
    }
    return CapturedState(epoch, epoch_start, now, seed_generators, data)


class CapturedState(Mapping):
    """A ``resume_state`` as `capture` took it: its global random states
    are packed into the sidecar's form (base64 text, 50-100 us on the
    benchmark machine) and its seed generators' states brought to the host
    (`frozen.Late`) when a field is first read, not when it is taken.
    Every value was copied or frozen when taken, so packing later gives the same."""

    def __init__(self, epoch: int, epoch_start: "EpochStart | None", now: "EpochStart",
                 seed_generators: dict[str, Any], data: dict[str, Any] | None):
        self._taken = (epoch, epoch_start, now, seed_generators, data)
        self._fields: dict[str, Any] | None = None

    def _packed(self) -> dict[str, Any]:
        if self._fields is None:  # two threads reading at once would pack the same twice
            epoch, epoch_start, now, seed_generators, data = self._taken
            packed_now = now.packed()
            self._fields = {
                "version": RESUME_STATE_VERSION,
                "epoch": epoch,
                "epoch_start": epoch_start.packed() if epoch_start is not None else packed_now,
                "now": packed_now,
                "seed_generators": {
                    "model": [late.value() for late in seed_generators["model"]],
                    "global": seed_generators["global"].value() if seed_generators["global"] is not None else None,
                },
                "data": data,
            }
        return self._fields

    def __getitem__(self, key: str) -> Any:
        return self._packed()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._packed())

    def __len__(self) -> int:
        return len(self._packed())


def restore(model, state: Any, epoch: int) -> str | None:
    """Puts back the random state of a checkpoint for a resume at `epoch`:
    its seed generators (`restore_seed_generators`), then the global states
    of the epoch's start (`restore_epoch_start`).

    Returns:
        None if everything was restored, else one sentence saying what was
        not (and so what may differ from an uninterrupted run).
    """
    return restore_seed_generators(model, state) or restore_epoch_start(state, epoch)


def restore_seed_generators(model, state: Any) -> str | None:
    """Puts back the Keras seed generators (the model's, the global one) as
    they were at the checkpoint's boundary.

    Returns:
        None, or one sentence saying what was not restored.
    """
    if not _readable(state):
        return _NO_STATE
    try:
        generators = state["seed_generators"]
        model_generators, global_generator = ([], None) if model is None and generators["global"] is None else \
            keras_internals.seed_generators(model, create_global=generators["global"] is not None)
        if len(generators["model"]) != len(model_generators):
            return "the model's random generators do not match the checkpoint's: dropout may differ"
        for sg, values in zip(model_generators, generators["model"]):
            sg.state.assign(_as_state(values, sg.state))
        if generators["global"] is not None:
            global_generator.state.assign(_as_state(generators["global"], global_generator.state))
    except (KeyError, TypeError, ValueError) as error:
        return f"the checkpoint's random state could not be restored ({error}): the data order may differ"
    return None


def restore_epoch_start(state: Any, epoch: int) -> str | None:
    """Puts back the global random states (Python, NumPy, torch) as they
    were when `epoch` began, before its first line ran.

    Returns:
        None, or one sentence saying what was not restored.
    """
    if not _readable(state):
        return _NO_STATE
    epoch_start = state.get("epoch_start")
    if state.get("epoch") != epoch or not isinstance(epoch_start, dict):
        return "the checkpoint holds no random state for this epoch's start: its data order may differ"
    try:
        _restore_epoch_start(epoch_start)
    except (KeyError, TypeError, ValueError) as error:
        return f"the checkpoint's random state could not be restored ({error}): the data order may differ"
    return None


_NO_STATE = ("the checkpoint holds no random state (an older one): shuffling and dropout may differ from an "
             "uninterrupted run")


def _readable(state: Any) -> bool:
    return isinstance(state, dict) and state.get("version") in _READABLE_VERSIONS


def restore_now(state: Any) -> None:
    """Puts back the global random states as they were at the checkpoint's
    boundary: called once the already-trained batches of the resumed epoch
    were skipped (torch's unseeded dropout draws from its global generator)."""
    if isinstance(state, dict) and isinstance(state.get("now"), dict):
        _restore_epoch_start(state["now"])


def _restore_epoch_start(state: dict[str, Any]) -> None:
    import numpy as np

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(int(v) for v in _unpacked(internal)), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, _unpacked(keys), pos, has_gauss, cached))
    if "torch" in state:
        import torch

        torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["torch"])), dtype=torch.uint8))


def _packed(words) -> str:
    return base64.b64encode(words.tobytes()).decode("ascii")


def _unpacked(words):
    """uint32 words from `_packed` text, or from a list of numbers (version 1)."""
    import numpy as np

    if isinstance(words, str):
        return np.frombuffer(base64.b64decode(words), dtype=np.uint32).copy()
    return np.array(words, dtype=np.uint32)


def _torch_generator_state():
    """A copy of torch's global generator state, when torch is in use (a
    Keras backend, or a custom loop's); else None."""
    if "torch" not in sys.modules:
        return None
    import torch

    return torch.get_rng_state()


def _int_list(array) -> list[int]:
    return [int(v) for v in array.reshape(-1)]


def _as_state(values, variable):
    import numpy as np

    import keras

    current = keras.ops.convert_to_numpy(variable)
    return np.array(values, dtype=current.dtype).reshape(current.shape)
