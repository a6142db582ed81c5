"""The IPython extension: what ``%load_ext jupyter_traincontrol`` installs, and removes.

Loading registers ``%%interruptible_fit`` and, in a kernel, hooks kernel
interrupts (`KernelInterruptWatcher`) and kernel shutdown. Unloading stops
active runs gracefully and restores every hook it installed.

While a run of this kernel is active:

- interrupting the kernel (toolbar button, ``I, I``,
  ``KernelManager.interrupt_kernel()``) sends each active run its
  ``--on-interrupt`` command (default ``stop``); a second interrupt while
  they stop sends ``abort``. A busy cell still gets its ``KeyboardInterrupt``.
- shutting down or restarting the kernel stops active runs with a checkpoint
  first, waiting a few seconds at most.

With no active run, interrupts behave exactly as without the extension.
"""

from __future__ import annotations

import os
import threading
import time

from .run import TrainingRun, active_runs

__all__ = ["TrainControlExtension", "load", "unload", "SHUTDOWN_GRACE_SECONDS"]

#: How long kernel shutdown waits for active runs to stop with a checkpoint.
#: jupyter_client kills a kernel that has not exited 5 s after a shutdown request.
SHUTDOWN_GRACE_SECONDS = 3.5
#: How long `%unload_ext` waits for active runs to stop.
UNLOAD_GRACE_SECONDS = 30.0

_extensions: dict[int, "TrainControlExtension"] = {}


def _kernel_id() -> str | None:
    try:
        from ipykernel.connect import get_connection_file

        name = os.path.basename(get_connection_file())
    except Exception:  # not in a kernel, or no connection file
        return None
    return name[len("kernel-") : -len(".json")] if name.startswith("kernel-") and name.endswith(".json") else None


def stop_runs(runs: list[TrainingRun], timeout: float) -> list[TrainingRun]:
    """Sends ``stop`` to `runs` and waits until they end or `timeout` passes.

    Returns:
        The runs that had not ended in time.
    """
    for run in runs:
        try:
            run.stop()
        except OSError:
            pass  # it ended meanwhile
    deadline = time.monotonic() + timeout
    for run in runs:
        run.wait(max(0.0, deadline - time.monotonic()))
    return [run for run in runs if run.active]


class TrainControlExtension:
    """Everything the extension installs in one IPython shell.

    Args:
        shell: The `InteractiveShell`.
    """

    def __init__(self, shell):
        from .magic import TrainControlMagics

        self.shell = shell
        self.kernel = getattr(shell, "kernel", None)
        self.magics = TrainControlMagics(shell, self)
        self.watcher = None
        self._original_do_shutdown = None
        self._kernel_id = _kernel_id() if self.kernel is not None else None
        self._in_cell = False  # front: see kernel_busy

    @property
    def kernel_busy(self) -> bool:
        """True while the kernel's main thread runs a cell (an execute request).

        front: not the watcher's ``busy``, which is also True while the
        kernel handles comm messages (widget clicks) and other requests.
        """
        return self._in_cell

    # front: cell tracking for kernel_busy (IPython events, main thread only;
    # a cell of a subshell runs on its own thread and does not block clicks).
    def _cell_began(self, info=None) -> None:
        if threading.current_thread() is threading.main_thread():
            self._in_cell = True

    def _cell_ended(self, result=None) -> None:
        if threading.current_thread() is threading.main_thread():
            self._in_cell = False

    def load(self) -> None:
        """Registers the magic and hooks the kernel (if any)."""
        self.shell.register_magics(self.magics)
        if self.kernel is None:
            return
        self.shell.events.register("pre_run_cell", self._cell_began)  # front
        self.shell.events.register("post_run_cell", self._cell_ended)  # front
        from .kernel_signals import KernelInterruptWatcher

        self.watcher = KernelInterruptWatcher(self.kernel, self._on_interrupt, lambda: bool(active_runs()))
        self.watcher.install()
        self._original_do_shutdown = self.kernel.__dict__.get("do_shutdown")
        original = self.kernel.do_shutdown

        def do_shutdown(restart):
            stop_runs(active_runs(), SHUTDOWN_GRACE_SECONDS)
            return original(restart)

        self.kernel.do_shutdown = do_shutdown

    def unload(self) -> None:
        """Stops active runs, then removes everything `load` installed."""
        left = stop_runs(active_runs(), UNLOAD_GRACE_SECONDS)
        for run in left:
            run.abort()
        stop_runs(left, 5.0)
        magics = self.shell.magics_manager.magics
        if magics["cell"].get("interruptible_fit") is not None:
            del magics["cell"]["interruptible_fit"]
        self.shell.magics_manager.registry.pop(type(self.magics).__name__, None)
        if self.magics in self.shell.configurables:
            self.shell.configurables.remove(self.magics)
        if self.watcher is not None:
            self.watcher.uninstall()
            self.watcher = None
        if self.kernel is not None:
            for name, callback in (("pre_run_cell", self._cell_began), ("post_run_cell", self._cell_ended)):  # front
                if callback in self.shell.events.callbacks[name]:
                    self.shell.events.unregister(name, callback)
            if self._original_do_shutdown is None:
                self.kernel.__dict__.pop("do_shutdown", None)
            else:
                self.kernel.do_shutdown = self._original_do_shutdown

    def start_run(self, code: str, *, refresh_rate: float, **options) -> TrainingRun:
        """Starts a `TrainingRun` of `code` with its panel (or text reporter)."""
        from .panel import ControlPanel, TextReporter

        extra = {"kernel_id": self._kernel_id} if self._kernel_id else None
        run = TrainingRun(code, self.shell.user_ns, extra_record=extra, filename="<interruptible_fit cell>", **options)
        run.start()
        if self.kernel is not None:
            run.panel = ControlPanel(run, refresh_rate, kernel_busy=lambda: self.kernel_busy)
        else:
            run.panel = TextReporter(run)
        run.panel.start()
        return run

    def wait_in_cell(self, run: TrainingRun) -> None:
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


def load(shell) -> TrainControlExtension:
    """Loads the extension into `shell` (idempotent)."""
    extension = _extensions.get(id(shell))
    if extension is None:
        extension = _extensions[id(shell)] = TrainControlExtension(shell)
        extension.load()
    return extension


def unload(shell) -> None:
    """Unloads the extension from `shell` (idempotent)."""
    extension = _extensions.pop(id(shell), None)
    if extension is not None:
        extension.unload()
