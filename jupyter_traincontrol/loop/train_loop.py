"""`TrainLoop`: control of a custom training loop (GradientTape, a jitted JAX step, PyTorch).

::

    with TrainLoop(name="tape", checkpoint_dir="ckpt/tape", model=model, optimizer=opt) as loop:
        for epoch in loop.epochs(20):             # on resume: starts at the checkpoint's epoch
            for batch in loop.batches(dataset):   # commands act between two items
                loss = train_step(batch)
                loop.log(loss=float(loss))        # metrics for the panel, CLI, record and on_nan
    print(loop.state)                             # 'stopped', 'finished', 'aborted', 'failed'

The same run as a `fit`'s: listed in the registry, a FIFO, the CLI, the
REST API and the panels, the same commands acting at the same kind of
boundary (between two items, and at an epoch's start and end), the same
crash-safe checkpoints. What a checkpoint holds is one of ``model=`` (a
Keras model and ``optimizer=``: a ``.keras`` file), ``state=`` (objects with
``state_dict``/``load_state_dict``: a ``.pt`` file), or ``save=``/``load=``
(the user's functions, given the checkpoint's folder). ``resume=True``
loads the newest checkpoint and continues at the very next item: the
epoch's random state is put back as it began, its data's own order
(`data_sources`) as `batches` opens it, and `batches` draws, without
yielding, the items of the epoch already trained.

A stop ends both loops after the item in flight (and its checkpoint); the
``with`` block goes on. An exception in the body ends the run ``failed``
with its traceback; leaving the block closes everything.
"""

from __future__ import annotations

import threading
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, NamedTuple

from ..boundary.nan_policy import DEFAULT_MAX_ROLLBACKS, check_policy
from ..job import Job, current_job
from ..boundary.safeguards import DEFAULT_AUTOSAVE_SECONDS, check_autosave
from ..protocol import Command, RunState, final_state
from ..run import RunLifecycle, current_scope
from ..system.frames import find_caller
from ..system.sigterm import DEFAULT_SIGTERM_GRACE, check_sigterm_grace
from .adapter import LoopAdapter
from .states import build_state

__all__ = ["TrainLoop"]


class LoopThread(NamedTuple):
    """Where a loop runs, as a job watches it: its thread, and the frame that entered its ``with`` block."""

    thread_id: int
    frame: Any


class TrainLoop:
    """A custom training loop under control: a context manager.

    Args:
        name: The run's name, unique among live runs. Defaults to ``run-N``.
        checkpoint_dir: Folder of the checkpoints. Defaults to ``checkpoints/NAME``.
        keep: Checkpoints kept. Defaults to 3.
        resume: Continue from the newest checkpoint of this run's name (at
            its epoch, at the item after it). Defaults to False.
        model: A Keras 3 model; a checkpoint is a ``.keras`` file with its
            weights and the optimizer's state.
        optimizer: The Keras optimizer that updates `model`. Defaults to
            ``model.optimizer``; an uncompiled model is compiled with it
            (so its checkpoints hold the optimizer's state).
        state: Names to objects with ``state_dict()``/``load_state_dict()``
            (PyTorch modules, optimizers, schedulers, a ``GradScaler``).
        save: With `load`: writes the state into the folder it is given.
        load: Reads the state back from such a folder.
        tunables: Names to variables (Keras variables, or torch tensors in a
            PyTorch loop) that ``set NAME=VALUE`` may change.
        on_nan: What a non-finite ``loss`` given to `log` does: ``stop``,
            ``rollback`` or ``ignore`` (as `ControlCallback`'s). Defaults to ``stop``.
        handle_sigint: On the main thread, the first Ctrl+C stops with a
            checkpoint. Defaults to True.
        handle_sigterm: On the main thread, SIGTERM stops with a checkpoint
            after the item in flight; once the ``with`` block's run has
            ended, the process ends as SIGTERM asks (a SIGTERM handler of
            yours, installed before, is called then). A second SIGTERM, or
            `sigterm_grace` seconds, ends it at once. Defaults to True.
        sigterm_grace: Seconds a SIGTERM's stop may take. Defaults to 20.
        autosave: Every this many seconds of training since the run's
            newest checkpoint, a checkpoint (reason ``autosave``) at the next
            item's end, written in the background where saves are. The
            newest two autosaves are kept, apart from `keep`. 0 turns it
            off. Defaults to 600 (ten minutes).
        verbose: One line when the run starts, resumes, checkpoints, ends.
        nan_rollbacks: Rollbacks ``on_nan="rollback"`` makes. Defaults to 3.
        save_in_background: Write ``save`` checkpoints on a writer thread
            from a host copy, where the state can be copied (a model,
            ``state=``). Defaults to True.
        save_at_end: A loop that ran all its epochs writes a last checkpoint
            (reason ``end``). Defaults to True.
        sync: Called at each boundary where a command acts, before the state
            is read: for state kept outside `model`'s variables (write it
            back there). Defaults to none.
        reload: With `sync`: reads `model`'s variables back into the state
            the loop trains, called after the tool changed them (a resume,
            a rollback, a ``set``). Without it, a loop with `sync` refuses
            ``set`` and ``rollback`` (they could not reach that state).
            Defaults to none.
        job: In a job of several processes (a ``torch.distributed`` default
            process group, from ``torchrun``, ``srun`` or
            ``init_process_group``; or JAX's distributed runtime), made
            before the loop's ``with`` block: the loop is found to be one
            part of one run, whose every process applies each command at
            the same item (`job.Job`). None finds it; False runs this
            process alone; a `job.Job` is that one. Defaults to None.

    Raises:
        ValueError: For settings that do not fit together (two kinds of
            state, `save` without `load`, ...), saying what was given.
    """

    def __init__(self, name: str | None = None, checkpoint_dir=None, keep: int = 3, resume: bool = False, *,
                 model=None, optimizer=None, state: Mapping[str, Any] | None = None,
                 save: Callable[[Path], Any] | None = None, load: Callable[[Path], Any] | None = None,
                 tunables: Mapping[str, Any] | None = None, on_nan: str = "stop", handle_sigint: bool = True,
                 verbose: bool = True, nan_rollbacks: int = DEFAULT_MAX_ROLLBACKS, save_in_background: bool = True,
                 save_at_end: bool = True, sync: Callable[[], None] | None = None, handle_sigterm: bool = True,
                 sigterm_grace: float = DEFAULT_SIGTERM_GRACE, autosave: float | None = DEFAULT_AUTOSAVE_SECONDS,
                 reload: Callable[[], None] | None = None, job: "Job | bool | None" = None):
        self.on_nan = check_policy(on_nan, nan_rollbacks)
        self.autosave = check_autosave(autosave)
        self.handle_sigterm = handle_sigterm
        self.sigterm_grace = check_sigterm_grace(sigterm_grace)  # checked now, not on entry
        self.nan_rollbacks = nan_rollbacks
        self.resume = bool(resume)
        self.handle_sigint = handle_sigint
        self.verbose = verbose
        self.save_in_background = bool(save_in_background)
        self.save_at_end = bool(save_at_end)
        self.model = model
        self._parts = dict(model=model, optimizer=optimizer, state=state, save=save, load=load, tunables=tunables,
                           sync=sync, reload=reload)
        build_state(**self._parts, step=lambda: 0)  # checks the settings now, not on entry
        self._requested = (name, checkpoint_dir, keep)
        RunLifecycle(name, checkpoint_dir, keep)  # checks name and keep now
        self._job_option = job
        self._loop: LoopAdapter | None = None
        self._scope = None
        self._epochs_done = False

    # The run -------------------------------------------------------------------

    def __enter__(self) -> "TrainLoop":
        if self._loop is not None:
            raise RuntimeError("This TrainLoop was entered already; make a new one for another loop.")
        scope = self._scope = current_scope()
        job = None
        if scope is not None:  # the notebook cell's run: its settings apply
            run = scope.lifecycle
            self.resume = scope.take_resume()
            self.on_nan, self.save_in_background = scope.on_nan, scope.save_in_background
            self.save_at_end, self.handle_sigint, self.verbose = scope.save_at_end, False, False
            self.handle_sigterm, self.autosave = False, scope.autosave
            if scope.resume_from is not None:
                run.journal.log("warning", f"--resume-from {scope.resume_from} is for a fit: a TrainLoop resumes "
                                           "its own run's checkpoints (--resume).")
        else:
            option = self._job_option
            job = current_job() if option is None or option is True else (option or None)
            run = RunLifecycle(*self._requested, origin=None, registry=job.registry() if job is not None else None)
        loop = None
        trained, tunables = build_state(**self._parts, step=lambda: loop.step())
        where = LoopThread(threading.get_ident(), find_caller(lambda frame: True)) if job is not None else None
        loop = self._loop = LoopAdapter(run, scope, trained, tunables, self, job=job, where=where)
        loop.open()
        if scope is not None:
            scope.driver_began(self)
        return self

    def __exit__(self, kind, error, tb) -> bool:
        loop = self._require()
        if kind is not None:
            text = "".join(traceback.format_exception(kind, error, tb))
            loop.close(RunState.FAILED, text)
        else:
            ended_by = loop.session.ended_by
            try:
                if ended_by is None and self._epochs_done and self.save_at_end:
                    loop.write_end_checkpoint()
            except BaseException as interrupted:  # a Ctrl+C in the last save: the run ends all the same
                loop.close(RunState.FAILED, f"{type(interrupted).__name__} in the checkpoint at the loop's end.")
                raise
            loop.close(final_state(ended_by))
        if self._scope is not None:
            self._scope.driver_ended(self)
        return False

    def _require(self) -> LoopAdapter:
        if self._loop is None:
            raise RuntimeError("Use TrainLoop in a with block: `with TrainLoop(...) as loop:`.")
        return self._loop

    # The loops -------------------------------------------------------------------

    def epochs(self, count: int) -> Iterator[int]:
        """Yields the epochs to train, ``0`` to ``count - 1`` (from the
        resumed checkpoint's, after a resume); at each one's start and end,
        waiting commands act. Ends early after a ``stop`` or ``abort``."""
        loop = self._require()
        progress = loop.session.progress
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ValueError(f"epochs() takes a whole number of epochs, at least 0, got {count!r}.")
        progress.plan(count, progress.steps)
        for epoch in range(progress.epoch, count):
            if loop.ended:
                return
            loop.epoch_began(epoch, None)
            if loop.ended:
                return
            yield epoch
            loop.epoch_ended(epoch)
        if not loop.ended:
            self._epochs_done = True

    def batches(self, items: Iterable) -> Iterator[Any]:
        """Yields the items of one epoch; between two items (when the body
        has trained on one) waiting commands act. After a resume, the items
        the checkpoint already trained in its epoch are drawn without being
        yielded. Ends early after a ``stop`` or ``abort``."""
        loop = self._require()
        progress = loop.session.progress
        if not progress.epoch_begun:
            raise RuntimeError("batches() runs inside epochs(): `for epoch in loop.epochs(N): for b in loop.batches(data):`.")
        if loop.ended:
            return
        size = len(items) if hasattr(items, "__len__") else None
        if size is not None and progress.steps is None:
            progress.plan(progress.epochs, size)
        loop.data_began(items)
        iterator = iter(items)
        skip = loop.skip if progress.step == 0 else 0
        for index in range(skip):
            next(iterator, None)
            loop.item_skipped(done=index == skip - 1)
            if loop.ended:
                return
        for item in iterator:
            loop.item_begins()
            yield item
            loop.item_done()
            if loop.ended:
                return

    def log(self, **metrics: float) -> None:
        """The metrics of the item just trained (``loss`` among them for
        ``on_nan``): shown by the panels and the CLI, kept per epoch (their
        mean) in the record's history."""
        self._require().log(metrics)

    # Public view ---------------------------------------------------------------------

    @property
    def state(self) -> str:
        """``starting``, ``running``, ... then ``stopped``, ``aborted``, ``finished`` or ``failed``."""
        loop = self._loop
        return str(loop.session.run.state) if loop is not None else str(RunState.STARTING)

    @property
    def name(self) -> str | None:
        loop = self._loop
        return loop.session.run.name if loop is not None else self._requested[0]

    @property
    def epoch(self) -> int:
        """The epoch in progress (zero-based, as `epochs` yields it)."""
        return self._require().session.progress.epoch

    @property
    def step(self) -> int:
        """Items trained (or drawn) in the epoch in progress."""
        return self._require().session.progress.step

    @property
    def checkpoints(self) -> list[Path]:
        """The run's complete checkpoints, oldest first."""
        loop = self._loop
        return loop.session.run.checkpoint_paths() if loop is not None else []

    @property
    def fifo(self) -> str | None:
        """Where to write commands while the loop listens."""
        loop = self._loop
        return loop.session.run.address if loop is not None else None

    @property
    def ended_by(self) -> Command | None:
        """``stop`` or ``abort`` if that command ended the loop."""
        loop = self._loop
        return loop.session.ended_by if loop is not None else None

    def end_reason(self, state) -> str | None:
        """How the loop came to end in final `state` (`protocol.END_REASONS`)."""
        return self._require().session.end_reason_for(state)

    def note_interrupt(self) -> None:
        """The next stop is an interrupt's (its checkpoint's reason)."""
        if self._loop is not None:
            self._loop.session.note_interrupt()

    def send(self, command, sender: str | None = "loop"):
        """Sends the loop's run a command (``"stop"``, ``"set lr=1e-4"``) and
        returns the `protocol.Request` (its ``request_id`` is in the record's
        acks once it acted). From the loop's own body, it acts at the next
        boundary; from another thread, as any writer's."""
        loop = self._require()
        return loop.session.run.send(command, sender=sender, direct=loop.on_loop_thread())

    def __repr__(self) -> str:
        return f"<TrainLoop {self.name!r} {self.state}>"

