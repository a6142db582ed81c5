"""Where a call is on a thread's stack: the one place that walks frames.

A `fit` that raises skips every callback on its way out, so the tool
remembers the frame of the ``fit`` call (`find_caller`) and later asks
whether it is still on its thread's stack (`on_stack`); the data order of
a `fit` is read from the locals of that frame; a job looks for a thread
waiting in JAX's shutdown (`any_thread_in`); a SIGTERM that stopped a
`fit` is handed on once that `fit` has returned (`call_after_return`).
"""

from __future__ import annotations

import os
import sys
import threading
from types import FrameType
from typing import Callable

__all__ = ["find_caller", "fit_frame", "on_stack", "any_thread_in", "call_after_return"]


def find_caller(matches: Callable[[FrameType], bool], depth: int = 1) -> FrameType | None:
    """The nearest frame of the calling thread that `matches`, looking from
    the caller of this function's caller up (`depth` 1; each more skips one
    more frame); None if none does."""
    frame = sys._getframe(depth + 1)
    while frame is not None:
        if matches(frame):
            return frame
        frame = frame.f_back
    return None


def fit_frame(model) -> FrameType | None:
    """The frame of the `fit` call, on this thread's stack, that trains `model`."""
    return find_caller(lambda frame: frame.f_code.co_name == "fit" and frame.f_locals.get("self") is model, depth=1)


def on_stack(thread_id: int, wanted: FrameType | None) -> bool:
    """True while `wanted` is on the stack of the thread `thread_id`."""
    if wanted is None:
        return False
    # This thread's own stack needs no snapshot of every thread's.
    frame = sys._getframe() if thread_id == threading.get_ident() else sys._current_frames().get(thread_id)
    while frame is not None:
        if frame is wanted:
            return True
        frame = frame.f_back
    return False


def any_thread_in(function: str, file_suffix: str) -> bool:
    """True if some thread is inside `function` of a file whose path ends
    with `file_suffix` (``/``-separated)."""
    for frame in sys._current_frames().values():
        while frame is not None:
            code = frame.f_code
            if code.co_name == function and code.co_filename.replace(os.sep, "/").endswith(file_suffix):
                return True
            frame = frame.f_back
    return False


def call_after_return(frame: FrameType | None, action: Callable[[object], None]) -> bool:
    """Calls `action(value)` once `frame` (of this thread) returns `value`
    (None if it raises), just before its caller goes on, with a profile
    function (`sys.setprofile`) set only until then.

    Returns:
        False, calling nothing, if `frame` is not on this thread's stack or
        a profiler is set already (ours would replace it): the caller acts
        at once instead.
    """
    if frame is None or sys.getprofile() is not None or not on_stack(threading.get_ident(), frame):
        return False

    def profile(current: FrameType, event: str, value) -> None:
        if event == "return" and current is frame:
            sys.setprofile(None)
            action(value)

    sys.setprofile(profile)
    return True
