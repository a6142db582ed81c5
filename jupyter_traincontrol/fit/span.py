"""One run for many `fit` calls: ``with ControlCallback(...) as control:``.

Outside a with block, each `fit` of a `ControlCallback` is a run of its own:
its name is claimed, its FIFO made, its record written, its checkpoint
folder locked, and all of it let go when the `fit` ends. Code that calls
`fit` in a loop (reinforcement learning, active learning, one epoch a
call) pays that every time. In a with block, every `fit` given the
callback drives one run, opened when the block begins and ended when it
ends (`FitSpan`): a `fit` pays only for its own part.

With ``save_at_end`` (the default), a block that ends ``finished`` writes
one checkpoint as it ends, of the model as it is then, at its last `fit`'s
position; its fits write none of their own.

A ``stop`` or ``abort`` ends the block's training, as it ends a notebook
cell's: the `fit` it ends returns as usual, and a later one in the block
raises `TrainingEnded` before its first step, which the with statement
swallows (the code after the block runs). A command sent between two fits
acts in the next one. The run's final state: ``stopped`` or ``aborted``
after that command, ``failed`` if the block raised (``interrupt`` as its
end reason for a Ctrl+C between two fits), else ``finished``.

SIGTERM (``handle_sigterm``) stops the block's run the same way, with a
checkpoint if a `fit` is training, and once the block has ended, the
process ends as SIGTERM asks (`boundary.safeguards.Safeguards`, for the
whole block: its fits install none of their own).
"""

from __future__ import annotations

import contextlib
import traceback
from typing import Any

from ..boundary.safeguards import Safeguards
from ..protocol import RunState, final_state
from ..run import RunScope
from ..run.journal import say
from . import watchdog

__all__ = ["FitSpan", "TrainingEnded"]


class TrainingEnded(Exception):
    """A `fit` began in a ``with ControlCallback(...)`` block after a stop or
    abort had ended the block's training. It trains nothing; the block's
    with statement ends on it quietly.

    Args:
        name: The run's name.
        run_id: The run's ``run_id`` (the with statement swallows only its own).
        ended_by: The command that ended the training.
    """

    def __init__(self, name: str, run_id: str, ended_by):
        super().__init__(f"Run {name!r} was told to {ended_by}: this fit trains nothing, and the with block ends.")
        self.run_id = run_id


class FitSpan:
    """The run of a ``with ControlCallback(...)`` block: opened by `open`,
    driven by each `fit` in the block, ended by `close`.

    Args:
        callback: The `ControlCallback` whose block this is.
    """

    def __init__(self, callback: Any):
        self._callback = callback
        self._scope = RunScope(callback.lifecycle, resume=callback.resume)  # its fits drive the open run
        #: The callback's own: resume and resume_from apply to the first fit only, and save_at_end to the block's
        #: end (one checkpoint of a finished block, not one a fit); all the callback's again after the block.
        self._settings = callback.resume, callback.resume_from, callback.save_at_end
        self._safeguards: Safeguards | None = None
        self._guards = contextlib.ExitStack()  # what the safeguards installed, undone as the block ends

    @classmethod
    def open(cls, callback: Any) -> "FitSpan":
        """Opens the callback's run for a with block: claimed, listening,
        its checkpoint folder held until the block ends.

        Raises:
            RuntimeError: The callback runs in a run it does not own
                (``lifecycle=``), belongs to a multi-process job, or a `fit`
                of it is in progress.
            NameTakenError, CheckpointDirError, CheckpointDirBusyError: As
                a `fit` would (the run is not left open).
        """
        if callback.scope is not None:
            raise RuntimeError("This ControlCallback drives a run it was given (lifecycle=...), which its owner opens "
                               "and closes; a with block opens the callback's own run.")
        if callback.job is not None:
            raise RuntimeError("A multi-process job's run spans one fit, opened and closed in step by every process; "
                               "use the callback without a with block.")
        session = callback.session
        if session is not None and not session.closed:
            raise RuntimeError(f"A fit of run {callback.name!r} is in progress; a with block begins between fits.")
        watchdog.check_all()  # a run of this process whose fit raised ends now, before a new one claims a name
        span, run = cls(callback), callback.lifecycle
        run.open()
        try:
            run.store.acquire()  # checked and locked once, for every fit of the block
        except BaseException as error:
            run.close(RunState.FAILED, f"Could not start: {error}")
            raise
        callback.scope = span._scope
        callback.save_at_end = False  # the block writes its end's checkpoint itself (`close`)
        if callback.handle_sigterm:  # SIGTERM stops the block's run (main thread only; not in a kernel)
            span._safeguards = Safeguards(run, None, callback.note_interrupt, "batch", sigint=False, sigterm=True,
                                          sigterm_grace=callback.sigterm_grace)
            span._safeguards.open(span._guards)
        resuming = callback.resume or callback.resume_from is not None  # its first fit resumes
        say(run.listening_words(resuming=resuming), verbose=callback.verbose)
        return span

    def fit_begins(self) -> None:
        """``on_train_begin``, before the fit's session opens: only the first
        fit resumes; after a stop or abort, no fit trains.

        Raises:
            TrainingEnded: A stop or abort ended the block's training.
        """
        callback, scope = self._callback, self._scope
        if scope.driving:  # the previous fit raised
            scope.driver_ended(callback)
        if scope.ended_by is not None:
            run = callback.lifecycle
            raise TrainingEnded(run.name, run.run_id, scope.ended_by)
        first = scope.count == 0
        callback.resume = scope.take_resume()
        callback.resume_from = self._settings[1] if first else None
        scope.driver_began(callback)

    def fit_ended(self) -> None:
        """``on_train_end``, once the fit's session has closed."""
        self._scope.driver_ended(self._callback)

    def close(self, kind, error, tb) -> bool:
        """Ends the block's run (its ``__exit__``).

        Returns:
            True when the block ended on this run's `TrainingEnded` (the
            with statement swallows it).
        """
        callback, scope = self._callback, self._scope
        run = callback.lifecycle
        callback.scope = None
        callback.resume, callback.resume_from, callback.save_at_end = self._settings
        fit = callback.adapter
        if fit is not None and not fit.session.closed:  # a fit that raised: its watchdog has not ended it yet
            fit.fit_lost()
        if scope.driving:
            scope.driver_ended(callback)
        swallowed = isinstance(error, TrainingEnded) and error.run_id == run.run_id
        if kind is None or swallowed:
            state, text = final_state(scope.ended_by), None
            reason = scope.end_reason(state)
            if scope.count == 0:
                run.journal.log("warning", "The with block ran no fit with this callback, so nothing in it was "
                                           "under control: pass it to fit, as callbacks=[control].")
        else:
            state, text = RunState.FAILED, "".join(traceback.format_exception(kind, error, tb))
            reason = "interrupt" if issubclass(kind, KeyboardInterrupt) else None
        try:
            if state is RunState.FINISHED and callback.save_at_end and scope.count:
                fit.session.save_after_close()  # the last fit's session: the block's last position
        finally:
            try:
                run.store.release()
            finally:
                run.close(state, text, reason)
        say(f"Run {run.name!r} {state}.", verbose=callback.verbose)
        self._guards.close()
        if self._safeguards is not None:
            self._safeguards.deliver_sigterm()  # the block's run has ended: the process ends as SIGTERM asked
        return swallowed
