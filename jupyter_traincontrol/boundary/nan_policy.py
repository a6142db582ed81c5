"""What a run does when a batch's loss is not finite (``on_nan=``).

The front end reads the loss from the logs (Keras has already made them
Python numbers for its batch hooks), so the check is one float comparison
and no extra device sync; `NanPolicy.on_non_finite` runs only when it
fails. Then the weights are suspect: no checkpoint is written until a
rollback loads finite ones (see `steering.Steering.refuse_checkpoint`).

- ``stop`` (the default): ends the training gracefully without
  a checkpoint, so the newest checkpoint stays the last finite one.
- ``rollback``: loads the newest checkpoint, halves the learning rate in
  effect, and goes on; at most `max_rollbacks` times in a `fit`, then as
  ``stop``. With no checkpoint to go back to, as ``stop``.
- ``ignore``: goes on (logged once an epoch).
"""

from __future__ import annotations

import math
from typing import Callable

from .steering import Steering, format_value

__all__ = ["NanPolicy", "NAN_POLICIES", "check_policy"]

NAN_POLICIES = ("stop", "rollback", "ignore")
DEFAULT_MAX_ROLLBACKS = 3


def check_policy(policy: str, max_rollbacks: int = DEFAULT_MAX_ROLLBACKS) -> str:
    """Checks ``on_nan`` and ``nan_rollbacks``; returns the policy.

    Raises:
        ValueError: Saying what was given and what is expected.
    """
    if policy not in NAN_POLICIES:
        raise ValueError(f"on_nan must be one of {', '.join(NAN_POLICIES)}, got {policy!r}.")
    if type(max_rollbacks) is not int or max_rollbacks < 0:
        raise ValueError(f"nan_rollbacks must be a whole number of at least 0, got {max_rollbacks!r}.")
    return policy


class NanPolicy:
    """Acts on a non-finite loss, on the training thread.

    Args:
        policy: ``stop``, ``rollback`` or ``ignore``.
        steering: The fit's `Steering` (rollbacks, the learning rate, the
            checkpoint guard).
        stop: Ends `fit` without a checkpoint.
        say: Prints one line for the user.
        max_rollbacks: Rollbacks allowed in one `fit` (policy ``rollback``).
    """

    def __init__(self, policy: str, steering: Steering, stop: Callable[[], bool], say: Callable[..., None],
                 max_rollbacks: int = DEFAULT_MAX_ROLLBACKS):
        self.policy = check_policy(policy, max_rollbacks)
        self.max_rollbacks = max_rollbacks
        self.rollbacks = 0
        self._steering = steering
        self._stop = stop
        self._say = say
        self._ignored_in_epoch: int | None = None

    def on_non_finite(self, loss: float, epoch: int, batch: int) -> None:
        """Called when the loss of `batch` (0-based) in `epoch` (0-based) is not finite."""
        steering = self._steering
        steering.trained.sync()  # this boundary's one sync: a rollback loads into the state as it is now
        where = f"the loss was {_shown(loss)} at epoch {epoch + 1}, batch {batch + 1}"
        steering.suspect = where
        if self.policy == "ignore":
            if self._ignored_in_epoch != epoch:
                self._ignored_in_epoch = epoch
                self._tell("warning", f"{where[0].upper()}{where[1:]}; going on (on_nan=ignore). "
                                      "No checkpoint is written while the weights are not finite.")
            return
        if self.policy == "rollback":
            if self.rollbacks < self.max_rollbacks and self._roll_back(where):
                return
            if self.rollbacks >= self.max_rollbacks:
                where += f", after {self.rollbacks} rollbacks (the most on_nan=rollback takes)"
        newest = steering.run.store.latest()
        kept = f"{newest.path.name} stays the newest checkpoint" if newest else "no checkpoint was written"
        if self._stop():
            self._tell("error", f"{where[0].upper()}{where[1:]}: stopping without a checkpoint; {kept}.")

    def _roll_back(self, where: str) -> bool:
        steering = self._steering
        steering.wait_for_saves()  # a checkpoint being written is a candidate too
        checkpoints = steering.run.store.list()
        if not checkpoints:
            self._tell("error", f"{where[0].upper()}{where[1:]}: no checkpoint to roll back to.")
            return False
        lr = steering.tunables.read(["learning_rate"])["learning_rate"] if "learning_rate" in steering.tunables.names() else None
        by = f"on_nan=rollback ({where})"
        outcome, message = steering.rollback_to(checkpoints, by)  # the newest whose weights are finite
        if outcome != "applied":
            return False
        self.rollbacks += 1
        halved = ""
        if lr is not None:
            halved = "; " + steering.set_learning_rate(lr / 2, by="on_nan=rollback")
        self._tell("warning", f"{where[0].upper()}{where[1:]}: rollback {self.rollbacks} of {self.max_rollbacks}, "
                              f"{message}{halved}.")
        return True

    def _tell(self, kind: str, message: str) -> None:
        self._steering.journal.log(kind, message)
        self._say(message)


def _shown(loss) -> str:
    try:
        value = float(loss)
    except (TypeError, ValueError):
        return repr(loss)
    return "nan" if math.isnan(value) else format_value(value)
