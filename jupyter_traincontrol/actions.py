"""What each command does to a `fit`, at a batch boundary, on the training thread.

`CommandActions` takes the requests waiting in a run's channel and carries
them out (the table is `commands.COMMAND_HELP`): ``save`` writes a
checkpoint, ``stop`` writes one and ends `fit` the Keras way
(``model.stop_training``), ``abort`` ends it without one, ``pause`` holds
the thread until ``resume``, ``stop`` or ``abort``; ``set`` and
``rollback`` are the fit's `steering.Steering`'s. Each request is then
acknowledged in the run's record with its outcome (``applied``,
``ignored`` or ``failed``), and the record is published once for all the
requests of a boundary. Saves asked for at one boundary are one checkpoint:
a burst of them costs training one save. Checkpoints are written by
`BackgroundSaves` (a snapshot at the boundary, the file on a writer
thread; a ``save`` is acknowledged once its checkpoint is committed).

`FitProgress` says where `fit` is; `ControlCallback` keeps it up to date.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from .background_saves import BackgroundSaves
from .checkpoint import TrainingPosition
from .commands import Command, Request, RunState
from .lifecycle import RunLifecycle
from .resume import optimizer_step

if TYPE_CHECKING:
    from .steering import Steering

__all__ = ["CommandActions", "FitProgress"]

_PAUSE_POLL_SECONDS = 0.25

Outcome = tuple[str, str]  # ("applied" | "ignored" | "failed", a sentence)


class FitProgress:
    """Where a `fit` stands, as its Keras hooks saw it.

    Attributes:
        epoch: Zero-based index of the epoch in progress.
        step: Batches of that epoch trained.
        boundary: Batch boundaries passed since train begin.
        mid_epoch: True while commands are applied right after a training
            batch (rather than at an epoch's start or end, or in validation).
        stopped_mid_epoch: True once a stop or abort came before the
            epoch's last batch.
    """

    def __init__(self, epoch: int = 0):
        self.epoch = epoch
        self.step = 0
        self.boundary = 0
        self.mid_epoch = False
        self.stopped_mid_epoch = False
        self.random_at_epoch_start: dict | None = None  # `random_state.capture_epoch_start` of `epoch`
        self.data_order = None  # the fit's `data_order.DataOrder`, if its data was found
        self.in_validation = False  # between the epoch's first validation batch and its end

    def resume_state(self, model) -> Callable[[TrainingPosition], dict]:
        """What a checkpoint at a position keeps for an exact resume (`random_state`)."""
        from . import random_state

        def capture(position: TrainingPosition) -> dict:
            in_epoch = position.resume_epoch == self.epoch
            started = self.random_at_epoch_start if in_epoch else None
            data = None
            if self.data_order is not None:  # after an epoch's last batch, Keras still opens the next epoch's data
                data = self.data_order.state(at_epoch_start=in_epoch, tail=self.mid_epoch and position.epoch_complete,
                                             epoch=self.epoch, in_validation=self.in_validation)
            return random_state.capture(model, position.resume_epoch, started, data)

        return capture

    def position(self, model, steps_per_epoch: int | None) -> TrainingPosition:
        """The position a checkpoint taken now records."""
        if self.mid_epoch:
            complete = steps_per_epoch is not None and self.step >= steps_per_epoch
        else:
            complete = self.step > 0 and not self.stopped_mid_epoch
        return TrainingPosition(
            epoch=self.epoch,
            step_in_epoch=self.step,
            steps_per_epoch=steps_per_epoch,
            global_step=optimizer_step(model),
            epoch_complete=complete,
        )


class CommandActions:
    """Carries out a run's commands on its model, one boundary at a time.

    Args:
        model: The model being trained.
        lifecycle: The run (its channel, store, state and record).
        progress: Where `fit` stands.
        say: Prints one line for the user (or not, when quiet).
        save_in_background: Write ``save`` checkpoints on a writer thread
            from a host copy of the variables. Defaults to True.
        steering: Carries out ``set`` and ``rollback`` and guards
            checkpoints after a non-finite loss; without it, those two
            commands are refused.
        sync: Called before commands are applied, to bring the model's
            state up to date (on JAX the trainer holds the variables during
            `fit`; `ControlCallback` reads ``Callback.model``, which syncs).
    """

    def __init__(self, model, lifecycle: RunLifecycle, progress: FitProgress, say: Callable[..., None],
                 save_in_background: bool = True, steering: "Steering | None" = None,
                 sync: Callable[[], None] | None = None):
        self.model = model
        self._sync = sync or (lambda: None)
        self.lifecycle = lifecycle
        self.progress = progress
        self.ended_by: Command | None = None
        self.interrupted = False
        self._say = say
        self._channel = lifecycle.channel
        self.steering = steering
        self.saves = BackgroundSaves(model, lifecycle, lambda: progress.position(model, lifecycle.steps),
                                     lambda: progress.boundary, say, background=save_in_background,
                                     resume_state=progress.resume_state(model), guard=steering)
        if steering is not None:
            steering.wait_for_saves = self.saves.wait_for_writes
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
        """True when a command waits, or saves wait for a free writer (cheap)."""
        channel = self._channel
        return channel is not None and (channel.pending or (self.saves.due and self.saves.ready))

    def take_from(self, channel) -> None:
        """Takes commands from `channel` instead of the run's own (a
        multi-process job's agreed commands, `distributed.Job.channel`)."""
        self._channel = channel

    def detach(self) -> None:
        """Stops taking commands (the run has ended); a held pause lets go.
        Waits for the checkpoint being written."""
        self._channel = None
        self.saves.close()

    def apply_pending(self, mid_epoch: bool) -> None:
        """Applies every waiting request, then publishes the record once."""
        if not self.pending:
            return
        self.progress.mid_epoch = mid_epoch
        self._sync()
        channel = self._channel
        while (request := channel.pop()) is not None:
            self._apply(request)
        self.saves.start_due()
        self.lifecycle.publish(force=True)  # senders see their acks now

    def _apply(self, request: Request) -> None:
        self.lifecycle.log("command", f"{request.command} received")
        outcome = self._actions[request.command](request)
        if outcome is not None:  # None: the action acknowledged it itself
            self.lifecycle.acknowledge(request, *outcome)

    def _ignored(self, message: str) -> Outcome:
        self.lifecycle.log("info", message)
        return "ignored", message

    # The commands ----------------------------------------------------------

    def _save(self, request: Request) -> None:
        self.saves.request(request)  # acknowledged once its checkpoint is committed

    def _stop(self, _request: Request) -> Outcome:
        if self.ended_by is not None:
            return self._ignored("Already stopping; 'stop' ignored.")
        outcome, message = self._checkpoint("interrupt" if self.interrupted else "stop")
        self._end_fit(Command.STOP)
        return outcome, message if outcome == "applied" else f"stopping without a checkpoint: {message}"

    def _abort(self, _request: Request) -> Outcome:
        if self.ended_by is Command.ABORT:
            return self._ignored("Already aborting; 'abort' ignored.")
        self._end_fit(Command.ABORT)
        return "applied", "aborting without a checkpoint"

    def _hold(self, pause: Request) -> None:
        """Holds the training thread here until ``resume``, ``stop`` or ``abort``."""
        lifecycle = self.lifecycle
        lifecycle.set_state(RunState.PAUSED)
        lifecycle.acknowledge(pause, "applied", "paused")
        self._say(f"Run {lifecycle.name!r} paused; send 'resume' to go on.")
        lifecycle.publish(force=True)
        while (channel := self._channel) is not None:  # None once the run was ended meanwhile
            request = channel.get(_PAUSE_POLL_SECONDS)
            self.saves.start_due()  # saves that waited for the writer
            if request is None:
                continue
            if request.command is Command.RESUME:
                lifecycle.log("command", "resume received")
                lifecycle.set_state(RunState.RUNNING)
                lifecycle.acknowledge(request, "applied", "resumed")
                return
            if request.command is Command.PAUSE:
                lifecycle.acknowledge(request, *self._ignored("Already paused; 'pause' ignored."))
            else:
                self._apply(request)
                self.saves.start_due()
            lifecycle.publish(force=True)  # the sender sees its ack now
            if self.ended_by is not None:
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
        """Ends `fit` as ``stop`` does, but writes no checkpoint (the NaN
        policy: the newest checkpoint stays the last finite one).

        Returns:
            False if the fit was ending already.
        """
        if self.ended_by is not None:
            return False
        self._end_fit(Command.STOP)
        return True

    def _end_fit(self, command: Command) -> None:
        progress, steps = self.progress, self.lifecycle.steps
        if progress.mid_epoch and (steps is None or progress.step < steps):
            progress.stopped_mid_epoch = True
        self.ended_by = command
        self.model.stop_training = True
        self.lifecycle.set_state(RunState.STOPPING)

    def _checkpoint(self, reason: str) -> Outcome:
        """Writes a checkpoint of this boundary, on disk when this returns;
        says what it wrote, or why it could not."""
        return self.saves.write_now(reason)
