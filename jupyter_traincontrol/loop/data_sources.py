"""What orders the items `TrainLoop.batches` is given besides the global random state, kept so a resume rebuilds it.

Two kinds of iterable keep an order of their own from one epoch to the next:

- A `tf.data` dataset with a seeded ``shuffle`` (``reshuffle_each_iteration``
  by default) or ``Dataset.random``: each iterator opened of a pipeline
  holding such a node draws new seeds from it, so an epoch's order depends
  on how many iterators were opened before it (through any wrapper:
  ``base.batch(32)`` made each epoch over one shuffled ``base`` too).
  `DataSources` counts the iterators `batches` opens, per such node; a
  resume opens and drops as many of the resumed epoch's dataset before
  the iterator it reads. (A random op with a seed in a ``map`` starts over
  with each iterator: nothing to count.)
- A torch ``DataLoader`` with ``generator=`` (or a sampler with one): each
  epoch's order, and its workers' seeds, are drawn from that generator when
  the epoch's iterator is created. `DataSources` keeps the generator's
  state as of that moment; a resume sets it back before the resumed
  epoch's iterator is created. (A loader without one draws from torch's
  global generator, which `state.random_state` restores at the epoch's start.)

Which source of the interrupted run the resumed epoch's stands for: the
one its epoch gave `batches` first, when the checkpoint came after that;
for a checkpoint at an epoch's start or end, the one the epoch before gave
(its shuffle or generator built once, before the loop), unless the run
gave `batches` a new one in some epoch (built each epoch: then there is
nothing to replay).

Not restored, and said once by the resume: a `tf.data` shuffle without a
seed (neither ``shuffle(seed=...)`` nor a global seed). Not seen at all:
iterators of the dataset opened outside `batches` (an evaluation over the
training set), and draws from a loader's generator outside its iterators.

State of version 1, in a checkpoint's ``resume_state["data"]``:
``{"version": 1, "kind": "loop", "renewed": bool, "source": null or
{"iterators": N} or {"generators": ["base64", ...]}}``.
"""

from __future__ import annotations

import base64
import sys
from typing import Any, NamedTuple

__all__ = ["DataSources"]

_KEPT = 4  # pipelines whose iterators are counted (the newest ones given to batches)


class DataSources:
    """The order-keeping state of what a loop's `batches` is given, per epoch.

    A source is known by what keeps its order (`_keepers`): the seeded
    nodes of a `tf.data` pipeline (``shuffle``, ``Dataset.random``), or a
    ``DataLoader``'s generators. Two epochs have the same source when those
    are the same objects, even through a new wrapper (``base.batch(32)``
    made each epoch over one shuffled ``base``, a loader made each epoch
    over one generator).
    """

    def __init__(self):
        self._first: _Source | None = None  # what the epoch in progress gave batches first
        self._previous: _Source | None = None  # what the epoch before gave first
        self._at_open: dict[str, Any] | None = None  # `_first`'s state as the epoch's iterator was opened
        self._opened: list[list] = []  # [keepers, iterators opened], newest last
        self._resumed: Any = None  # the resumed checkpoint's state, until its epoch's source is restored
        self.renewed = False  # an epoch gave batches another source than the epoch before

    def resume(self, saved: Any) -> None:
        """The run resumes from a checkpoint whose ``resume_state["data"]`` is `saved`."""
        self._resumed = saved

    def epoch_began(self) -> None:
        """A new epoch: its first source is yet to come."""
        if self._first is not None:
            self._previous, self._first = self._first, None

    def opening(self, items: Any) -> None:
        """`batches` is about to open an iterator of `items`."""
        source = _keepers(items)
        if self._first is None:
            self._first = source
            if self._previous is not None and not _same(source.keepers, self._previous.keepers):
                self.renewed = True
            self._at_open = self._state_of(source)
        if source.kind == "iterators":
            self._set_count(source.keepers, self._count(source.keepers) + 1)

    def state(self, *, epoch_in_progress: bool) -> dict[str, Any]:
        """What a checkpoint keeps for the epoch a resume continues in.

        Args:
            epoch_in_progress: The resume continues in the epoch in
                progress (else in the next one: a checkpoint at its end).
        """
        if self._first is None and self._previous is None and isinstance(self._resumed, dict):
            return self._resumed  # the resumed epoch's source is yet to come: what the checkpoint said holds
        if epoch_in_progress and self._first is not None:
            state = self._at_open
        else:
            recent = self._first if self._first is not None else self._previous
            state = None if recent is None or self.renewed else self._state_of(recent)
        return {"version": 1, "kind": "loop", "renewed": self.renewed, "source": state}

    def restore(self, items: Any) -> str | None:
        """Before the resumed epoch's first iterator of `items` is opened:
        opens and drops the iterators the interrupted run had opened before
        it, or sets its loader's generators back (as `resume` was told).

        Returns:
            None, or one sentence saying why the resumed epoch's order may
            differ from the uninterrupted run's.
        """
        saved, self._resumed = self._resumed, None
        source = _keepers(items)
        if source.unseeded:
            return ("the tf.data dataset given to batches() shuffles without a seed (neither `shuffle(seed=...)` nor a "
                    "global seed): the resumed epochs' order differs from an uninterrupted run")
        if not isinstance(saved, dict) or saved.get("version") != 1 or saved.get("kind") != "loop":
            if source.kind is not None:
                return ("the checkpoint does not say how far the data's own order had gone (an older one): the "
                        "resumed epoch's order may differ")
            return None
        self.renewed = bool(saved.get("renewed"))
        state = saved.get("source")
        if not isinstance(state, dict) or source.kind is None:  # nothing to replay: a new source, or one without
            return None
        try:
            if source.kind in state:
                return self._replay(items, source, state[source.kind])
        except (TypeError, ValueError, RuntimeError) as error:
            return f"the checkpoint's data order could not be restored ({error}): the resumed epoch's order may differ"
        return (f"the checkpoint's data was another kind of source than the {type(items).__name__} given now: the "
                "resumed epoch's order may differ")

    def _replay(self, items: Any, source: "_Source", saved: Any) -> str | None:
        if source.kind == "generators":
            return _set_generators(source.keepers, saved)
        if type(saved) is not int or saved < 0:
            raise ValueError(f"{saved!r} iterators opened, expected a whole number")
        for _ in range(saved):
            iter(items)  # draws the shuffle's seeds as the interrupted run's iterator did
        self._set_count(source.keepers, saved)
        return None

    def _state_of(self, source: "_Source") -> dict[str, Any] | None:
        """The order-keeping state of `source` now, or None if it keeps none."""
        if source.kind == "iterators":
            return {"iterators": self._count(source.keepers)}
        if source.kind == "generators":
            return {"generators": [base64.b64encode(g.get_state().numpy().tobytes()).decode("ascii")
                                   for g in source.keepers]}
        return None

    def _count(self, keepers: tuple) -> int:
        return next((count for kept, count in self._opened if _same(kept, keepers)), 0)

    def _set_count(self, keepers: tuple, count: int) -> None:
        others = [entry for entry in self._opened if not _same(entry[0], keepers)]
        self._opened = others[-(_KEPT - 1):] + [[keepers, count]]


class _Source(NamedTuple):
    """What keeps an iterable's order: ``kind`` ``"iterators"`` (a
    `tf.data` pipeline's seeded nodes), ``"generators"`` (a loader's), or
    None; ``unseeded``: a node draws seeds it was not given."""

    kind: str | None
    keepers: tuple
    unseeded: bool = False


def _same(left: tuple, right: tuple) -> bool:
    return len(left) == len(right) and all(a is b for a, b in zip(left, right))


def _keepers(items: Any) -> _Source:
    nodes = _seeded_nodes(items)
    if nodes:
        unseeded = any(all(int(seed) == 0 for seed in (node._seed, node._seed2)) for node in nodes)
        return _Source("iterators", tuple(nodes), unseeded)
    generators = _generators(items)
    if generators:
        return _Source("generators", tuple(generators))
    return _Source(None, ())


def _seeded_nodes(items: Any) -> list:
    """The nodes of a `tf.data` pipeline that draw seeds when an iterator
    is opened (``shuffle``, ``Dataset.random``), in a fixed order; none for
    anything else."""
    if "tensorflow" not in sys.modules:  # nothing imported for a loop without TensorFlow
        return []
    import tensorflow as tf

    if not isinstance(items, tf.data.Dataset):
        return []
    found, seen, todo = [], set(), [items]
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if getattr(node, "_seed", None) is not None and getattr(node, "_seed2", None) is not None:
            found.append(node)
        try:
            todo.extend(node._inputs())
        except (NotImplementedError, AttributeError, TypeError):
            pass
    return found


def _generators(items: Any) -> list:
    """The torch generators a ``DataLoader`` draws its order from (its own, its samplers'), each once."""
    if "torch" not in sys.modules:
        return []
    import torch

    if not isinstance(items, torch.utils.data.DataLoader):
        return []
    batch_sampler = getattr(items, "batch_sampler", None)
    candidates = (getattr(items, "generator", None), getattr(getattr(items, "sampler", None), "generator", None),
                  getattr(getattr(batch_sampler, "sampler", None), "generator", None))
    found = []
    for candidate in candidates:
        if isinstance(candidate, torch.Generator) and all(candidate is not g for g in found):
            found.append(candidate)
    return found


def _set_generators(generators: tuple, states: Any) -> str | None:
    import torch

    if not isinstance(states, list) or len(states) != len(generators):
        return (f"the checkpoint keeps {len(states) if isinstance(states, list) else 'no'} data-loader generator "
                f"states, the DataLoader given now has {len(generators)}: the resumed epoch's order may differ")
    for generator, packed in zip(generators, states):
        generator.set_state(torch.frombuffer(bytearray(base64.b64decode(packed)), dtype=torch.uint8))
    return None
