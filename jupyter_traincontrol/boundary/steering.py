"""Steering a live `fit`: ``set`` and ``rollback``, and where their changes are kept.

`Steering` carries out the two commands at a boundary, on the training
thread, for `actions.CommandActions`:

- ``set KEY=VALUE ...`` changes optimizer hyperparameters and user tunables
  (`tunables.Tunables`: checked whole before anything changes); ``set``
  alone reports the current values.
- ``rollback [N]`` loads the run's N-th newest checkpoint into the live
  model and optimizer (weights, moments, ``iterations``, the learning rate
  or the schedule's step as they were), resets the epoch's running
  metrics, and training goes on. A value ``set`` steered that still holds
  stays as it is now; every other value is the checkpoint's (a schedule is
  never replaced by a constant), and the rollback says what that changed.

Every change is kept four ways: an event in the run's log and an entry in
the record's ``changes`` (what sent it, old and new value, where training
was); the current values in the record's ``tunables``; in each later
checkpoint's sidecar (``tunables``), the steered values that still hold
(`holding`: a later change by a callback such as `ReduceLROnPlateau`, or
by a scheduler, wins), which a resume applies again (`begin`); and, at
each epoch's end, in the logs `History` keeps, as `ReduceLROnPlateau`
does for ``learning_rate`` (``rollbacks`` counts rollbacks; a key that
appears mid-`fit` is filled in for the earlier epochs, so every list in
``History.history`` has one value an epoch).

After a loss that is not finite, the weights are suspect: no checkpoint
is written (by any command) until a rollback, or a check that finds every
weight finite (`refuse_checkpoint`). Steering is the `saves.SavePolicy` of
its training (`terms`): it refuses those checkpoints, gives each the
optimizer as the user built it, and the values steered so far.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from typing import Any, Callable

from ..checkpoint import Checkpoint, CheckpointError
from ..protocol import Request, assignments, rollback_depth, sender_words
from .port import RunPort, Trained
from .progress import TrainingProgress
from .saves import Outcome, SaveTerms
from .tunables import Change, TunableError, Tunables

__all__ = ["Steering", "format_value"]


def format_value(value: float | None) -> str:
    """A value as messages show it: ``0.0001``, ``off`` for None."""
    return "off" if value is None else f"{value:.6g}"


class Steering:
    """The ``set`` and ``rollback`` of one `fit`, and the record of what changed.

    Args:
        trained: The state being trained (rollbacks load into it).
        tunables: What ``set`` may change.
        run: The run (journal, store, record).
        progress: Where training is.
        say: Prints one line for the user.
        history: Returns the Keras `History` whose earlier epochs get a key
            that appears mid-`fit` (None: no such history).
    """

    def __init__(self, trained: Trained, tunables: Tunables, run: RunPort, progress: TrainingProgress,
                 say: Callable[..., None], history: Callable[[], Any] | None = None):
        self.trained = trained
        self.run = run
        self.journal = run.journal
        self.progress = progress
        self.tunables = tunables
        self._history = history or (lambda: None)
        self.overrides: dict[str, float] = {}  # every value steered in this run: written in sidecars
        self.rollbacks = 0
        self.suspect: str | None = None  # why the weights may not be finite, or None
        self._say = say
        self._first_old: dict[str, float | None] = {}  # a key's value before its first change
        self._epochs_logged = 0
        self._values_lock = threading.Lock()  # the values published, by the training thread or the run's
        self._values_published = 0  # how many times they were
        #: Waits until checkpoints being written in the background are listed
        #: (set by the front end to its saves'): a rollback chooses among all of them.
        self.wait_for_saves: Callable[[], None] = lambda: None

    # Start -------------------------------------------------------------------

    def begin(self, resumed: Checkpoint | None = None,
              read_on: Callable[[Callable[[], None]], None] | None = None) -> None:
        """At train begin: applies again what the resumed checkpoint's
        sidecar says was steered, and publishes the current values.

        Args:
            resumed: The checkpoint the training resumed from, or None.
            read_on: Where values that may be read on any thread
                (`Tunables.read_anywhere`) are read and published: a
                function that has another thread call what it is given
                (the run's, `Publisher.run_soon`). Without it, they are
                read now (on TensorFlow 0.1-0.2 ms of the training thread at
                a `fit`'s start).
        """
        steered = dict((resumed.info.get("tunables") or {}) if resumed is not None else {})
        if steered:
            known = set(self.tunables.names())
            unknown = sorted(set(steered) - known)
            current = self.tunables.read([name for name in steered if name in known])
            steered = {name: value for name, value in steered.items()
                       if name in known and not _same(current[name], value)}  # what the checkpoint's file holds stays
            if unknown:
                self._warn(f"Resume: cannot set {', '.join(unknown)} again (this model has no such value).")
        if steered:
            try:
                changes = self.tunables.apply(steered)
            except TunableError as error:
                self._warn(f"Resume: the steered values of {resumed.path.name} were not set again: {error}")
            else:
                self._record(changes, f"resume from {resumed.path.name}")
        if read_on is None:
            self._publish_values()
        else:
            read_on(self._publish_values_unless_newer)

    # set -----------------------------------------------------------------------

    def set(self, request: Request) -> Outcome:
        """``set KEY=VALUE ...``: changes all of them or none; alone: reports."""
        wanted = assignments(request)
        if not wanted:
            values = self.tunables.read()
            self._publish_values(values)
            shown = " ".join(f"{name}={format_value(value)}" for name, value in values.items())
            return "applied", shown or f"nothing can be set: {self.tunables.describe()}"
        try:
            changes = self.tunables.apply(wanted)
        except TunableError as error:
            message = f"'{request}' refused, nothing changed: {error}"
            self.journal.log("error", message)
            self._say(message)
            return "failed", str(error)
        notes = ""
        if "learning_rate" in wanted and self.tunables.schedule_replaced and "learning_rate" not in self.overrides:
            notes = " (the learning-rate schedule is replaced by this constant)"
        elif "learning_rate" in wanted:
            notes = getattr(self.tunables, "scheduler_note", "")
        message = self._record(changes, _sender(request), _said_by(request)) + notes
        self._say(f"Set {message}")
        return "applied", message

    def set_learning_rate(self, value: float, by: str) -> str:
        """Sets the learning rate on the run's own account (the NaN policy)."""
        return self._record(self.tunables.apply({"learning_rate": value}), by)

    # rollback ------------------------------------------------------------------

    def rollback(self, request: Request) -> Outcome:
        """``rollback [N]``: loads the N-th newest checkpoint of the run."""
        depth = rollback_depth(request)
        self.wait_for_saves()
        checkpoints = self.run.store.list()
        if depth > len(checkpoints):
            have = f"only {len(checkpoints)}" if checkpoints else "none yet (send 'save' to take one)"
            message = f"Cannot roll back to checkpoint {depth} from the newest: this run has {have}."
            self.journal.log("error", message)
            self._say(message)
            return "failed", message
        return self.rollback_to(checkpoints[: len(checkpoints) - depth + 1], _sender(request), _said_by(request))

    def rollback_to(self, checkpoints: list[Checkpoint], by: str, said_by: str | None = None) -> Outcome:
        """Loads the newest of `checkpoints` that loads (finite weights, a
        file that reads) into the live model and optimizer (the state synced
        at this boundary), saying which newer ones it skipped; the steered
        values stay as they are now.

        Args:
            checkpoints: The candidates, oldest first.
            by: What asked for it, for the record's ``changes`` (the
                command line and its id, or the NaN policy).
            said_by: Who, in words, for the run's log. Defaults to `by`.
        """
        trained, progress = self.trained, self.progress
        before = self.tunables.read()
        kept = self.holding(before)
        step_before = trained.step()
        skipped = []
        for candidate in reversed(checkpoints):
            try:
                trained.restore(candidate)
            except CheckpointError as error:
                skipped.append(str(error))
                continue
            checkpoint = candidate
            break
        else:
            message = f"Rollback failed, the model is as it was: {'; '.join(skipped) or 'no checkpoint to load'}"
            self.journal.log("error", message)
            self._say(message)
            return "failed", message
        if skipped:
            self._warn(f"Rollback skipped {len(skipped)} newer checkpoint(s): {'; '.join(skipped)}.")
        self.tunables.restore(kept)  # what was set stays; the rest is the checkpoint's (its rate, its schedule)
        after = self.tunables.read()
        went_back = [f"{name} {format_value(old)} -> {format_value(after.get(name))}" for name, old in before.items()
                     if not _same(after.get(name), old)]
        self.rollbacks += 1
        self.suspect = None
        progress.set_global_step(trained.step())
        position = checkpoint.position
        goes_on = (f"epoch {progress.epoch + 2}" if progress.epoch_is_over
                   else f"epoch {progress.epoch + 1}, batch {progress.step + 1}")
        message = (
            f"rolled back to {checkpoint.path.name} (epoch {position.epoch + 1}, step {position.step_in_epoch}): "
            f"optimizer step {step_before} -> {progress.global_step}"
            + (f", {', '.join(went_back)} (the checkpoint's)" if went_back else "")
            + f"; training goes on at {goes_on}"
        )
        self._add_change("rollbacks", self.rollbacks - 1, self.rollbacks, by, said_by, checkpoint=checkpoint.path.name)
        self.journal.log("rollback", f"{message[0].upper()}{message[1:]} (by {said_by or by}).")
        self._say(message[0].upper() + message[1:] + ".")
        return "applied", message

    # Checkpoints -----------------------------------------------------------------

    def refuse_checkpoint(self) -> str | None:
        """Why no checkpoint may be written now, or None. Once a loss was
        not finite, a checkpoint is written only if every weight is finite."""
        if self.suspect is None:
            return None
        if self.trained.all_finite():
            self.suspect = None
            return None
        newest = self.run.store.latest() if self.run.store is not None else None
        kept = f"{newest.path.name} stays the newest checkpoint" if newest else "there is no checkpoint"
        return f"not written: {self.suspect}, and the weights are not all finite; {kept}"

    def terms(self) -> SaveTerms:
        """What a checkpoint taken now may be (`saves.SavePolicy`): refused
        after a non-finite loss (`refuse_checkpoint`), with every value
        steered in this run in its sidecar, and the optimizer as the user
        built it in its model file (`tunables.Tunables.as_built`)."""
        around = self.tunables.as_built() if self.tunables.schedule_replaced else contextlib.nullcontext()
        return SaveTerms(self.refuse_checkpoint(), self.holding(), around)

    def holding(self, current: dict[str, float | None] | None = None) -> dict[str, float]:
        """The values steered in this run that still hold: a later change
        by a callback (`ReduceLROnPlateau`) or a scheduler wins over a
        ``set`` made before it. While a ``set`` has replaced the learning
        rate's schedule, the constant training uses is one of them, whoever
        changed it last (the model file holds the schedule: `as_built`).

        Args:
            current: Every value as `Tunables.read` just read it; None: the
                ones needed are read now.
        """
        if not self.overrides:
            return {}
        if current is None:
            names = list(self.overrides)
            if self.tunables.schedule_replaced and "learning_rate" not in names:
                names.append("learning_rate")
            current = self.tunables.read(names)
        held = {name: value for name, value in self.overrides.items() if _same(current.get(name), value)}
        if self.tunables.schedule_replaced and current.get("learning_rate") is not None:
            held["learning_rate"] = current["learning_rate"]
        return held

    # Epoch end: History -------------------------------------------------------------

    def add_to_logs(self, logs: dict | None) -> None:
        """Adds the steered values to an epoch's logs (what `History` keeps)."""
        if logs is None:
            return
        current = self.tunables.read()  # one read serves the logs and the record
        self._publish_values(current)
        values = {name: value for name, value in current.items()
                  if name == "learning_rate" or name in self.tunables.user or name in self._first_old}
        if self.rollbacks or "rollbacks" in self._first_old:
            values["rollbacks"] = self.rollbacks
        history = self._history()
        earlier = getattr(history, "history", None)
        for name, value in values.items():
            if value is None:
                continue
            if (self._epochs_logged and isinstance(earlier, dict) and name not in earlier
                    and len(getattr(history, "epoch", ())) == self._epochs_logged):
                before = self._first_old.get(name)
                earlier[name] = [before] * self._epochs_logged
            logs[name] = value
        self._epochs_logged += 1

    # Records ----------------------------------------------------------------------------

    def _record(self, changes: list[Change], by: str, said_by: str | None = None) -> str:
        for change in changes:
            self.overrides[change.name] = change.new
            self._add_change(change.name, change.old, change.new, by, said_by)
        message = ", ".join(f"{c.name} {format_value(c.old)} -> {format_value(c.new)}" for c in changes)
        self.journal.log("change", f"{message} (by {said_by or by})")
        self._publish_values()
        return message

    def _add_change(self, name: str, old, new, by: str, said_by: str | None = None, **extra) -> None:
        self._first_old.setdefault(name, old)
        progress = self.progress
        change = {
            "time": time.time(), "by": by, "sender": said_by or by, "name": name, "old": old, "new": new,
            "epoch": progress.epoch + 1, "step": progress.step, "global_step": self.trained.step(),
            **extra,
        }
        self.journal.add_change(change)

    def _publish_values(self, values: dict | None = None) -> None:
        self._put_values(self.tunables.read() if values is None else values)

    def publish_unread(self) -> None:
        """As training ends: reads and publishes the values if nothing has
        yet (the run's thread had not read them for `begin`)."""
        if not self._values_published:
            self._publish_values()

    def _publish_values_unless_newer(self) -> None:
        """`_publish_values` on another thread: dropped if the training thread
        published values meanwhile (a ``set`` whose change this read may
        have missed)."""
        before = self._values_published
        self._put_values(self.tunables.read(), unless_published_since=before)

    def _put_values(self, values: dict, unless_published_since: int | None = None) -> None:
        """Makes `values` the ones the run shows; with `unless_published_since`
        (a count of `_values_published`), not if others were put since."""
        with self._values_lock:
            if unless_published_since is not None and self._values_published != unless_published_since:
                return
            self._values_published += 1
            self.progress.show_tunables(values)

    def _warn(self, message: str) -> None:
        self.journal.log("warning", message)
        self._say(message)


def _same(current: float | None, steered: float | None) -> bool:
    """True if `current` is the value `steered` (as a float32 variable holds it)."""
    if current is None or steered is None:
        return current is steered
    return math.isclose(current, steered, rel_tol=1e-6, abs_tol=1e-12)


def _sender(request: Request) -> str:
    """What sent a request, for the record's ``changes``: the command line and its id."""
    return f"'{request}'" + (f" #{request.request_id}" if request.request_id else "")


def _said_by(request: Request) -> str:
    """Who sent a request, for a person (``cli``, ``the side panel``); the
    command line for a request without an id."""
    return sender_words(request.request_id) or f"'{request}'"
