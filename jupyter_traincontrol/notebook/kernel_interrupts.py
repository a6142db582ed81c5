"""See kernel interrupts whether the kernel is idle or busy, without breaking either.

How ipykernel handles SIGINT (checked on 6.17.1, Colab's, and on 6.31, 7.3
and 7.4): at start it sets SIGINT to ``SIG_IGN``, so interrupting an idle
kernel does nothing at all; around each shell message its
``pre_handler_hook`` installs Python's ``default_int_handler`` (a busy cell
gets ``KeyboardInterrupt``) and its ``post_handler_hook`` puts the saved
handler back.

`KernelInterruptWatcher` adds, without taking anything away:

1. While the extension wants to hear idle interrupts, the ``SIG_IGN`` of an
   idle kernel is replaced by a Python handler that does nothing, so the OS
   delivers the signal (re-armed after every message by a wrapped
   ``post_handler_hook``, and put back to ``SIG_IGN`` when no longer wanted).
2. ``signal.set_wakeup_fd`` on one end of a socket pair: CPython writes the
   signal number there for every signal that has a Python handler, in both
   states. A daemon thread reads it and calls ``on_interrupt`` as ordinary
   thread code, never inside a signal handler. A busy cell still gets its
   ``KeyboardInterrupt`` as always.
3. The thread then wakes the kernel's event loop, so a top-level-await cell
   is cancelled at once. Bytes meant for an earlier owner of the wakeup fd are
   passed on to it; forked children drop the fd.

`install` and `uninstall` come in pairs and must run on the main thread.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import threading
from typing import Callable

__all__ = ["KernelInterruptWatcher"]

_MISSING = object()
_watchers: list["KernelInterruptWatcher"] = []


def _ignore_sigint(signum, frame) -> None:
    """The idle kernel's SIGINT handler: the watcher thread does the work."""


def _drop_wakeup_fd_in_child() -> None:
    if _watchers:
        try:
            signal.set_wakeup_fd(-1)
        except (ValueError, OSError):
            pass  # not the main thread of the child: nothing was inherited there


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_wakeup_fd_in_child)


class KernelInterruptWatcher:
    """Calls `on_interrupt(busy)` for each SIGINT the kernel process receives.

    Args:
        kernel: The ipykernel kernel (``get_ipython().kernel``).
        on_interrupt: Called on the watcher thread with True if a shell
            message (a cell) was being handled. Must not raise.
        wants_idle_interrupts: Called on the main thread after each message:
            True while idle interrupts should be delivered (a run is active).
            Otherwise the kernel's ``SIG_IGN`` is left, or put, back.
    """

    def __init__(
        self,
        kernel,
        on_interrupt: Callable[[bool], None],
        wants_idle_interrupts: Callable[[], bool],
    ):
        self.kernel = kernel
        self._on_interrupt = on_interrupt
        self._wants_idle = wants_idle_interrupts
        self.busy = False
        self._installed = False
        self._saved_hooks: dict[str, object] = {}
        self._previous_wakeup_fd = -1
        self._reader: socket.socket | None = None
        self._writer: socket.socket | None = None
        self._stop_r = self._stop_w = -1
        self._thread: threading.Thread | None = None

    @property
    def installed(self) -> bool:
        """True between `install` and `uninstall`."""
        return self._installed

    def install(self) -> None:
        """Hooks the kernel and takes the wakeup fd. Main thread only."""
        if self._installed:
            return
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("KernelInterruptWatcher.install must run on the main thread.")
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)
        self._stop_r, self._stop_w = os.pipe()
        self._previous_wakeup_fd = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        for name, wrapper in (("pre_handler_hook", self._pre_hook), ("post_handler_hook", self._post_hook)):
            self._saved_hooks[name] = self.kernel.__dict__.get(name, _MISSING)
            original = getattr(self.kernel, name)
            setattr(self.kernel, name, _chain(original, wrapper, before=name == "pre_handler_hook"))
        self._thread = threading.Thread(target=self._watch, name="traincontrol-interrupts", daemon=True)
        self._thread.start()
        _watchers.append(self)
        self._installed = True
        # Loaded inside a cell: the kernel is busy now (its post hook re-arms
        # when the cell ends). Loaded at kernel start: idle now.
        self.busy = signal.getsignal(signal.SIGINT) is signal.default_int_handler
        if not self.busy:
            self.arm()

    def uninstall(self) -> None:
        """Restores the kernel's hooks, SIGINT handling and wakeup fd. Main
        thread only. Idempotent."""
        if not self._installed:
            return
        self._installed = False
        _watchers.remove(self)
        for name, saved in self._saved_hooks.items():
            if saved is _MISSING:
                self.kernel.__dict__.pop(name, None)
            else:
                setattr(self.kernel, name, saved)
        if signal.getsignal(signal.SIGINT) is _ignore_sigint:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        if getattr(self.kernel, "saved_sigint_handler", None) is _ignore_sigint:
            self.kernel.saved_sigint_handler = signal.SIG_IGN  # unloaded inside a cell
        current = signal.set_wakeup_fd(-1)
        restore = self._previous_wakeup_fd if current == self._writer.fileno() else current
        signal.set_wakeup_fd(restore, warn_on_full_buffer=False)
        os.write(self._stop_w, b"x")
        self._thread.join()
        for fd in (self._stop_r, self._stop_w):
            os.close(fd)
        self._reader.close()
        self._writer.close()

    def arm(self) -> None:
        """Main thread, idle kernel: let SIGINT through while it is wanted."""
        current = signal.getsignal(signal.SIGINT)
        if self._wants_idle():
            if current is signal.SIG_IGN:
                signal.signal(signal.SIGINT, _ignore_sigint)
        elif current is _ignore_sigint:
            signal.signal(signal.SIGINT, signal.SIG_IGN)

    def _pre_hook(self) -> None:
        # ipykernel 7 also calls the hooks on subshell threads (a
        # comm message routed to a subshell), where its own post hook then
        # raises before ours runs: only the main thread's messages count.
        if threading.current_thread() is threading.main_thread():
            self.busy = True

    def _post_hook(self) -> None:
        self.busy = False
        if not self._installed:
            return
        fd = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        if fd not in (-1, self._writer.fileno()):
            self._previous_wakeup_fd = fd  # someone took it meanwhile: pass bytes on to them
        self.arm()

    def _watch(self) -> None:
        while True:
            ready, _, _ = select.select([self._reader, self._stop_r], [], [])
            if self._stop_r in ready:
                return
            try:
                data = self._reader.recv(4096)
            except BlockingIOError:
                continue
            if self._previous_wakeup_fd >= 0:
                try:
                    os.write(self._previous_wakeup_fd, data)
                except OSError:
                    self._previous_wakeup_fd = -1
            if int(signal.SIGINT) in data:
                self._on_interrupt(self.busy)
                self._wake_event_loop()

    def _wake_event_loop(self) -> None:
        io_loop = getattr(self.kernel, "io_loop", None)
        if io_loop is not None:
            try:
                io_loop.add_callback(lambda: None)
            except RuntimeError:
                pass  # the loop is closing: nothing left to wake


def _chain(original: Callable[[], None], extra: Callable[[], None], *, before: bool) -> Callable[[], None]:
    def hook():
        if before:
            extra()
            original()
        else:
            original()
            extra()

    hook.__wrapped__ = original  # for introspection
    return hook
