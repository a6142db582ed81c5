"""Headless quickstart: run notebooks/quickstart.ipynb in a real kernel, with a real interrupt.

Run with ``make demo``. Each code cell is executed as in JupyterLab; right
after the training cell starts, the kernel is interrupted exactly as the
toolbar's Interrupt button does (`KernelManager.interrupt_kernel()`). The
interrupt stops the run gracefully with a checkpoint, and the notebook then
resumes from it. Everything each cell prints is shown (what a person reads
of the checkpoint's sidecar: reason, epoch, batch, optimizer step, metrics);
the kernel process's own log lines go to a file, named at the end.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from notebook_runner import NotebookRunner  # noqa: E402

NOTEBOOK = HERE.parent / "notebooks" / "quickstart.ipynb"
# TensorFlow's C++ start-up chatter, which the kernel captures at the file-descriptor level.
NOISE = ("I0000 ", "W0000 ", "E0000 ", "WARNING: All log messages before absl")


def readable(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.startswith(NOISE)).strip()


def main() -> None:
    workdir = Path(tempfile.mkdtemp(prefix="traincontrol-notebook-demo-"))
    env = {
        "JUPYTER_RUNTIME_DIR": str(workdir / "runtime"),  # keep the demo's runs to itself
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    shutil.copy(NOTEBOOK, workdir)
    kernel_log = Path(tempfile.gettempdir()) / "traincontrol-notebook-demo-kernel.log"
    print(f"Running {NOTEBOOK.name} in a real kernel (working directory {workdir})\n", flush=True)
    try:
        with open(kernel_log, "w") as log, NotebookRunner(workdir, env, stderr=log) as runner:
            for cell, outputs in runner.run(workdir / NOTEBOOK.name):
                source = "".join(cell["source"])
                print(textwrap.indent(source.strip(), "In  | "), flush=True)
                if "interrupt-kernel" in cell["metadata"].get("tags", []):
                    print("    * the kernel is interrupted now, as the Interrupt button does", flush=True)
                text = readable(outputs.text())
                if text:
                    print(textwrap.indent(text, "Out | "), flush=True)
                print(flush=True)
        print("Demo complete: the interrupt stopped the run with a checkpoint, and --resume continued from it.")
        print(f"(The kernel process's own log: {kernel_log}.)")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
