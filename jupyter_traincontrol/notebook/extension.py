"""The IPython extension: ``%%interruptible_fit`` and the kernel hooks, loaded and unloaded as one unit.

::

    %load_ext jupyter_traincontrol

    %%interruptible_fit --name mnist
    history = model.fit(x, y, epochs=50, validation_split=0.1)

The cell's code runs on a background thread in the user namespace; every
``fit`` it calls gets the control callback. The cell returns at once with the
run, whose display is its control panel (Save, Stop, Abort, Pause/Resume,
progress, metrics, a loss chart and a log). Names the cell assigns are in the
namespace once the run ends, however it ends.

As IPython's ``storemagic`` does, one `Magics` class is the whole unit: it
holds the magic, its configurable defaults (traitlets, settable with
``%config`` or in ``ipython_config.py``), and everything loading installs::

    %config TrainControlMagics.keep = 5

While a run of this kernel is active:

- interrupting the kernel (toolbar button, ``I, I``,
  ``KernelManager.interrupt_kernel()``) sends each active run its
  ``--on-interrupt`` command (default ``stop``); a second interrupt while
  they stop sends ``abort``. A busy cell still gets its ``KeyboardInterrupt``.
- shutting down or restarting the kernel stops active runs with a checkpoint
  first, waiting a few seconds at most; jupyter_client's SIGTERM is held
  meanwhile (`kernel_shutdown.SigtermHold`), so the checkpoint has until its
  SIGKILL.

With no active run, interrupts behave exactly as without the extension.
Unloading stops active runs gracefully and restores every hook. Loading
imports neither Keras nor TensorFlow, nor does a run unless its cell trains
with Keras (a cell that trains a PyTorch or JAX `TrainLoop` loads neither).
Loaded before TensorFlow is imported, it keeps TensorFlow's native log lines
(C++ INFO and WARNING on file descriptor 2) out of the notebook by setting
``TF_CPP_MIN_LOG_LEVEL=2``, unless the user set it
(``%config TrainControlMagics.hide_tensorflow_logs = False`` before the
first run, or in ``ipython_config.py``, turns that off).
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from traitlets import Bool, Enum, Float, Int, Unicode, observe

from ..boundary.safeguards import DEFAULT_AUTOSAVE_SECONDS
from ..registry import NameTakenError, unique_name, validate_name
from .kernel_shutdown import ShutdownHook, stop_runs
from .run import TrainingRun, active_runs

__all__ = ["TrainControlMagics", "load", "unload", "stop_runs", "SHUTDOWN_GRACE_SECONDS"]

#: How long kernel shutdown waits for active runs to stop with a checkpoint.
#: jupyter_client sends SIGTERM 2.5 s after a shutdown request (held while
#: runs stop) and SIGKILL at 5 s (its default ``shutdown_wait_time``).
SHUTDOWN_GRACE_SECONDS = 4.5
#: How long `%unload_ext` waits for active runs to stop.
UNLOAD_GRACE_SECONDS = 30.0
#: TensorFlow's C++ log level: 2 keeps INFO and WARNING lines back, ERROR and FATAL still show.
TF_LOG_LEVEL = ("TF_CPP_MIN_LOG_LEVEL", "2")

_loaded: dict[int, "TrainControlMagics"] = {}


def _kernel_id() -> str | None:
    try:
        from ipykernel.connect import get_connection_file

        name = os.path.basename(get_connection_file())
    except Exception:  # not in a kernel, or no connection file
        return None
    return name[len("kernel-") : -len(".json")] if name.startswith("kernel-") and name.endswith(".json") else None


@magics_class
class TrainControlMagics(Magics):
    """``%%interruptible_fit``, its configurable defaults, and the kernel hooks."""

    checkpoint_dir = Unicode(
        "checkpoints/{name}",
        help="Where a run's checkpoints go unless --checkpoint-dir is given; "
        "{name} is replaced by the run's name. Relative to the kernel's working directory.",
    ).tag(config=True)
    keep = Int(3, help="How many of the newest checkpoints a run keeps.").tag(config=True)
    on_interrupt = Enum(
        ["stop", "save", "abort"],
        default_value="stop",
        help="What interrupting the kernel does to its active runs.",
    ).tag(config=True)
    on_nan = Enum(
        ["stop", "rollback", "ignore"],
        default_value="stop",
        help="What a batch whose loss is not finite does: stop (no checkpoint of it), "
        "rollback (newest checkpoint, half the learning rate, at most 3 times) or ignore.",
    ).tag(config=True)
    sync_saves = Bool(
        False,
        help="Write every checkpoint on the training thread, without a host copy of the model's and optimizer's "
        "variables (for when memory is short); by default a save holds training only while that copy is made.",
    ).tag(config=True)
    shutdown_grace = Float(
        SHUTDOWN_GRACE_SECONDS,
        help="Seconds a kernel shutdown or restart waits for active runs to stop with a checkpoint (SIGTERM is "
        "held meanwhile). jupyter_client kills the kernel at its KernelManager.shutdown_wait_time (5 s by "
        "default): for large models raise both, this one about half a second below it.",
    ).tag(config=True)
    autosave = Float(
        DEFAULT_AUTOSAVE_SECONDS,
        min=0.0,
        help="Seconds of training (not paused) after a run's newest checkpoint at which it writes one in the "
        "background (reason autosave; the newest two are kept apart from --keep), so a kernel that dies loses "
        "at most this much training. 0 turns it off; --autosave SECONDS sets it for one cell.",
    ).tag(config=True)
    save_at_end = Bool(
        True,
        help="A fit that runs to its end writes a last checkpoint (reason end), unless --no-save-at-end is given.",
    ).tag(config=True)
    hide_tensorflow_logs = Bool(
        True,
        help="Loaded before TensorFlow is imported, set TF_CPP_MIN_LOG_LEVEL=2 (unless it is set), so TensorFlow's "
        "native INFO and WARNING lines stay out of the notebook. Off: the variable is left as it is.",
    ).tag(config=True)
    refresh_rate = Float(5.0, help="Panel redraws a second, at most.").tag(config=True)
    _set_tf_log_level = False  # True while TF_CPP_MIN_LOG_LEVEL is ours (a class default: config may observe first)
    name_prefix = Unicode("fit", help="Default run names are PREFIX-1, PREFIX-2, ...").tag(config=True)

    def __init__(self, shell):
        super().__init__(shell=shell)
        self.kernel = getattr(shell, "kernel", None)
        self.watcher = None
        self.shutdown_hook: ShutdownHook | None = None
        self._kernel_id = _kernel_id() if self.kernel is not None else None
        self._in_cell = False

    @observe("hide_tensorflow_logs")
    def _tf_log_level(self, change=None) -> None:
        """Sets (or takes back) TF_CPP_MIN_LOG_LEVEL while TensorFlow is not imported yet."""
        name, value = TF_LOG_LEVEL
        if "tensorflow" in sys.modules:
            return  # too late either way: TensorFlow has read it
        if self.hide_tensorflow_logs and name not in os.environ:
            os.environ[name], self._set_tf_log_level = value, True
        elif not self.hide_tensorflow_logs and self._set_tf_log_level:
            os.environ.pop(name, None)
            self._set_tf_log_level = False

    # Loading and unloading ------------------------------------------------

    def install(self) -> None:
        """Registers the magic and hooks the kernel (if any)."""
        self.shell.register_magics(self)
        self._tf_log_level()
        if self.kernel is None:
            return
        self.shell.events.register("pre_run_cell", self._cell_began)
        self.shell.events.register("post_run_cell", self._cell_ended)
        from .kernel_interrupts import KernelInterruptWatcher

        self.watcher = KernelInterruptWatcher(self.kernel, self._on_interrupt, lambda: bool(active_runs()))
        self.watcher.install()
        self.shutdown_hook = ShutdownHook(self.kernel, lambda: self.shutdown_grace)
        self.shutdown_hook.install()

    def uninstall(self) -> None:
        """Stops active runs, then removes everything `install` installed."""
        left = stop_runs(active_runs(), UNLOAD_GRACE_SECONDS, sender="unload")
        for run in left:
            run.send("abort", sender="unload")
        stop_runs(left, 5.0, sender="unload")
        if self._set_tf_log_level and "tensorflow" not in sys.modules:
            os.environ.pop(TF_LOG_LEVEL[0], None)
        magics = self.shell.magics_manager.magics
        if magics["cell"].get("interruptible_fit") is not None:
            del magics["cell"]["interruptible_fit"]
        self.shell.magics_manager.registry.pop(type(self).__name__, None)
        if self in self.shell.configurables:
            self.shell.configurables.remove(self)
        if self.watcher is not None:
            self.watcher.uninstall()
            self.watcher = None
        if self.shutdown_hook is not None:
            self.shutdown_hook.uninstall()
            self.shutdown_hook = None
        if self.kernel is not None:
            for name, callback in (("pre_run_cell", self._cell_began), ("post_run_cell", self._cell_ended)):
                if callback in self.shell.events.callbacks[name]:
                    self.shell.events.unregister(name, callback)

    @property
    def kernel_busy(self) -> bool:
        """True while the kernel's main thread runs a cell (an execute request).

        Not the interrupt watcher's ``busy``, which is also True while the
        kernel handles comm messages (widget clicks) and other requests.
        """
        return self._in_cell

    # IPython events, main thread only: a cell of a subshell runs on its own
    # thread and does not hold clicks back.
    def _cell_began(self, info=None) -> None:
        if threading.current_thread() is threading.main_thread():
            self._in_cell = True

    def _cell_ended(self, result=None) -> None:
        if threading.current_thread() is threading.main_thread():
            self._in_cell = False

    # The magic --------------------------------------------------------------

    @magic_arguments()
    @argument("--name", help="the run's name, unique among live runs (default: fit-N)")
    @argument("--checkpoint-dir", help="folder of the run's checkpoints (default: checkpoints/NAME)")
    @argument("--keep", type=int, help="how many of the newest checkpoints to keep (default: 3)")
    @argument("--resume", action="store_true", help="continue from the latest checkpoint in the checkpoint dir")
    @argument(
        "--resume-from", metavar="NAME_OR_PATH",
        help="continue from another run's newest checkpoint (a run name) or from a checkpoint file; "
        "new checkpoints keep this run's name",
    )
    @argument("--no-save-at-end", action="store_true", help="no last checkpoint when fit runs to its end")
    @argument("--wait", action="store_true", help="keep the cell busy until the run ends")
    @argument(
        "--on-interrupt", choices=["stop", "save", "abort"],
        help="what a kernel interrupt does to this run (default: stop)",
    )
    @argument(
        "--on-nan", choices=["stop", "rollback", "ignore"],
        help="what a non-finite loss does: stop (default), rollback (newest checkpoint, half the learning rate) or ignore",
    )
    @argument(
        "--sync-saves", action="store_true",
        help="save on the training thread, without a host copy of the variables; for when memory is short",
    )
    @argument(
        "--autosave", type=float, metavar="SECONDS",
        help="write a checkpoint after every SECONDS of training since the newest one (default: 600; 0: off)",
    )
    @argument(
        "--tunables", metavar="NAME",
        help="a dict in the namespace, names to Keras variables the model reads, that `set NAME=VALUE` may change",
    )
    @cell_magic
    def interruptible_fit(self, line: str, cell: str):
        """Run the cell's ``fit`` in the background, controllable by buttons,
        kernel interrupts, the terminal and JupyterLab.

        The cell returns at once with the run (its panel). Interrupting the
        kernel stops active runs with a checkpoint; a second interrupt while
        they stop aborts them. From a terminal:
        ``jupyter-traincontrol send NAME stop`` (or save, abort, pause,
        resume, ``set lr=1e-4``, ``rollback``).
        """
        try:
            args = parse_argstring(self.interruptible_fit, line)
        except ValueError as error:  # shell quoting: "No closing quotation", ...
            raise UsageError(f"%%interruptible_fit: cannot read the options {line[:80]!r}: {error}.") from None
        if not cell.strip():
            raise UsageError("%%interruptible_fit: the cell is empty. Put the code that calls fit below the magic line.")
        keep = self.keep if args.keep is None else args.keep
        if keep < 1:
            raise UsageError(f"%%interruptible_fit: --keep must be at least 1, got {keep}.")
        try:
            name = validate_name(args.name) if args.name else unique_name(self.name_prefix)
        except ValueError as error:
            raise UsageError(f"%%interruptible_fit: {error}") from None
        checkpoint_dir = str(Path(args.checkpoint_dir or self.checkpoint_dir.format(name=name)).expanduser())
        tunables = self._tunables(args.tunables)
        if args.resume_from is not None:
            self._check_resume_from(args.resume_from, checkpoint_dir)
        autosave = self.autosave if args.autosave is None else args.autosave
        if not autosave >= 0:
            raise UsageError(f"%%interruptible_fit: --autosave takes seconds, 0 to turn it off; got {autosave}.")
        try:
            run = self._start_run(
                self.shell.transform_cell(cell),
                name=name,
                checkpoint_dir=checkpoint_dir,
                keep=keep,
                resume=args.resume,
                resume_from=args.resume_from,
                save_at_end=self.save_at_end and not args.no_save_at_end,
                on_interrupt=args.on_interrupt or self.on_interrupt,
                tunables=tunables,
                on_nan=args.on_nan or self.on_nan,
                save_in_background=not (args.sync_saves or self.sync_saves),
                autosave=autosave,
            )
        except NameTakenError as error:
            raise UsageError(f"%%interruptible_fit: {error}") from None
        except SyntaxError as error:
            raise UsageError(f"%%interruptible_fit: the cell is not valid Python: {error}") from None
        except ValueError as error:  # tunables that are not Keras variables
            raise UsageError(f"%%interruptible_fit: {error}") from None
        if args.wait:
            from IPython.display import display

            display(run)
            self._wait_in_cell(run)
            return None
        return run

    def _tunables(self, name: str | None) -> dict | None:
        """The dict ``--tunables NAME`` names in the user namespace."""
        if name is None:
            return None
        value = self.shell.user_ns.get(name)
        if not isinstance(value, dict):
            found = "nothing" if name not in self.shell.user_ns else f"a {type(value).__name__}"
            raise UsageError(
                f"%%interruptible_fit: --tunables {name[:80]}: found {found}; expected a dict of names to "
                "Keras variables, like tunables = {'dropout': keras.Variable(0.2)}."
            )
        return value

    @staticmethod
    def _check_resume_from(resume_from: str, checkpoint_dir: str) -> None:
        """``--resume-from``: a run name or checkpoint file that can be found now."""
        from ..fit.resume.sources import ResumeSourceError, find_source

        try:
            find_source(resume_from, Path(checkpoint_dir))
        except (ResumeSourceError, ValueError) as error:
            raise UsageError(f"%%interruptible_fit: {error}") from None

    def _start_run(self, code: str, **options) -> TrainingRun:
        """Starts a `TrainingRun` of `code` with its panel (or text reporter)."""
        from .panel import ControlPanel
        from .text_reporter import TextReporter

        extra = {"kernel_id": self._kernel_id} if self._kernel_id else None
        run = TrainingRun(code, self.shell.user_ns, extra_record=extra, filename="<interruptible_fit cell>", **options)
        run.start()
        if self.kernel is not None:
            run.panel = ControlPanel(run, self.refresh_rate, kernel_busy=lambda: self.kernel_busy)
        else:
            run.panel = TextReporter(run)
        run.panel.start()
        return run

    def _wait_in_cell(self, run: TrainingRun) -> None:
        """Blocks the cell until `run` ends. An interrupt does not end the
        cell: the watcher has already sent the run its command, and the cell
        waits for the graceful end, without a traceback."""
        while True:
            try:
                run.wait()
                run.panel.join(5)
                return
            except KeyboardInterrupt:
                if self.watcher is None:  # no kernel: act here
                    run.handle_interrupt()

    def _on_interrupt(self, busy: bool) -> None:
        for run in active_runs():
            run.handle_interrupt()


def load(shell) -> TrainControlMagics:
    """Loads the extension into `shell` (idempotent)."""
    magics = _loaded.get(id(shell))
    if magics is None:
        magics = _loaded[id(shell)] = TrainControlMagics(shell)
        magics.install()
    return magics


def unload(shell) -> None:
    """Unloads the extension from `shell` (idempotent)."""
    magics = _loaded.pop(id(shell), None)
    if magics is not None:
        magics.uninstall()
