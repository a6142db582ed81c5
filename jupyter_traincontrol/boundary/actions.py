"""What each command does to the training, at a boundary, on the training thread.

`CommandActions` takes the requests waiting in a run's channel and carries
them out (the table is `protocol.COMMAND_HELP`): ``save`` writes a
checkpoint, ``stop`` writes one and ends the training (`fit` the Keras
way, ``model.stop_training``: the front end says how), ``abort`` ends it
without one, ``pause`` holds the thread until ``resume``, ``stop`` or
``abort``; ``set`` and ``rollback`` are the training's
`steering.Steering`'s. Each request is then acknowledged in the run's
record with its outcome (``applied``, ``ignored`` or ``failed``), and the
record is published once for all the requests of a boundary. Saves asked
for at one boundary are one checkpoint: a burst of them costs training one
save. Checkpoints are written by `saves.SaveScheduler` (a snapshot at the
boundary, the file on a writer thread; a ``save`` is acknowledged once its
checkpoint is committed). The state being trained is synced once, where
the boundary's commands are taken.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from ..protocol import Command, Request, RunState, end_reason, is_interrupt
from .port import RunPort, Trained
from .progress import TrainingProgress
from .saves import Outcome, SaveScheduler

if TYPE_CHECKING:
    from .steering import Steering

__all__ = ["CommandActions"]

_PAUSE_POLL_SECONDS = 0.25
#: The commands that read or change the trained state: the first of them at a boundary syncs it.
_READS_STATE = frozenset({Command.SAVE, Command.STOP, Command.SET, Command.ROLLBACK})


class CommandActions:
    """Carries out a run's commands on its model, one boundary at a time.

    Args:
        trained: The state being trained (synced once per boundary).
        run: The run (its journal, state and record).
        channel: Where requests come from (the run's channel, or a job's
            agreed one): ``pending``, ``pop()``, ``get(timeout)``.
        progress: Where training stands.
        saves: Writes the checkpoints.
        end: Ends the training after this boundary (`fit`: sets
            ``model.stop_training``).
        say: Prints one line for the user (or not, when quiet).
        steering: Carries out ``set`` and ``rollback``; without it, those
            two commands are refused.
    """

    def __init__(self, trained: Trained, run: RunPort, channel, progress: TrainingProgress, saves: SaveScheduler,
                 end: Callable[[], None], say: Callable[..., None], steering: "Steering | None" = None):
        self.trained = trained
        self.run = run
        self.progress = progress
        self.ended_by: Command | None = None
        self.ending_request: Request | None = None  # the stop or abort that ended the training
        self.ended_by_nan = False
        self.interrupted = False
        self._second_interrupt = False  # a second Ctrl+C: its KeyboardInterrupt, raised again at the next boundary
        self._before_step = False  # this boundary comes before a step that runs whatever is done here
        self._deferred: Request | None = None  # a stop that came there: it acts after that step
        self._synced = False  # the trained state was synced at this boundary
        self._end = end
        self._say = say
        self._channel = channel
        self.steering = steering
        self.saves = saves
        self._actions: dict[Command, Callable[[Request], Outcome | None]] = {
            Command.SAVE: self._save,
            Command.STOP: self._stop,
            Command.ABORT: self._abort,
            Command.PAUSE: self._hold,
            Command.RESUME: lambda _request: self._ignored("The run is not paused; 'resume' ignored."),
            Command.SET: self._set,
            Command.ROLLBACK: self._rollback,
        }

    @property
    def pending(self) -> bool:
        """True when a command waits, saves wait for a free writer, or a
        second Ctrl+C is to be raised (cheap)."""
        channel = self._channel
        return channel is not None and (channel.pending or self._deferred is not None
                                        or (self.saves.due and self.saves.ready) or self._second_interrupt)

    def interrupt_at_next_boundary(self) -> None:
        """A second Ctrl+C: the next boundary raises `KeyboardInterrupt`.

        The signal handler raises it at once, but wherever the main thread
        is, and inside a garbage-collector callback (JAX registers one), a
        ``__del__`` or a weakref callback Python only prints it and goes on.
        A boundary reached after it was raised is one it did not end, so
        it is raised again there. Safe in a signal handler: sets a flag.
        """
        self._second_interrupt = True

    def detach(self) -> None:
        """Stops taking commands (the run has ended); a held pause lets go.
        Waits for the checkpoint being written."""
        self._channel = None
        self.saves.close()

    def apply_pending(self, mid_epoch: bool, before_step: bool = False) -> None:
        """Applies every waiting request, then publishes the record once.

        Args:
            mid_epoch: The boundary follows a training step of the epoch.
            before_step: The boundary is one the trainer runs a step after
                whatever is done here (`fit`'s train and epoch begin: Keras
                checks ``stop_training`` only after a step). A ``stop`` is
                then kept, with the requests after it, for the boundary
                after that step, so `fit` still ends at its checkpoint's step.
        """
        if not self.pending:
            return
        if self._second_interrupt:
            self._second_interrupt = False
            raise KeyboardInterrupt("A second Ctrl+C (raised again at this boundary: Python had swallowed it).")
        self.progress.acting(mid_epoch)
        self._before_step = before_step
        self._synced = False
        channel = self._channel
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            self._apply(deferred)
        while self._deferred is None and (request := channel.pop()) is not None:
            self._apply(request)
        self._start_due_saves()
        self.run.publish_soon()  # senders see their acks now (written by the run's thread)

    def _apply(self, request: Request) -> None:
        if self._before_step and request.command is Command.STOP and self.ended_by is None:
            self._deferred = request
            return
        if request.command in _READS_STATE:
            self._sync()
        journal = self.run.journal
        journal.log("command", f"{request.command} received")
        outcome = self._actions[request.command](request)
        if outcome is not None:  # None: the action acknowledged it itself
            journal.acknowledge(request, *outcome)

    def _sync(self) -> None:
        """Brings the trained state up to date, once a boundary: before the
        first command or save that reads it (an ``abort`` or a ``pause`` does not)."""
        if not self._synced:
            self._synced = True
            self.trained.sync()

    def _start_due_saves(self) -> None:
        """Starts the saves that waited for the writer, unless the training
        ends at this boundary (closing the saves writes them then)."""
        if self.saves.due and self.ended_by is None:
            self._sync()
            self.saves.start_due()

    def _ignored(self, message: str) -> Outcome:
        self.run.journal.log("info", message)
        return "ignored", message

    # The commands ----------------------------------------------------------

    def _save(self, request: Request) -> None:
        self.saves.request(request)  # acknowledged once its checkpoint is committed

    def _stop(self, request: Request) -> Outcome | None:
        if self.ended_by is not None:
            return self._ignored("Already stopping; 'stop' ignored.")
        interrupted = self.interrupted = self.interrupted or is_interrupt(request.request_id)
        outcome, message = self.saves.write_now("interrupt" if interrupted else "stop")  # on disk, or why not
        if outcome != "applied":
            message = f"stopping without a checkpoint: {message}"
        self.run.journal.acknowledge(request, outcome, message)  # published with the state, in one write
        self._end_fit(Command.STOP, request)
        return None

    def _abort(self, request: Request) -> Outcome | None:
        if self.ended_by is Command.ABORT:
            return self._ignored("Already aborting; 'abort' ignored.")
        self.run.journal.acknowledge(request, "applied", "aborting without a checkpoint")
        self._end_fit(Command.ABORT, request)
        return None

    def _hold(self, pause: Request) -> None:
        """Holds the training thread here until ``resume``, ``stop`` or ``abort``."""
        run, journal = self.run, self.run.journal
        if self.ended_by is not None:
            journal.acknowledge(pause, *self._ignored("The run is stopping; 'pause' ignored."))
            return
        run.move_to(RunState.PAUSED)
        journal.acknowledge(pause, "applied", "paused")
        self._say(f"Run {run.name!r} paused; send 'resume' to go on.")
        run.publish(force=True)
        while (channel := self._channel) is not None:  # None once the run was ended meanwhile
            request = channel.get(_PAUSE_POLL_SECONDS)
            self._start_due_saves()
            if request is None:
                continue
            if request.command is Command.RESUME:
                journal.log("command", "resume received")
                run.move_to(RunState.RUNNING)
                journal.acknowledge(request, "applied", "resumed")
                return
            if request.command is Command.PAUSE:
                journal.acknowledge(request, *self._ignored("Already paused; 'pause' ignored."))
            else:
                self._apply(request)
                self._start_due_saves()
            if self._deferred is not None:  # a stop before a step: the pause ends, the stop acts after it
                run.move_to(RunState.RUNNING)
            run.publish(force=True)  # the sender sees its ack now
            if self.ended_by is not None or self._deferred is not None:
                return

    def _set(self, request: Request) -> Outcome:
        if self.steering is None:
            return "failed", "this callback does not steer (no model seen yet)"
        return self.steering.set(request)

    def _rollback(self, request: Request) -> Outcome:
        if self.ended_by is not None:
            return self._ignored(f"The run is stopping; '{request}' ignored.")
        if self.steering is None:
            return "failed", "this callback does not steer (no model seen yet)"
        outcome = self.steering.rollback(request)
        self.saves.model_changed()  # a save now is not the one just taken
        return outcome

    def stop_without_checkpoint(self) -> bool:
        """Ends the training as ``stop`` does, but writes no checkpoint (the
        NaN policy: the newest checkpoint stays the last finite one).

        Returns:
            False if the fit was ending already.
        """
        if self.ended_by is not None:
            return False
        self.ended_by_nan = True
        self._end_fit(Command.STOP)
        return True

    def end_reason(self, state: RunState | str) -> str | None:
        """How the training ended in final `state` (`protocol.END_REASONS`):
        the sender of the stop or abort that ended it, or the NaN policy."""
        request = self.ending_request
        if self.interrupted and self.ended_by is Command.STOP and not self.ended_by_nan:
            return "interrupt"
        return end_reason(str(state), request.request_id if request is not None else None, nan=self.ended_by_nan)

    def _end_fit(self, command: Command, request: Request | None = None) -> None:
        self.progress.ends_here()
        self.ended_by = command
        self.ending_request = request
        self._end()
        self.run.move_to(RunState.STOPPING)
