"""Run a notebook's cells in a real kernel, with real interrupts and restarts.

Like nbclient, but a cell's tags can ask for what a person would do next:

- ``interrupt-kernel``: once the run the cell started is training, interrupt
  the kernel (`KernelManager.interrupt_kernel()`, as the toolbar button does).
- ``restart-kernel``: once the run is training, restart the kernel.

With ``follow_tags=False`` the tags are ignored: the notebook runs top to
bottom as **Run All** runs it, with nobody pressing anything.

Used by ``make demo`` (examples/notebook_demo.py) and by the tests that
execute the notebooks.

Example:

    with NotebookRunner(cwd) as runner:
        for cell, outputs in runner.run("notebooks/quickstart.ipynb"):
            ...
"""

from __future__ import annotations

import json
import os
import queue
import time
from pathlib import Path
from typing import Iterator

__all__ = ["CellOutputs", "KernelSession", "NotebookRunner", "CellError"]


class CellError(RuntimeError):
    """A notebook cell failed."""


class CellOutputs:
    """The iopub messages and the reply of one executed cell."""

    def __init__(self, reply: dict | None, messages: list[dict]):
        self.reply = reply
        self.messages = messages

    @property
    def status(self) -> str | None:
        return self.reply["content"]["status"] if self.reply else None

    @property
    def ename(self) -> str | None:
        """The exception name of a failed cell (from the reply: UsageErrors
        have no error message on iopub)."""
        return self.reply["content"].get("ename") if self.reply else None

    @property
    def evalue(self) -> str | None:
        return self.reply["content"].get("evalue") if self.reply else None

    def _stream(self, name: str) -> str:
        return "".join(m["content"]["text"] for m in self.messages if m["msg_type"] == "stream" and m["content"]["name"] == name)

    @property
    def stdout(self) -> str:
        return self._stream("stdout")

    @property
    def stderr(self) -> str:
        return self._stream("stderr")

    @property
    def error(self) -> dict | None:
        return next((m["content"] for m in self.messages if m["msg_type"] == "error"), None)

    @property
    def results(self) -> list[dict]:
        return [m["content"]["data"] for m in self.messages if m["msg_type"] in ("execute_result", "display_data")]

    def text(self) -> str:
        """What a person would read: streams and the text of results."""
        parts = []
        for m in self.messages:
            if m["msg_type"] == "stream":
                parts.append(m["content"]["text"])
            elif m["msg_type"] in ("execute_result", "display_data"):
                parts.append(m["content"]["data"].get("text/plain", "") + "\n")
            elif m["msg_type"] == "error":
                parts.append(f"{m['content']['ename']}: {m['content']['evalue']}\n")
        return "".join(parts)


class KernelSession:
    """A kernel process and its client.

    Args:
        cwd: The kernel's working directory.
        env: Extra environment variables for the kernel.
        stderr: Where the kernel process's own stderr goes (a file); by
            default, this process's.
    """

    def __init__(self, cwd: Path, env: dict[str, str] | None = None, stderr=None):
        from jupyter_client.manager import start_new_kernel

        self.cwd = Path(cwd)
        self.km, self.kc = start_new_kernel(
            kernel_name="python3", cwd=str(cwd), env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}, startup_timeout=90,
            **({"stderr": stderr} if stderr is not None else {}),
        )
        self._early: list[dict] = []

    def execute(self, code: str, timeout: float = 120, wait: bool = True) -> CellOutputs | str:
        """Runs a cell; with ``wait=False`` returns its msg_id at once.

        A cell sent just after another one failed may come back ``aborted``
        unrun: the kernel drops what reaches it while it clears its queue
        after an error (ipykernel's ``stop_on_error``; Colab's 6.17 does it
        for a request that arrives in that moment). Such a cell is sent
        again, until `timeout`.
        """
        deadline = time.monotonic() + timeout
        while True:
            msg_id = self.kc.execute(code)
            if not wait:
                return msg_id
            result = self.collect(msg_id, max(1.0, deadline - time.monotonic()))
            if result.status != "aborted" or time.monotonic() >= deadline:
                return result
            time.sleep(0.05)

    def collect(self, msg_id: str, timeout: float = 120) -> CellOutputs:
        """Gathers a cell's iopub messages until it is idle, and its reply."""
        deadline = time.monotonic() + timeout
        messages, self._early = list(self._early), []
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"The cell did not finish within {timeout} s.")
            try:
                msg = self.kc.get_iopub_msg(timeout=remaining)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
            messages.append(msg)
        reply = None
        while time.monotonic() < deadline:
            try:
                candidate = self.kc.get_shell_msg(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if candidate["parent_header"].get("msg_id") == msg_id:
                reply = candidate
                break
        return CellOutputs(reply, messages)

    def value(self, expression: str, timeout: float = 30):
        """Evaluates `expression` in the kernel; returns it through JSON."""
        result = self.execute(f"import json as _json; print(_json.dumps({expression}))", timeout=timeout)
        if result.status != "ok":
            raise CellError(f"{expression!r} failed ({result.status}): {result.ename}: {result.evalue}")
        return json.loads(result.stdout.strip().splitlines()[-1])

    def wait_for(self, expression: str, timeout: float = 60, interval: float = 0.2):
        """Polls `expression` until truthy; returns its value."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.value(expression)
            if value:
                return value
            time.sleep(interval)
        raise TimeoutError(f"Timed out after {timeout} s waiting for {expression!r} in the kernel.")

    def interrupt(self) -> None:
        """Interrupts the kernel, as the toolbar button does."""
        self.km.interrupt_kernel()

    def restart(self) -> None:
        """Restarts the kernel, as Kernel > Restart does."""
        self.km.restart_kernel(now=False)
        self.kc.wait_for_ready(timeout=90)

    def alive(self) -> bool:
        return self.km.is_alive()

    def shutdown(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)


TRAINING = "__import__('jupyter_traincontrol').runs() and __import__('jupyter_traincontrol').runs()[-1].lifecycle.progress.step > 0"
ENDED = "__import__('jupyter_traincontrol').runs()[-1].state in ('stopped', 'aborted', 'finished', 'failed')"


class NotebookRunner:
    """Runs notebooks cell by cell in one kernel (see the module docstring).

    Args:
        cwd: The kernel's working directory.
        env: Extra environment variables for the kernel.
        stderr: Where the kernel process's own stderr goes (see `KernelSession`).
    """

    def __init__(self, cwd: Path, env: dict[str, str] | None = None, stderr=None):
        self.session = KernelSession(cwd, env, stderr)

    def __enter__(self) -> "NotebookRunner":
        return self

    def __exit__(self, *exc_info) -> None:
        if self.session.alive():
            self.session.shutdown()

    def run(self, path: str | Path, timeout: float = 180, follow_tags: bool = True,
            interrupt_in: str | None = None) -> Iterator[tuple[dict, CellOutputs]]:
        """Executes each code cell of the notebook at `path`, in order.

        Args:
            path: The notebook.
            timeout: Seconds a cell may take.
            follow_tags: Interrupt or restart the kernel where a cell's tags
                say so; False runs the cells top to bottom and nothing else.
            interrupt_in: A fragment of a cell's source: the kernel is
                interrupted a few seconds into that cell, as by a person who
                ran all the cells and then pressed Interrupt.

        Yields:
            Each code cell (its JSON) with its outputs, after any tagged
            interrupt or restart has happened.

        Raises:
            CellError: If a cell fails (unless tagged ``raises-exception``).
        """
        notebook = json.loads(Path(path).read_text(encoding="utf-8"))
        for cell in notebook["cells"]:
            if cell["cell_type"] != "code":
                continue
            source = "".join(cell["source"])
            if interrupt_in is not None and interrupt_in in source:
                msg_id = self.session.execute(source, wait=False)
                time.sleep(3.0)  # the cell is busy now, and the run trains
                self.session.interrupt()
                outputs = self.session.collect(msg_id, timeout)
            else:
                outputs = self.session.execute(source, timeout=timeout)
            tags = cell.get("metadata", {}).get("tags", [])
            if outputs.status != "ok" and "raises-exception" not in tags:
                raise CellError(f"Cell failed: {outputs.ename}: {outputs.evalue}\n--- cell ---\n{source}")
            if not follow_tags:
                tags = []
            if "interrupt-kernel" in tags:
                self.session.wait_for(TRAINING)
                time.sleep(1.0)  # let it train a little, as a person would watch
                self.session.interrupt()
                self.session.wait_for(ENDED)
            if "restart-kernel" in tags:
                self.session.wait_for(TRAINING)
                time.sleep(1.0)
                self.session.restart()
            yield cell, outputs
