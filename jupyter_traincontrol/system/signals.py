"""Signal handlers installed for a while, in front of the ones they replace.

Signal handlers can only be changed on the main thread, but a run may end
on any thread. `ChainedHandler` is the one implementation of that pairing:

- `install` (main thread) puts the handler in front of the current one and
  remembers it; `uninstall` (main thread) puts it back, unless someone
  replaced ours meanwhile (theirs is left in place).
- `retire` works from any thread: on the main thread it is `uninstall`;
  elsewhere the handler turns inert at once, and the next signal (handed on
  to the previous handler, as without us) or the next handler installed for
  the same signal puts the previous one back. A handler that
  `restores_on_main` also asks the main thread to put it back now
  (``_thread.interrupt_main``: no signal is sent to the process, no system
  call is interrupted; run there, our handler only restores the previous
  one).
- `pass_on` hands a signal to the handler we replaced (or does what the
  default disposition would).

Subclasses say what the signal means while installed (`handle`): a first
Ctrl+C that stops a run (`sigint`), a SIGTERM that stops a job
(`job.signals`), a SIGTERM held while a kernel shuts down
(`notebook.kernel_shutdown`).
"""

from __future__ import annotations

import _thread
import os
import signal
import threading

__all__ = ["ChainedHandler", "on_main_thread", "write_stderr"]

_retired: dict[int, set["ChainedHandler"]] = {}


def write_stderr(text: str) -> None:
    """Writes `text` to file descriptor 2 directly: safe in a signal handler
    (``sys.stderr`` is not reentrant); a closed stderr is ignored."""
    try:
        os.write(2, text.encode("utf-8", "replace"))
    except OSError:
        pass


def on_main_thread() -> bool:
    """True on the interpreter's main thread (where handlers can change)."""
    return threading.current_thread() is threading.main_thread()


class ChainedHandler:
    """A handler of `signum` for a while, chained to the one it replaced.

    Attributes:
        signum: The signal (set by subclasses).
        takes_ignored: Install even where the signal is ignored (``SIG_IGN``)
            or handled from C (``getsignal`` returns None). Defaults to False:
            then `install` leaves such a signal alone.
        governs_exit: This handler decides how the process ends on its
            signal (a kernel's shutdown, a job's agreed stop): a training's
            own handler for that signal then stays out (`governed`).
        restores_on_main: `retire` off the main thread asks the main thread
            to put the previous handler back at once. Defaults to False.
    """

    signum: int = signal.SIGINT
    takes_ignored = False
    governs_exit = False
    restores_on_main = False

    def __init__(self):
        self._previous = None
        self._installed = False
        self._retired = False
        self._restore_asked = False

    @property
    def installed(self) -> bool:
        """True while our handler is (or was last set as) the signal's handler."""
        return self._installed

    @property
    def previous(self):
        """The handler we replaced."""
        return self._previous

    @classmethod
    def governed(cls) -> bool:
        """True if the signal's current handler is one that `governs_exit`."""
        owner = getattr(signal.getsignal(cls.signum), "__self__", None)
        return isinstance(owner, ChainedHandler) and owner.governs_exit

    def install(self) -> bool:
        """Installs the handler if this is the main thread (and the signal
        is not ignored, unless `takes_ignored`).

        Returns:
            True if installed.
        """
        if self._installed or not on_main_thread():
            return False
        for retired in list(_retired.get(self.signum, ())):
            retired.uninstall()
        previous = signal.getsignal(self.signum)
        if previous in (signal.SIG_IGN, None) and not self.takes_ignored:
            return False
        self._previous, self._retired = previous, False
        self._installing()
        signal.signal(self.signum, self._handle)
        self._installed = True
        return True

    def uninstall(self) -> None:
        """Restores the previous handler. Idempotent; main thread only.

        If someone replaced our handler meanwhile, theirs is left in place.
        """
        if not self._installed or not on_main_thread():
            return
        self._installed = False
        _retired.get(self.signum, set()).discard(self)
        if signal.getsignal(self.signum) == self._handle:
            previous = self._previous
            signal.signal(self.signum, previous if previous is not None else signal.SIG_DFL)

    def retire(self) -> None:
        """Ends the handler's work, from any thread (see the module's docstring)."""
        if not self._installed:
            return
        self._retired = True
        if on_main_thread():
            self.uninstall()
            return
        _retired.setdefault(self.signum, set()).add(self)
        self._retired_off_main_thread()

    def pass_on(self, signum, frame) -> None:
        """Uninstalls, then hands the signal to the previous handler (or
        does what its default disposition does)."""
        previous = self._previous
        self.uninstall()
        if callable(previous):
            previous(signum, frame)
        else:
            self.default_action(signum, frame)

    def default_action(self, signum, frame) -> None:
        """What the default disposition does: by default, the signal is
        raised again with it (the process ends)."""
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    # Subclass interface ------------------------------------------------------

    def handle(self, signum, frame) -> None:
        """The signal, while installed and not retired."""
        raise NotImplementedError

    def _installing(self) -> None:
        """Called by `install` just before the handler goes in (reset counters here)."""

    def _retired_off_main_thread(self) -> None:
        """Called by `retire` off the main thread, once the handler is inert:
        asks the main thread to restore the previous handler, if
        `restores_on_main` and ours is still the installed one."""
        if self.restores_on_main and signal.getsignal(self.signum) == self._handle:
            self._restore_asked = True
            _thread.interrupt_main(self.signum)

    def _after_retirement(self, signum, frame) -> None:
        """A signal after `retire`: our own request (`_retired_off_main_thread`)
        only restores; any other is handed on as if we were never here."""
        if self._restore_asked:
            self._restore_asked = False
            self.uninstall()
        else:
            self.pass_on(signum, frame)

    def _handle(self, signum, frame) -> None:
        if self._retired:
            self._after_retirement(signum, frame)
        else:
            self.handle(signum, frame)
